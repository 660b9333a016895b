"""Fixtures for the real-kernel tests, which `python -m tests.lab.boot` (make test-lab) runs
inside a VM booted with Debian's kernel.

Outside the lab they are skipped, never failed: they need IPVSCTL_LAB=1 (boot.py sets it in
the guest), root, and /proc/net/ip_vs after modprobe. To run them on a machine with IPVS,
accepting the side effects (kernel modules loaded, namespaces created and deleted):
`sudo IPVSCTL_LAB=1 .venv/bin/python -m pytest -m lab tests/lab`.

Fixtures for reuse (engine and daemon lab tests):
- `node`: a fresh network namespace standing for a node, with sysctls set by
  configure_host() and `node.kernel`, a NetlinkKernel bound to it (labkit.Node);
- `make_node(configure=True)`: more nodes, or one without the host set-up;
- `make_pod(ip, ip6=None, tcp=(8080,), udp=(), sctp=())`: a pod on `node` whose servers
  answer with the pod's name;
- `client`: a pod without servers at 10.0.0.100 / fd01::100 that opens, holds and closes
  connections (`connect`, `request`, `udp`);
- `wait_for(predicate, timeout=60)`: poll kernel state; the guest is slow, never assert time.
- `make_daemon(node, source, **kw)`: an in-process ipvsctl daemon (labkit.start_daemon) on
  `node`, its HTTP server in the node's netns, shut down after the test (the IPVS table is
  left as it is, as on SIGTERM).
Namespaces: a pyroute2 object talks to the namespace its socket was opened in. To open one
inside a named netns pass `netns=NAME, flags=0` (pyroute2 forks a child that enters
/run/netns/NAME, opens the socket and passes it back; flags=0 stops it from creating a
missing netns): `NetlinkKernel(netns=NAME)` does this for IPVS, IPRoute and conntrack.
Plain sockets and /proc/sys are entered with `ipvsctl.kernel.netns.run_in_netns(NAME, fn)`
(setns in a short-lived thread). More in labkit's docstring.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from devkit import labkit
from devkit.labkit import Node, Pod
from ipvsctl.kernel.netlink import configure_host

MODULES = (
    "ip_vs",
    "ip_vs_rr",
    "ip_vs_wrr",
    "ip_vs_lc",
    "ip_vs_wlc",
    "ip_vs_sh",
    "dummy",
    "veth",
    "nf_conntrack",
    "nf_conntrack_netlink",
    "nf_tables",
    "sctp",
)


def _process_age() -> float:
    """Seconds since this Python process started (the guest's import cost shows here)."""
    with open("/proc/uptime") as f:
        uptime = float(f.read().split()[0])
    with open("/proc/self/stat") as f:
        start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    return uptime - start_ticks / os.sysconf("SC_CLK_TCK")


_IMPORTED_AFTER = _process_age()  # python start + pytest + ipvsctl + pyroute2 imports
_SESSION_START = time.monotonic()
_unavailable: list[str | None] = []


def _lab_unavailable() -> str | None:
    if os.environ.get("IPVSCTL_LAB") != "1":
        return "real-kernel test: runs in the lab VM (make test-lab), or set IPVSCTL_LAB=1"
    if os.geteuid() != 0:
        return "real-kernel test: needs root"
    for module in MODULES:  # sctp and schedulers are optional; IPVS itself is checked below
        subprocess.run(["modprobe", module], capture_output=True, check=False)
    if not os.path.exists("/proc/net/ip_vs"):
        return "real-kernel test: no IPVS in this kernel (modprobe ip_vs failed)"
    return None


@pytest.fixture(scope="session", autouse=True)
def fake_api_request_log(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Every fake API server of the run logs each request here (devkit.fakeapi); at the
    end, the whole run's log must show requests and no Pod among them (the daemon
    reads no Pod). A failure here is an error at the session's teardown."""
    from devkit.fakeapi.state import REQUEST_LOG_ENV

    path = tmp_path_factory.mktemp("fakeapi") / "requests.jsonl"
    path.touch()
    old = os.environ.get(REQUEST_LOG_ENV)
    os.environ[REQUEST_LOG_ENV] = str(path)
    yield path
    if old is None:
        os.environ.pop(REQUEST_LOG_ENV, None)
    else:
        os.environ[REQUEST_LOG_ENV] = old
    requests = [json.loads(line) for line in path.read_text().splitlines() if line]
    pods = [r for r in requests if r.get("resource") == "pods" or "/pods" in r["path"]]
    if requests:  # a run of only tests without an API server has nothing to show
        assert not pods, f"the daemon asked for pods: {pods[:5]}"
        assert any(r["resource"] == "endpointslices" for r in requests)


@pytest.fixture(scope="session", autouse=True)
def lab() -> None:
    if not _unavailable:
        _unavailable.append(_lab_unavailable())
    if _unavailable[0]:
        pytest.skip(_unavailable[0])


@pytest.fixture
def make_node() -> Iterator[Callable[..., Node]]:
    nodes: list[Node] = []

    def make(configure: bool = True, interface: str = "kube-ipvs0") -> Node:
        node = Node(interface)
        nodes.append(node)
        if configure:
            configure_host(kernel=node.kernel)
        return node

    yield make
    for node in nodes:
        node.close()


@pytest.fixture
def node(make_node: Callable[..., Node]) -> Node:
    return make_node()


@pytest.fixture
def make_pod(node: Node) -> Callable[..., Pod]:
    return node.make_pod


@pytest.fixture
def client(node: Node) -> Pod:
    return node.make_client()


@pytest.fixture
def wait_for() -> Callable[..., object]:
    return labkit.wait_for


@pytest.fixture
def make_daemon(make_node: Callable[..., Node], tmp_path: Path) -> Iterator[Callable[..., Any]]:
    daemons: list[Any] = []

    def make(node: Node, source: Any, **kw: Any) -> Any:
        state_dir = str(tmp_path / f"state-{len(daemons)}")
        daemon = labkit.start_daemon(node, source, kw.pop("state_dir", state_dir), **kw)
        daemons.append(daemon)
        return daemon

    yield make  # torn down before make_node's nodes (this fixture depends on it)
    for daemon in daemons:
        daemon.shutdown()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _unavailable and _unavailable[0] is None:
        timings = {
            "python_start_to_conftest_imported_s": round(_IMPORTED_AFTER, 1),
            "conftest_imported_to_end_s": round(time.monotonic() - _SESSION_START, 1),
        }
        terminalreporter.write_line(f"lab timings (guest): {json.dumps(timings)}")
        out = os.environ.get("IPVSCTL_LAB_OUT")
        if out:
            with open(os.path.join(out, "timings-guest.json"), "w") as f:
                json.dump(timings, f)

"""The daemon from the image's root filesystem on the real kernel.

`ipvsctl run` here is the image's own: out/image/rootfs (make image) is entered with chroot
inside a node's netns and a mount namespace of its own (/proc, /sys, /dev, /run and /tmp
mounted into it), so the daemon runs on the image's python3, its pyroute2 and kubernetes
wheels, and the image's `nft`, against the fake API server (listening in the node's netns).
The image's `conntrack` and `ipvsadm` read the same kernel state. A package, library or
command missing from the image fails this test, not a cluster.

`make test-lab` (and so `make test`) builds the image first (cached, daemonset/image/build.sh),
so there the root filesystem always exists; `python -m tests.lab.boot -k image` without a
`make image` skips with that reason. The guest sees the host's files read-only: the root
filesystem is used as built, as the pod's read-only root.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from devkit.builders import endpoint, endpoint_slice, service
from devkit.fakeapi.server import FakeAPIServer
from devkit.labkit import Node, Pod, http_get, parse_ipvsadm, sh, wait_for
from ipvsctl.kernel.netns import run_in_netns
from ipvsctl.model import Protocol, ServiceKey
from tests.lab.test_daemon_lab import held_connection, metric_sum, weights

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
ROOTFS = Path(os.environ.get("IPVSCTL_IMAGE_ROOTFS", REPO / "out" / "image" / "rootfs")).resolve()
IPVSCTL = ROOTFS / "usr" / "local" / "bin" / "ipvsctl"
VIP = "10.96.0.10"
KEY = ServiceKey(Protocol.TCP, VIP, 80)
PORT = 19797
# The image's environment (its OCI config), nothing of the host's or the venv's.
IMAGE_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONUNBUFFERED": "1",
    "LANG": "C.UTF-8",
}


@pytest.fixture
def rootfs() -> Path:
    if not IPVSCTL.exists():
        pytest.skip(
            f"no image root filesystem at {ROOTFS}: run `make image` (make test-lab builds it)"
        )
    return ROOTFS


@pytest.fixture
def api_in_node(node: Node) -> Iterator[FakeAPIServer]:
    """The fake API server with its listening socket in the node's netns: the chrooted daemon
    reaches it at 127.0.0.1 there."""
    api = FakeAPIServer()
    run_in_netns(node.name, api.start)
    yield api
    api.stop()


def in_image(node: Node, *argv: str, check: bool = True) -> str:
    """A command of the image (no Python start), chrooted, in the node's netns."""
    return sh("chroot", str(ROOTFS), *argv, netns=node.name, check=check)


class ImageDaemon:
    """`ipvsctl run` of the image, chrooted, in the node's netns; its log in a file. Every
    step execs the next (ip netns exec, unshare, sh, chroot): the pid is the daemon's."""

    def __init__(self, node: Node, tmp: Path, args: list[str]) -> None:
        r = shlex.quote(str(ROOTFS))
        script = "\n".join(
            [
                "set -e",
                f"mount -t proc proc {r}/proc",
                f"mount --rbind /sys {r}/sys",
                f"mount --rbind /dev {r}/dev",
                f"mount -t tmpfs tmpfs {r}/run",
                f"mount --bind {shlex.quote(str(tmp))} {r}/tmp",
                f"exec chroot {r} /usr/local/bin/ipvsctl run {shlex.join(args)}",
            ]
        )
        self.log = tmp / "ipvsctl-run.log"
        self.out = open(self.log, "w")  # noqa: SIM115 - closed in stop()/kill()
        self.proc = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                node.name,
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                script,
            ],
            stdout=self.out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=IMAGE_ENV,
        )

    def tail(self) -> str:
        return "\n".join(self.log.read_text().splitlines()[-40:])

    def stop(self, timeout: float = 120) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        finally:
            self.out.close()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.out.close()


def test_the_image_runs_the_daemon_on_the_real_kernel_and_drains(
    rootfs: Path, node: Node, client: Pod, api_in_node: FakeAPIServer, tmp_path: Path
) -> None:
    api = api_in_node
    pods = [node.make_pod("10.244.1.1", name="web-1"), node.make_pod("10.244.1.2", name="web-2")]
    api.add(service("web"))
    api.add(endpoint_slice("web", [endpoint(p.ip, pod=p.name) for p in pods]))
    url = f"http://127.0.0.1:{PORT}"
    tmp_path.chmod(0o1777)  # the image's /tmp
    daemon = ImageDaemon(
        node,
        tmp_path,
        [
            "--apiserver",
            api.url,
            "--node-name",
            "node-a",
            "--node-ip",
            "192.0.2.10",
            "--state-dir",
            "/tmp/state",
            "--listen",
            f"127.0.0.1:{PORT}",
            "--healthz-bind-address",
            "",
            "--drain-check-interval",
            "0.2",
            "--drain-timeout",
            "600",
            "--log-level",
            "debug",
        ],
    )
    try:

        def ready() -> bool:
            if daemon.proc.poll() is not None:
                raise AssertionError(
                    f"the image's ipvsctl run exited {daemon.proc.returncode}:\n{daemon.tail()}"
                )
            try:
                return http_get(url + "/readyz", node.name, timeout=10)[0] == 200
            except OSError:
                return False  # not listening yet

        wait_for(ready, timeout=300, interval=0.5, what="/readyz 200 from the image's daemon")

        # it is the image's interpreter, in the image's root
        pid = daemon.proc.pid
        assert os.readlink(f"/proc/{pid}/root") == str(ROOTFS)
        exe = os.readlink(f"/proc/{pid}/exe")
        assert exe.startswith(f"{ROOTFS}/usr/bin/python3"), exe

        # IPVS (the host's ipvsadm and the image's), nftables (the image's nft wrote it)
        assert weights(node) == {str(KEY): {f"{p.ip}:8080": 1 for p in pods}}
        image_view = parse_ipvsadm(in_image(node, "ipvsadm", "-Ln"))
        assert {
            vs: {rs: r.weight for rs, r in s.real_servers.items()} for vs, s in image_view.items()
        } == weights(node)
        table = node.run("nft", "-j", "list", "table", "inet", "ipvsctl")
        assert any("chain" in item for item in json.loads(table)["nftables"])
        assert {client.request(VIP, 80, reset=True) for _ in range(4)} == {p.name for p in pods}

        held, gone, other = held_connection(node, client, pods)
        # the image's conntrack reads the connection through the VIP
        entries = in_image(node, "conntrack", "-L", "-p", "tcp", "--orig-dst", VIP)
        assert [
            line
            for line in entries.splitlines()
            if "ESTABLISHED" in line and f"src={gone.ip} " in line
        ], entries

        # the drain: weight 0 while the connection lives, deleted once it is gone
        api.update(endpoint_slice("web", [endpoint(other.ip, pod=other.name)]))
        wait_for(
            lambda: weights(node)[str(KEY)][f"{gone.ip}:8080"] == 0, timeout=120, what="weight 0"
        )
        assert held.echo("still served while draining")
        assert client.request(VIP, 80, reset=True) == other.name
        held.abort()
        wait_for(
            lambda: f"{gone.ip}:8080" not in weights(node)[str(KEY)],
            timeout=120,
            what="deleted once its connection is gone",
        )
        metrics = http_get(url + "/metrics", node.name)[1]
        assert metric_sum(metrics, "ipvsctl_real_server_deletions_total", reason="drained") == 1
        assert metric_sum(metrics, "ipvsctl_nft_errors_total") == 0
        assert metric_sum(metrics, "ipvsctl_netlink_errors_total") == 0

        assert daemon.stop() == 0, daemon.tail()
        assert weights(node) == {str(KEY): {f"{other.ip}:8080": 1}}
        log = daemon.log.read_text()
        assert "Traceback" not in log, daemon.tail()
    finally:
        daemon.kill()

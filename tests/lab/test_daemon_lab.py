"""The daemon end to end on a real kernel.

(a) In-process: `Daemon` (ipvsctl.daemon.wiring) with a `KubeSource` against the in-process
    FakeAPIServer (real wire protocol, the real `kubernetes` client), programming the node's
    netns; its HTTP server listens in that netns. The same scenarios as
    tests/unit/test_daemon_api.py, with real connections and the kernel as the witness.
(b) The real `ipvsctl run` command as a subprocess inside the node's netns
    (`ip netns exec`), with a manifests folder: readiness, traffic, SIGTERM in the middle of
    a drain, a restart that restores the drain with its deadline, and `ipvsctl status`.
    Python starts cost tens of seconds in the emulated guest: few of them.
"""

from __future__ import annotations

import datetime
import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devkit.builders import endpoint, endpoint_slice, pod, service, terminating
from devkit.fakeapi.server import FakeAPIServer
from devkit.labkit import Node, Pod, daemon_get, http_get, wait_for
from ipvsctl.kernel.netns import run_in_netns
from ipvsctl.kernel.procfs.ipvs import read_connection_list
from ipvsctl.kube.client import KubeSource
from ipvsctl.kube.settings import KubeSettings
from ipvsctl.model import Protocol, RealServerKey, ServiceKey
from ipvsctl.obs.metrics import Metrics
from ipvsctl.reconcile.paced import run_once

pytestmark = pytest.mark.lab

VIP = "10.96.0.10"
KEY = ServiceKey(Protocol.TCP, VIP, 80)
BIN = Path(sys.executable).parent


def weights(node: Node) -> dict[str, dict[str, int]]:
    """`ipvsadm -Ln` without the counts: virtual server -> real server -> weight."""
    return {
        vs: {name: r.weight for name, r in s.real_servers.items()}
        for vs, s in node.ipvsadm().items()
    }


def metric_sum(text: str, name: str, **labels: str) -> float:
    """The sum of a metric's samples in Prometheus text whose labels include `labels`."""
    total = 0.0
    for line in text.splitlines():
        m = re.match(rf"^{re.escape(name)}(?:\{{(.*)\}})? (\S+)$", line)
        if not m:
            continue
        have = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1) or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            total += float(m.group(2))
    return total


def eps(*pods: Pod) -> list[dict[str, Any]]:
    return [endpoint(p.ip, pod=p.name, uid=f"uid-{p.name}") for p in pods]


def held_connection(node: Node, client: Pod, pods: list[Pod]) -> tuple[Any, Pod, Pod]:
    """A connection held through the VIP, the pod that took it and the other one."""
    held = client.connect(VIP, 80)
    gone = next(p for p in pods if p.name == held.pod)
    wait_for(
        lambda: node.ipvsadm()[str(KEY)].real_servers[f"{gone.ip}:8080"].active >= 1,
        what="ActiveConn",
    )
    return held, gone, next(p for p in pods if p is not gone)


# --- (a) in-process, against the fake API server --------------------------------------------
@pytest.fixture
def api() -> Iterator[FakeAPIServer]:
    with FakeAPIServer() as server:
        yield server


@pytest.fixture
def drain_timeout() -> float:
    return 600.0


@pytest.fixture
def kube_daemon(
    api: FakeAPIServer, node: Node, make_daemon: Callable[..., Any], drain_timeout: float
) -> Iterator[tuple[Any, list[Pod]]]:
    pods = [node.make_pod("10.244.1.1", name="web-1"), node.make_pod("10.244.1.2", name="web-2")]
    api.add(service("web"))
    api.add(endpoint_slice("web", eps(*pods)))
    metrics = Metrics()
    source = KubeSource.from_config(
        apiserver=api.url,
        settings=KubeSettings(backoff_initial=0.05, backoff_max=0.5, healthy_watch_seconds=0.05),
        on_watch_restart=lambda r, why: metrics.watch_restarts.labels(r, why).inc(),
        on_invalid_object=lambda kind: metrics.invalid_objects.labels(kind).inc(),
        on_health=lambda why: metrics.degraded.set("source", why),  # as daemon.wiring
    )
    d = make_daemon(node, source, metrics=metrics, events=True, drain_timeout=drain_timeout)
    wait_for(lambda: d.engine.started, timeout=180, what="the daemon's first sync")
    assert weights(node) == {str(KEY): {f"{p.ip}:8080": 1 for p in pods}}
    yield d, pods


def test_terminating_endpoint_drains_with_a_live_connection_until_it_closes(
    node: Node, client: Pod, api: FakeAPIServer, kube_daemon: tuple[Any, list[Pod]]
) -> None:
    d, pods = kube_daemon
    held, gone, other = held_connection(node, client, pods)
    # Its Pod is there to be read, overdue: nothing reads it (the whole lab's request log
    # is checked for pods at the end, conftest.py).
    stamp = datetime.datetime.fromtimestamp(time.time() - 300, datetime.UTC).strftime(
        "%Y-%m-%dT%H:%M:%SZ"
    )
    api.add(pod(gone.name, deletion_timestamp=stamp))
    api.update(
        endpoint_slice(
            "web", [terminating(gone.ip, pod=gone.name), endpoint(other.ip, pod=other.name)]
        )
    )

    wait_for(lambda: weights(node)[str(KEY)][f"{gone.ip}:8080"] == 0, what="weight 0")
    e = wait_for(lambda: drain_of(node, d, gone.ip), what="the drain in /status")
    assert (e["address"], e["reason"], e["deadline_source"], e["pod"]) == (
        gone.ip,
        "terminating",
        "pod",
        f"default/{gone.name}",
    )
    assert e["deadline"] is None and e["time_left"] is None  # until its pod goes
    assert [client.request(VIP, 80) for _ in range(4)] == [other.name] * 4
    assert held.echo("still served while terminating")
    # `ipvsctl status --connections` reads the real kernel's table: the held one, listed
    listing = read_connection_list([(KEY, RealServerKey(gone.ip, 8080))], 20, netns=node.name)
    (conn,) = listing.shown[(KEY, RealServerKey(gone.ip, 8080))]
    assert conn.state == "ESTABLISHED" and conn.client.startswith(f"{client.ip}:")
    assert conn.expires > 0

    held.abort()
    wait_for(
        lambda: f"{gone.ip}:8080" not in weights(node)[str(KEY)],
        timeout=90,
        what="deleted once its connection is gone",
    )
    metrics = daemon_get(node, d, "/metrics")[1]
    assert metric_sum(metrics, "ipvsctl_real_server_deletions_total", reason="drained") == 1
    assert metric_sum(metrics, "ipvsctl_real_server_deletions_total", reason="deadline") == 0
    assert weights(node) == {str(KEY): {f"{other.ip}:8080": 1}}
    # drained, nothing cut: no Event (CONTRACT.md "Events")
    assert d.event_writer.flush(30)
    assert api.objects("Event") == [] and api.count("create", "Event") == 0


@pytest.mark.parametrize("drain_timeout", [3.0])
def test_deadline_cutting_a_live_connection_records_an_event_on_its_pod(
    node: Node, client: Pod, api: FakeAPIServer, kube_daemon: tuple[Any, list[Pod]]
) -> None:
    """CONTRACT.md "Events": a real connection held past the drain deadline is cut, counted,
    and a ConnectionsCut Event lands on its pod (by targetRef name and uid) in the API
    server; no pod is read for it."""
    d, pods = kube_daemon
    held, gone, other = held_connection(node, client, pods)
    api.update(endpoint_slice("web", eps(other)))  # removed: the --drain-timeout bound
    wait_for(
        lambda: f"{gone.ip}:8080" not in weights(node)[str(KEY)],
        timeout=120,
        what="deleted at the deadline with its connection open",
    )
    metrics = daemon_get(node, d, "/metrics")[1]
    assert metric_sum(metrics, "ipvsctl_real_server_deletions_total", reason="deadline") == 1
    assert metric_sum(metrics, "ipvsctl_drain_connections_cut_total", protocol="TCP") == 1
    (ev,) = wait_for(lambda: api.objects("Event"), timeout=60, what="the Event")
    assert ev["reason"] == "ConnectionsCut" and ev["type"] == "Warning"
    assert ev["regarding"]["name"] == gone.name
    assert ev["regarding"]["uid"] == f"uid-{gone.name}"
    assert ev["note"].startswith("1 established connection cut through node node-a after ")
    assert ev["reportingInstance"] == "ipvsctl-node-a"
    held.sock.settimeout(15)
    assert not held.echo("cut")  # the kernel tells the client at its next packet
    held.close()


def drain_of(node: Node, d: Any, ip: str) -> dict[str, Any] | None:
    code, body = daemon_get(node, d, "/status")
    queue = json.loads(body)["drain_queue"] if code == 200 else []
    return next((e for e in queue if e["address"] == ip), None)


def test_statefulset_pod_of_a_reused_name_keeps_its_live_connections(
    node: Node, client: Pod, api: FakeAPIServer, kube_daemon: tuple[Any, list[Pod]]
) -> None:
    """On the real kernel with real traffic: `web-0` deleted and created again
    (a new uid, a new address) and terminated again within the hour took its former
    incarnation's deadline and was cut at the first drain check."""
    d, pods = kube_daemon
    first, other = pods
    overdue = datetime.datetime.fromtimestamp(time.time() - 300, datetime.UTC).strftime(
        "%Y-%m-%dT%H:%M:%SZ"
    )
    # web-0, first incarnation, at `first`: terminating (overdue), then gone.
    api.add(pod("web-0", deletion_timestamp=overdue, uid="uid-1"))
    api.update(
        endpoint_slice(
            "web",
            [terminating(first.ip, pod="web-0", uid="uid-1"), endpoint(other.ip, pod=other.name)],
        )
    )
    # weight 0, or already deleted: overdue with no connection, the next drain check may
    # delete it before a poll under load sees the weight (a flake at load average 4-6)
    wait_for(
        lambda: weights(node)[str(KEY)].get(f"{first.ip}:8080", 0) == 0,
        what="weight 0 or deleted",
    )
    api.update(endpoint_slice("web", [endpoint(other.ip, pod=other.name)]))
    wait_for(
        lambda: f"{first.ip}:8080" not in weights(node)[str(KEY)],
        timeout=60,
        what="the first web-0 gone",
    )
    # web-0 again: a new pod (uid-2) at a new address, alone in the Service, then
    # terminating with a client's connection held through the VIP.
    again = node.make_pod("10.244.1.3", name="web-0")
    api.upsert(pod("web-0", uid="uid-2"))
    api.update(endpoint_slice("web", [endpoint(again.ip, pod="web-0", uid="uid-2")]))
    wait_for(lambda: weights(node)[str(KEY)] == {f"{again.ip}:8080": 1}, what="only the new web-0")
    held = client.connect(VIP, 80)
    assert held.pod == "web-0"
    api.upsert(pod("web-0", deletion_timestamp=overdue, uid="uid-2"))
    api.update(
        endpoint_slice(
            "web",
            [terminating(again.ip, pod="web-0", uid="uid-2"), endpoint(other.ip, pod=other.name)],
        )
    )
    e = wait_for(lambda: drain_of(node, d, again.ip), what="the new web-0 draining")
    assert e["deadline_source"] == "pod" and e["time_left"] is None
    for _ in range(3):  # drain checks on the real kernel's counts, in this thread
        with d.loop.lock:
            run_once(d.engine.drain_check)
    assert weights(node)[str(KEY)][f"{again.ip}:8080"] == 0  # still there, draining
    assert held.echo("still served by the second web-0")
    metrics = daemon_get(node, d, "/metrics")[1]
    assert metric_sum(metrics, "ipvsctl_real_server_deletions_total", reason="deadline") == 0
    held.abort()
    wait_for(
        lambda: f"{again.ip}:8080" not in weights(node)[str(KEY)],
        timeout=90,
        what="deleted as drained once its connection is gone",
    )


def test_a_deleted_services_connection_survives_without_nftables(
    node: Node, client: Pod, api: FakeAPIServer, kube_daemon: tuple[Any, list[Pod]]
) -> None:
    """A deleted Service's virtual server drains, on the real kernel, IPVS alone (no
    nftables table: test_netfilter_lab.py has the whole path): a connection held through a
    deleted Service's ClusterIP goes on, a new one is refused at once, and the virtual
    server goes with its last real server."""
    d, pods = kube_daemon
    held, gone, _ = held_connection(node, client, pods)
    api.delete("Service", "default", "web")
    api.delete("EndpointSlice", "default", "web-abc")
    # the idle real server may already be gone as drained; the one held stays at weight 0
    wait_for(lambda: weights(node).get(str(KEY), {}).get(f"{gone.ip}:8080") == 0, what="weight 0")
    assert held.echo("after the deletion"), node.run("ipvsadm", "-Lnc")
    t0 = time.monotonic()
    with pytest.raises(ConnectionRefusedError):
        client.connect(VIP, 80)
    assert time.monotonic() - t0 < 5
    assert VIP in node.interface_addresses()
    assert held.echo("still served")
    held.abort()
    wait_for(lambda: str(KEY) not in weights(node), timeout=90, what="drained and deleted")
    assert VIP not in node.interface_addresses()
    metrics = daemon_get(node, d, "/metrics")[1]
    assert metric_sum(metrics, "ipvsctl_real_server_deletions_total", reason="drained") == 2
    assert metric_sum(metrics, "ipvsctl_real_server_deletions_total", reason="deadline") == 0


def test_relist_after_410_causes_no_kernel_churn(
    node: Node, client: Pod, api: FakeAPIServer, kube_daemon: tuple[Any, list[Pod]]
) -> None:
    d, pods = kube_daemon
    held, gone, other = held_connection(node, client, pods)
    api.update(endpoint_slice("web", eps(other)))  # one drain in progress, to be left alone
    wait_for(lambda: weights(node)[str(KEY)][f"{gone.ip}:8080"] == 0, what="weight 0")
    table = weights(node)
    ops = metric_sum(daemon_get(node, d, "/metrics")[1], "ipvsctl_kernel_ops_total")
    lists = {k: api.count("list", k) for k in ("Service", "EndpointSlice")}
    # A 410 sent before a watch opens reaches nobody.
    assert api.wait_for(
        lambda: bool(api.open_watches("Service") and api.open_watches("EndpointSlice")), 60
    )
    api.expire_watches()
    wait_for(
        lambda: all(api.count("list", k) > n for k, n in lists.items()),
        what="a relist of both kinds",
    )
    marker = node.make_pod("10.244.1.3", name="web-3")  # a change after the relist
    api.update(endpoint_slice("web", eps(other, marker)))
    wait_for(lambda: f"{marker.ip}:8080" in weights(node)[str(KEY)], what="the marker change")

    metrics = daemon_get(node, d, "/metrics")[1]
    assert metric_sum(metrics, "ipvsctl_kernel_ops_total") == ops + 1  # the marker's only
    assert metric_sum(metrics, "ipvsctl_watch_restarts_total", reason="expired") >= 1
    table[str(KEY)][f"{marker.ip}:8080"] = 1
    assert weights(node) == table
    assert held.echo("the relist left the draining one alone")
    held.close()


def test_api_outage_leaves_the_table_and_traffic_and_catches_up(
    node: Node, client: Pod, api: FakeAPIServer, kube_daemon: tuple[Any, list[Pod]]
) -> None:
    d, pods = kube_daemon
    table = weights(node)
    ops = metric_sum(daemon_get(node, d, "/metrics")[1], "ipvsctl_kernel_ops_total")

    api.down()
    api.reset_watches()

    def failed_reconnects() -> float:
        return metric_sum(
            daemon_get(node, d, "/metrics")[1], "ipvsctl_watch_restarts_total", reason="error"
        )

    wait_for(lambda: failed_reconnects() >= 4, what="reconnects failing through the outage")

    def source_degraded() -> float:
        metrics = daemon_get(node, d, "/metrics")[1]
        return metric_sum(metrics, "ipvsctl_degraded", condition="source")

    wait_for(lambda: source_degraded() == 1, what="the source said degraded")
    assert weights(node) == table
    assert {client.request(VIP, 80) for _ in range(4)} == {p.name for p in pods}
    assert daemon_get(node, d, "/healthz")[0] == 200
    status, body = daemon_get(node, d, "/readyz")
    assert status == 200 and "degraded: source: " in body  # ready, serving what it has
    assert metric_sum(daemon_get(node, d, "/metrics")[1], "ipvsctl_kernel_ops_total") == ops

    kept, removed = pods
    api.update(endpoint_slice("web", eps(kept)))  # changed while the daemon cannot see it
    api.up()
    wait_for(
        lambda: weights(node)[str(KEY)].get(f"{removed.ip}:8080", 0) == 0,
        timeout=90,
        what="the change caught up after the outage",
    )
    assert weights(node)[str(KEY)][f"{kept.ip}:8080"] == 1
    assert daemon_get(node, d, "/healthz")[0] == 200
    wait_for(lambda: source_degraded() == 0, what="the source working again")
    assert daemon_get(node, d, "/readyz") == (200, "ready\n")


def test_an_object_the_api_server_sends_unreadable_is_skipped_not_the_list(
    node: Node, client: Pod, api: FakeAPIServer, kube_daemon: tuple[Any, list[Pod]]
) -> None:
    """A malformed Service among the others (a broken server) is counted and skipped, on a
    relist and as a watch event; the rest is programmed and the watch goes on."""
    d, pods = kube_daemon
    api.put_raw("Service", "default", "bad", b'{"kind":"Service","metadata":"x"}')
    api.expire_watches()  # a relist that carries it
    marker = node.make_pod("10.244.1.3", name="web-3")
    api.update(endpoint_slice("web", eps(*pods, marker)))
    wait_for(lambda: f"{marker.ip}:8080" in weights(node)[str(KEY)], what="a change after it")
    api.put_raw("Service", "default", "bad", b"7")  # and as a watch event
    api.update(endpoint_slice("web", eps(*pods)))
    wait_for(
        lambda: weights(node)[str(KEY)].get(f"{marker.ip}:8080", 0) == 0, what="the next change"
    )
    metrics = daemon_get(node, d, "/metrics")[1]
    assert metric_sum(metrics, "ipvsctl_invalid_objects_total", kind="Service") >= 2
    assert metric_sum(metrics, "ipvsctl_degraded", condition="source") == 0
    assert daemon_get(node, d, "/readyz") == (200, "ready\n")
    assert {client.request(VIP, 80) for _ in range(4)} == {p.name for p in pods}


# --- (b) `ipvsctl run` as a command, in the node's netns --------------------------------------
class RunCommand:
    """`ipvsctl run` in the node's netns, its log in a file."""

    def __init__(self, node: Node, args: list[str], log: Path) -> None:
        self.log = log
        self.out = open(log, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", node.name, str(BIN / "ipvsctl"), "run", *args],
            stdout=self.out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 120) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        finally:
            self.out.close()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.out.close()

    def tail(self) -> str:
        return "\n".join(self.log.read_text().splitlines()[-30:])


def _status(node: Node, url: str, path: str) -> tuple[int, str] | None:
    try:
        return http_get(url + path, node.name, timeout=10)
    except OSError:
        return None  # not listening yet


def write_manifests(folder: Path, *objs: dict[str, Any]) -> None:
    tmp = folder / ".web.yaml.tmp"
    tmp.write_text(yaml.safe_dump_all(objs))
    tmp.rename(folder / "web.yaml")  # atomic: the poller never reads half a file


def test_ipvsctl_run_sigterm_mid_drain_leaves_the_table_and_a_restart_resumes_the_drain(
    node: Node, client: Pod, tmp_path: Path
) -> None:
    pods = [node.make_pod("10.244.1.1", name="web-1"), node.make_pod("10.244.1.2", name="web-2")]
    folder = tmp_path / "manifests"
    folder.mkdir()
    write_manifests(folder, service("web"), endpoint_slice("web", eps(*pods)))
    port = 19796
    url = f"http://127.0.0.1:{port}"
    args = [
        "--manifests",
        str(folder),
        "--state-dir",
        str(tmp_path / "state"),
        "--listen",
        f"127.0.0.1:{port}",
        "--drain-check-interval",
        "0.2",
        "--drain-timeout",
        "600",
        "--node-name",
        "node-a",
        "--node-ip",
        "192.0.2.10",
    ]
    runs: list[RunCommand] = []
    t0 = time.monotonic()

    def phase(what: str) -> None:  # where the time goes, in the captured output
        print(f"{time.monotonic() - t0:7.1f}s {what}")

    def start(n: int) -> RunCommand:
        run = RunCommand(node, args, tmp_path / f"run{n}.log")
        runs.append(run)

        def ready() -> bool:
            if run.proc.poll() is not None:
                raise AssertionError(f"ipvsctl run exited {run.proc.returncode}:\n{run.tail()}")
            answer = _status(node, url, "/readyz")
            return answer is not None and answer[0] == 200

        wait_for(ready, timeout=300, interval=0.5, what="/readyz 200")
        phase(f"ipvsctl run #{n} ready")
        return run

    try:
        first = start(1)
        assert weights(node) == {str(KEY): {f"{p.ip}:8080": 1 for p in pods}}
        assert {client.request(VIP, 80, reset=True) for _ in range(4)} == {p.name for p in pods}

        held, gone, other = held_connection(node, client, pods)
        write_manifests(folder, service("web"), endpoint_slice("web", eps(other)))
        wait_for(lambda: weights(node)[str(KEY)][f"{gone.ip}:8080"] == 0, what="weight 0")
        (entry,) = json.loads(http_get(url + "/status", node.name)[1])["drain_queue"]
        assert (entry["address"], entry["reason"], entry["pod"]) == (
            gone.ip,
            "removed",
            f"default/{gone.name}",
        )

        # SIGTERM in the middle of the drain: exit 0, the table exactly as it was
        table = weights(node)
        assert first.stop() == 0, first.tail()
        phase("ipvsctl run #1 stopped")
        assert weights(node) == table  # weight 0 kept, nothing flushed
        assert client.request(VIP, 80) == other.name
        assert held.echo("served while no daemon runs")

        # a new daemon takes the drain up again, with the same deadline, touching nothing
        start(2)
        (again,) = json.loads(http_get(url + "/status", node.name)[1])["drain_queue"]
        assert again["deadline"] == entry["deadline"] and again["since"] == entry["since"]
        assert (again["reason"], again["pod"]) == (entry["reason"], entry["pod"])
        assert weights(node) == table
        metrics = http_get(url + "/metrics", node.name)[1]
        assert metric_sum(metrics, "ipvsctl_kernel_ops_total") == 0  # nothing set back to 1
        assert metric_sum(metrics, "ipvsctl_drain_queue_length") == 1

        check_status_command(node, url, gone, other)
        phase("ipvsctl status checked")

        held.abort()
        wait_for(
            lambda: f"{gone.ip}:8080" not in weights(node)[str(KEY)],
            timeout=90,
            what="deleted once its connection is gone",
        )
        metrics = http_get(url + "/metrics", node.name)[1]
        assert metric_sum(metrics, "ipvsctl_real_server_deletions_total", reason="drained") == 1
        phase("drained")
        assert runs[-1].stop() == 0, runs[-1].tail()
        phase("ipvsctl run #2 stopped")
        assert weights(node) == {str(KEY): {f"{other.ip}:8080": 1}}
    finally:
        for run in runs:
            run.kill()


def check_status_command(node: Node, url: str, gone: Pod, other: Pod) -> None:
    """`ipvsctl status --json` (the command, in the node's netns) and the text form."""
    t0 = time.monotonic()
    r = subprocess.run(
        [
            "ip",
            "netns",
            "exec",
            node.name,
            str(BIN / "ipvsctl"),
            "status",
            "--json",
            "--endpoint",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    print(f"ipvsctl status --json took {time.monotonic() - t0:.1f}s")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["daemon"]["reachable"] and doc["kernel"]["readable"]
    (vs,) = doc["virtual_servers"]
    assert (vs["protocol"], vs["address"], vs["port"]) == ("TCP", VIP, 80)
    assert (vs["service"], vs["port_name"], vs["scheduler"]) == ("default/web", "http", "rr")
    rss = {r["address"]: r for r in vs["real_servers"]}
    assert (rss[gone.ip]["weight"], rss[gone.ip]["pod"], rss[gone.ip]["state"]) == (
        0,
        f"default/{gone.name}",
        "draining",
    )
    assert rss[gone.ip]["active_conns"] >= 1  # read from the kernel
    drain = rss[gone.ip]["drain"]
    assert drain["reason"] == "removed" and drain["age"] > 0 and 0 < drain["time_left"] <= 600
    assert (rss[other.ip]["weight"], rss[other.ip]["pod"], rss[other.ip]["state"]) == (
        1,
        f"default/{other.name}",
        "active",
    )
    assert len(doc["drain_queue"]) == 1

    # the text form, in-process (one Python start less) but in the node's netns too
    from typer.testing import CliRunner

    from ipvsctl.cli.app import app

    result = run_in_netns(node.name, lambda: CliRunner().invoke(app, ["status", "--endpoint", url]))
    assert result.exit_code == 0, result.output
    text = result.output
    assert "default/web:http" in text and f"default/{other.name}" in text
    (line,) = [ln for ln in text.splitlines() if ln.startswith(f"  -> {gone.ip}:8080")]
    assert re.search(
        rf"\s0\s+[1-9]\d*\s+\d+\s+default/{gone.name} DRAINING \(removed, "
        r"age [\d.]+s, [\d.]+s left; connections 1 established/0 closing/"
        r"0 closed\)",
        line,
    ), line
    assert "drain queue: 1" in text

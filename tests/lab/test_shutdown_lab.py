"""On a real kernel: a pod's shutdown barrier (`ipvsctl shutdown-manager`) returns as
soon as its node has set the pod's real servers to weight 0 and the pod's connections have
closed, not after a fixed sleep.

The node's daemon runs in-process (labkit.start_daemon: IPVS in the node's netns, its HTTP
server there too); the shutdown-manager runs in-process inside the pod's netns (its HTTP
server, barrier thread and daemon queries all live there, as in a sidecar), asks the daemon
at the node's veth gateway address and counts the pod's connections in the pod's own
/proc/net (that of a process in the pod's netns). The kubelet's preStop GET /shutdown comes
from the node.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from devkit.builders import endpoint, endpoint_slice, service, terminating
from devkit.labkit import (
    NODE_GW4,
    Node,
    Pod,
    daemon_url_from_pods,
    http_get,
    http_json,
    wait_for,
)
from ipvsctl.cli.shutdown_manager import ManagerOptions, ShutdownManager
from ipvsctl.kernel.netns import run_in_netns
from ipvsctl.manifests import ManifestSource
from ipvsctl.model import Protocol, ServiceKey
from ipvsctl.shutdown.barrier import BarrierConfig

pytestmark = pytest.mark.lab

VIP = "10.96.0.10"
KEY = ServiceKey(Protocol.TCP, VIP, 80)
TIMEOUT = 240.0  # the barrier's --timeout: far beyond anything this test waits for


def write_manifests(folder: Path, *objs: dict[str, Any]) -> None:
    tmp = folder / ".web.yaml.tmp"
    tmp.write_text(yaml.safe_dump_all(objs))
    tmp.rename(folder / "web.yaml")


class PreStop(threading.Thread):
    """The kubelet's preStop hook: GET /shutdown from the node, and when it answered."""

    def __init__(self, node: Node, url: str) -> None:
        super().__init__(daemon=True, name="prestop")
        self.node, self.url = node, url
        self.answer: Any = None
        self.error: BaseException | None = None
        self.at = 0.0

    def run(self) -> None:
        try:
            self.answer = http_json(self.url, self.node.name, timeout=TIMEOUT + 60)
        except BaseException as exc:  # re-raised by the test
            self.error = exc
        self.at = time.monotonic()


def test_shutdown_barrier_returns_once_weight_is_0_and_the_connection_closed(
    node: Node, client: Pod, tmp_path: Path, make_daemon: Callable[..., Any]
) -> None:
    leaving = node.make_pod("10.244.1.1", name="web-1")
    staying = node.make_pod("10.244.1.2", name="web-2")
    folder = tmp_path / "manifests"
    folder.mkdir()
    both = [endpoint(leaving.ip, pod=leaving.name), endpoint(staying.ip, pod=staying.name)]
    write_manifests(folder, service("web"), endpoint_slice("web", both))
    daemon = make_daemon(node, ManifestSource(folder, interval=0.1))
    wait_for(lambda: daemon.engine.started, timeout=120, what="the daemon's first sync")

    # a client connection to the pod that is about to shut down (rr: one of two tries)
    held = client.connect(VIP, 80)
    if held.pod != leaving.name:
        held.abort()
        held = client.connect(VIP, 80)
    assert held.pod == leaving.name

    # the sidecar, inside the leaving pod's netns: its threads are created there too
    manager = start_manager_in(leaving, daemon_url_from_pods(daemon))
    try:
        prestop = PreStop(node, f"http://{leaving.ip}:{manager.port}/shutdown")
        prestop.start()

        def status() -> dict[str, Any]:
            return manager.barrier.status()

        # the node still sends the pod new connections: the barrier waits for it (past
        # "no answer yet", the reason before the daemon's first answer arrives)
        def answered() -> bool:
            s = status()
            waiting = s["daemons"]["not_quiesced"] if s.get("stage") == "daemons" else {}
            return bool(waiting) and "no answer yet" not in waiting.values()

        wait_for(answered, timeout=120, what="the daemon's answer to the barrier")
        # reached from the pod's netns, at the node's address: a real answer, not an error
        assert status()["daemons"]["not_quiesced"] == {
            daemon_url_from_pods(daemon): "1 real server with weight > 0"
        }
        assert prestop.answer is None and prestop.error is None

        # the pod is being deleted: its endpoint turns terminating, the node drains it
        write_manifests(
            folder,
            service("web"),
            endpoint_slice(
                "web",
                [terminating(leaving.ip, pod=leaving.name), endpoint(staying.ip, pod=staying.name)],
            ),
        )
        wait_for(
            lambda: node.ipvsadm()[str(KEY)].real_servers[f"{leaving.ip}:8080"].weight == 0,
            what="weight 0",
        )
        # quiesced; now the pod's own established connection holds the barrier
        wait_for(
            lambda: (
                status().get("stage") == "connections"
                and status()["connections"]["established"] == 1
            ),
            timeout=120,
            what="the barrier counting the pod's connection",
        )
        assert prestop.answer is None and prestop.error is None
        assert held.echo("the pod still serves its client")
        assert client.request(VIP, 80) == staying.name  # new connections go elsewhere

        closed_at = time.monotonic()
        held.close()
        prestop.join(TIMEOUT + 60)
        assert prestop.error is None, prestop.error
        doc = prestop.answer
        assert doc["outcome"] == "drained", doc  # ended by its conditions, not its timeout
        assert prestop.at >= closed_at
        assert doc["elapsed_seconds"] < TIMEOUT
        assert set(doc["stages"]) == {"daemons", "connections"}
        assert doc["daemons"]["quiesced"] == 1 and doc["daemons"]["not_quiesced"] == {}
        assert doc["connections"]["established"] == 0
        quiesced = http_json(
            f"http://127.0.0.1:{daemon.http.port}/v1/quiesced?ip={leaving.ip}", node.name
        )
        assert quiesced["quiesced"] and quiesced["real_servers_with_weight"] == 0
    finally:
        manager.stop()


def test_a_stray_early_shutdown_call_does_not_make_the_real_prestop_return_early(
    node: Node, client: Pod, tmp_path: Path, make_daemon: Callable[..., Any]
) -> None:
    """Another pod GETs /shutdown while this pod is in no Service yet (quiesced on
    every node, so that barrier ends at once, "drained"). Later the pod serves, then is
    deleted: the kubelet's preStop must wait for the node's weight 0, not get the stray
    call's result. Also: /status answers only the node, /v1/quiesced anyone."""
    leaving = node.make_pod("10.244.1.1", name="web-1")
    staying = node.make_pod("10.244.1.2", name="web-2")
    folder = tmp_path / "manifests"
    folder.mkdir()
    write_manifests(
        folder, service("web"), endpoint_slice("web", [endpoint(staying.ip, pod=staying.name)])
    )
    daemon = make_daemon(node, ManifestSource(folder, interval=0.1))
    wait_for(lambda: daemon.engine.started, timeout=120, what="the daemon's first sync")
    from_pod = daemon_url_from_pods(daemon)
    assert http_get(f"{from_pod}/status", client.netns.name)[0] == 403
    assert http_json(f"{from_pod}/v1/quiesced?ip={leaving.ip}", client.netns.name)["ready"]
    assert http_json(f"http://127.0.0.1:{daemon.http.port}/status", node.name)["ready"]

    manager = start_manager_in(leaving, from_pod)
    try:
        # The pod's default gateway (the node's veth address, where the kubelet's preStop
        # comes from), read from the pod's own /proc/net/route, is trusted as the node's.
        assert manager.trusted == {NODE_GW4}
        url = f"http://{leaving.ip}:{manager.port}/shutdown"
        stray = http_json(url, client.netns.name, timeout=TIMEOUT + 60)  # from another pod
        assert stray["outcome"] == "drained"  # nothing to wait for: in no Service yet

        # the pod becomes an endpoint; later it is deleted and the kubelet calls preStop
        write_manifests(
            folder,
            service("web"),
            endpoint_slice(
                "web",
                [endpoint(leaving.ip, pod=leaving.name), endpoint(staying.ip, pod=staying.name)],
            ),
        )

        def weight() -> int | None:
            table = node.ipvsadm()
            rs = (
                table[str(KEY)].real_servers.get(f"{leaving.ip}:8080")
                if str(KEY) in table
                else None
            )
            return rs.weight if rs is not None else None

        wait_for(lambda: weight() == 1, what="weight 1")
        # Another pod holds 64 stray /shutdown calls and floods the port with
        # idle connections (they used to take every slot: the preStop got 503 at once).
        request = b"GET /shutdown HTTP/1.1\r\nHost: x\r\n\r\n"

        def crowd() -> list[socket.socket]:
            socks = []
            for i in range(64 + 200):
                s = socket.create_connection((leaving.ip, manager.port), timeout=30)
                if i < 64:
                    s.sendall(request)
                socks.append(s)
            return socks

        held = run_in_netns(client.netns.name, crowd)
        prestop = PreStop(node, url)
        prestop.start()
        wait_for(
            lambda: (
                manager.barrier.status().get("state") == "running"
                and manager.barrier.status()["daemons"]["not_quiesced"]
            ),
            timeout=120,
            what="the preStop's own barrier asking the daemon",
        )
        assert prestop.answer is None and prestop.error is None  # not the stray's result
        assert manager.http.server.connections_of(client.ip) <= 16  # the crowd's own slots

        terminating_at = time.monotonic()
        write_manifests(
            folder,
            service("web"),
            endpoint_slice(
                "web",
                [terminating(leaving.ip, pod=leaving.name), endpoint(staying.ip, pod=staying.name)],
            ),
        )
        # weight 0, then deleted at once: the pod has no connection to hold the drain
        wait_for(lambda: weight() != 1, what="weight 0 (or already drained and deleted)")
        prestop.join(TIMEOUT + 60)
        assert prestop.error is None, prestop.error
        assert prestop.answer["outcome"] == "drained", prestop.answer
        assert prestop.at >= terminating_at
        assert manager.barrier.runs >= 2  # the stray crowd may start one of its own
        for sock in held:
            sock.close()
    finally:
        manager.stop()


def start_manager_in(leaving: Pod, daemon_url: str) -> ShutdownManager:
    """A shutdown-manager for `leaving`, started inside its netns (its threads too)."""
    options = ManagerOptions(
        pod_ips=(leaving.ip,),
        listen="0.0.0.0:0",
        daemons=(daemon_url,),
        proc_net=leaving.proc_net(),
        barrier=BarrierConfig(check_interval=0.2, timeout=TIMEOUT),
    )

    def start() -> ShutdownManager:
        manager = ShutdownManager(options)
        manager.start()
        return manager

    return run_in_netns(leaving.netns.name, start)

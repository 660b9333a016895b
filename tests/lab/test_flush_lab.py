"""A table flushed by another program on the real kernel (CONTRACT.md "Beside another
proxy"): kube-proxy's start-up cleanup (`ipvsadm -C`, then kube-ipvs0 deleted) under live
connections, and what keeps them: `expire_nodest_conn` at 0 between ipvsctl's own
deletions (and 1 around them), and the hold rules of ipvsctl's nftables table.

Streams (devkit.flushkit) push a numbered line every 20 ms and send one every 50 ms: a
stream that completes carried every line, in order, both ways, across the flush.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devkit.builders import endpoint, endpoint_slice, service
from devkit.flushkit import Stream, StreamServer, UdpFlow, flush_like_kube_proxy
from devkit.labkit import Node, Pod, sh, wait_for
from ipvsctl.kernel.netlink.nftables import NftGeneration
from ipvsctl.model import Protocol, RealServerKey, ServiceKey, VirtualServer
from ipvsctl.netfilter.ruleset import Element, RulesetConfig, Verdict, replace_table_ruleset
from ipvsctl.source.events import ObjectKind, Upsert
from tests.lab import netkit

pytestmark = pytest.mark.lab

VIP4, VIP6, PORT, TARGET = "10.96.0.10", "fd96::10", 80, 8081
EXPIRE_NODEST_CONN = "net.ipv4.vs.expire_nodest_conn"
UDP_PORT, UDP_TARGET = 53, 5353
KEYS = (
    ServiceKey(Protocol.TCP, VIP4, PORT),
    ServiceKey(Protocol.TCP, VIP6, PORT),
    ServiceKey(Protocol.UDP, VIP4, UDP_PORT),
)


def backend_of(key: ServiceKey, pod: Pod) -> RealServerKey:
    if key.protocol is Protocol.UDP:
        return RealServerKey(pod.ip, UDP_TARGET)
    return RealServerKey(pod.address(key.family), TARGET)


def program(node: Node, pod: Pod) -> None:
    """What the daemon keeps for one dual-stack ClusterIP and a UDP port: the virtual and
    real servers (their addresses on kube-ipvs0) through the NetlinkKernel."""
    for key in KEYS:
        with contextlib.suppress(Exception):  # already there (a partial flush)
            node.kernel.add_virtual_server(VirtualServer(key), True)
        with contextlib.suppress(Exception):
            node.kernel.add_real_server(key, backend_of(key, pod), 1)


@pytest.fixture
def flushed_node(node: Node) -> tuple[Node, Pod, Pod]:
    """A configured node (configure_host) with a streaming backend, a client pod, an uplink
    with the default routes (in the gap the virtual IPs are routed away, as on a node), and
    ipvsctl's nftables table for the virtual servers."""
    node.netns.ip_batch(
        [
            "link add up0 type dummy",
            "link set up0 up",
            "addr add 192.0.2.10/24 dev up0",
            "route add default dev up0",
            "route add ::/0 dev up0",
        ]
    )
    pod = node.make_pod("10.244.1.1", "fd44::1", name="server", tcp=(), udp=(UDP_TARGET,))
    client = node.make_client()
    program(node, pod)
    elements = {key: Element(Verdict.CLUSTER_IP, None, True) for key in KEYS}
    config = RulesetConfig(cluster_cidrs=("10.244.0.0/16", "fd44::/64"))
    sh("nft", "-f", "-", netns=node.name, stdin=replace_table_ruleset(config, elements))
    return node, pod, client


def test_the_sysctl_is_0_between_deletions_and_1_around_each_of_ipvsctls_own(
    flushed_node: tuple[Node, Pod, Pod],
) -> None:
    """A connection whose real server ipvsctl deletes (its drain's deadline) is cut, and its
    client told at its next packet (a reset, at once), as with expire_nodest_conn at 1
    throughout; the sysctl is 0 before and after."""
    node, pod, client = flushed_node
    server = StreamServer(pod, TARGET, interval=0.2)
    try:
        assert node.netns.sysctl(EXPIRE_NODEST_CONN) == "0"
        conn = Stream(client.netns, VIP4, PORT, interval=0.2)
        wait_for(lambda: conn.lines >= 3, what="stream flowing")
        node.kernel.delete_real_server(KEYS[0], backend_of(KEYS[0], pod))
        assert node.netns.sysctl(EXPIRE_NODEST_CONN) == "0"
        # well within IPVS's 900 s established timeout: the client is told at its next
        # packet (a reset; a silent drop would only end at a read timeout, no reset), and
        # the hold rules do not keep a connection IPVS no longer knows
        wait_for(lambda: not conn.alive(), timeout=60, interval=0.05, what="stream cut")
        assert conn.error and "reset" in conn.error.lower(), conn.error
        assert not [c for c in node.ipvs_connections() if c[3] == f"{VIP4}:{PORT}"]
    finally:
        server.close()


def test_a_table_flushed_by_kube_proxy_keeps_every_connection_once_put_back(
    flushed_node: tuple[Node, Pod, Pod],
) -> None:
    """kube-proxy's cleanup under three streams (a pod's over IPv4 and IPv6, the node's
    own) and a UDP flow; the table put back a second later, as the daemon does: every
    stream completes with all its lines, no datagram is refused."""
    node, pod, client = flushed_node
    server = StreamServer(pod, TARGET)
    try:
        streams = {
            "pod4": Stream(client.netns, VIP4, PORT),
            "pod6": Stream(client.netns, VIP6, PORT),
            "node4": Stream(node.netns, VIP4, PORT),
        }
        udp = UdpFlow(client.netns, VIP4, UDP_PORT)
        wait_for(lambda: all(s.lines >= 20 for s in streams.values()), what="streams flowing")
        flush_like_kube_proxy(node)
        assert node.ipvsadm() == {}
        time.sleep(1.0)  # the gap: the daemon notices within a second
        program(node, pod)
        marks = {k: s.lines for k, s in streams.items()}
        wait_for(
            lambda: all(s.lines > marks[k] + 20 or not s.alive() for k, s in streams.items()),
            timeout=90,
            what="streams moving again",
        )
        results = {k: (s.finish(), s.error) for k, s in streams.items()}
        assert results == {k: (True, None) for k in streams}, results
        assert server.errors == [] and server.finished == 3
        flow = udp.stop()
        assert flow["refused"] == 0 and flow["answered"] > 0, flow
    finally:
        server.close()


def test_the_hold_rules_leave_a_whole_table_alone(flushed_node: tuple[Node, Pod, Pod]) -> None:
    """With the table whole: new connections from a pod and from the node, UDP, and a
    virtual IP's other ports still refused at once by the port filter, never held."""
    node, pod, client = flushed_node
    server = StreamServer(pod, TARGET)
    try:
        for netns, vip in ((client.netns, VIP4), (client.netns, VIP6), (node.netns, VIP4)):
            s = Stream(netns, vip, PORT)
            assert s.pod == "server"
            wait_for(lambda s=s: s.lines >= 3, what="stream flowing")
            assert s.finish()
        assert client.udp(VIP4, UDP_PORT) == "server"
        sock = client.netns.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.settimeout(5)
        with pytest.raises(ConnectionRefusedError):
            sock.connect((VIP4, 22))
        sock.close()
    finally:
        server.close()


# --- the daemon's table guard ----------------------------------------------------------------
TIMINGS: dict[str, float] = {}


def timing(name: str, seconds: float) -> None:
    """Measured, not asserted (docs/benchmarks.md reads them from the lab's out/)."""
    TIMINGS[name] = round(seconds, 3)
    out = os.environ.get("IPVSCTL_LAB_OUT")
    if out:
        with open(os.path.join(out, "flush-timings.json"), "w") as f:
            json.dump(TIMINGS, f, indent=1)


def _uplink(node: Node) -> None:
    node.netns.ip_batch(
        [
            "link add up0 type dummy",
            "link set up0 up",
            "addr add 192.0.2.10/24 dev up0",
            "route add default dev up0",
        ]
    )


@contextlib.contextmanager
def guarded_daemon(node: Node, manifests: Path, state: Path) -> Iterator[Any]:
    """The daemon in-process, its first sync done and its hold rules in place."""
    with netkit.run_daemon(node, manifests, state, node_ips=("192.0.2.10",)) as d:
        wait_for(lambda: d.engine.started, timeout=180, what="first sync")
        wait_for(
            lambda: "hold-input" in node.run("nft", "list", "table", "inet", "ipvsctl"),
            timeout=120,
            what="the hold rules",
        )
        yield d


def _new_connection_answered(client: Pod) -> bool:
    try:
        s = Stream(client.netns, VIP4, PORT)
    except OSError:
        return False
    return s.finish()


def test_the_daemon_puts_back_a_table_kube_proxy_flushed_and_every_stream_completes(
    node: Node, tmp_path: Path
) -> None:
    """The real daemon (its nftables table and hold rules, its table guard) under kube-proxy's
    cleanup: streams from a pod and from the node complete with every line, the table comes
    back on its own (virtual and real servers, kube-ipvs0 and its address), each restore is
    counted, and a new connection is answered after it."""
    _uplink(node)
    pod = node.make_pod("10.244.1.1", name="web-1", tcp=())
    client = node.make_client()
    server = StreamServer(pod, 8080)
    manifests, state = tmp_path / "m", tmp_path / "state"
    manifests.mkdir()
    netkit.write_manifests(
        manifests, "web.yaml", service("web"), endpoint_slice("web", [endpoint(pod.ip)])
    )
    try:
        with guarded_daemon(node, manifests, state) as d:
            table = node.ipvsadm()
            streams: dict[str, Any] = {
                "pod4": Stream(client.netns, VIP4, PORT),
                "node4": Stream(node.netns, VIP4, PORT),
            }
            wait_for(lambda: all(s.lines >= 20 for s in streams.values()), what="streams flowing")
            t0 = time.monotonic()
            flush_like_kube_proxy(node)
            flushed = time.monotonic()
            timing("flush_commands_s", flushed - t0)  # ipvsadm -C, ip link del: emulated
            # the daemon's own word (in-process: no command to poll with)
            wait_for(
                lambda: d.metrics.value("ipvsctl_table_restores_total", {"what": "ipvs"}) >= 1,
                timeout=60,
                interval=0.01,
                what="the restore",
            )
            timing("flushed_to_restored_s", time.monotonic() - flushed)
            wait_for(
                lambda: (
                    {k: set(v.real_servers) for k, v in node.ipvsadm().items()}
                    == {k: set(v.real_servers) for k, v in table.items()}
                ),
                timeout=60,
                interval=0.02,
                what="the table back",
            )
            timing("flush_to_table_back_seen_by_ipvsadm_s", time.monotonic() - t0)
            assert VIP4 in node.interface_addresses()
            wait_for(lambda: _new_connection_answered(client), timeout=60, what="a new connection")
            timing("flush_to_new_connection_answered_s", time.monotonic() - t0)
            marks = {k: s.lines for k, s in streams.items()}
            wait_for(
                lambda: all(s.lines > marks[k] + 20 or not s.alive() for k, s in streams.items()),
                timeout=90,
                what="streams moving again",
            )
            timing("longest_stall_s", max(s.stall() for s in streams.values()))
            results = {k: (s.finish(), s.error) for k, s in streams.items()}
            assert results == {k: (True, None) for k in streams}, results
            restores = d.metrics.value("ipvsctl_table_restores_total", {"what": "ipvs"})
            interface = d.metrics.value("ipvsctl_table_restores_total", {"what": "interface"})
            assert restores >= 1 and interface >= 1, (restores, interface)
            # its nftables table deleted (`nft flush ruleset`): back, hold rules and all, on
            # the generation read (the periodic check is 30 s; the time is recorded)
            t1 = time.monotonic()
            sh("nft", "delete", "table", "inet", "ipvsctl", netns=node.name)

            def table_back() -> bool:
                if d.metrics.value("ipvsctl_table_restores_total", {"what": "nftables"}) < 1:
                    return False
                with contextlib.suppress(RuntimeError):  # nft: no such table, yet
                    return "hold-input" in node.run("nft", "list", "table", "inet", "ipvsctl")
                return False

            wait_for(
                table_back,
                timeout=90,
                interval=0.05,
                what="the nftables table put back",
            )
            timing("nft_table_deleted_to_restored_s", time.monotonic() - t1)
    finally:
        server.close()


def test_a_drain_that_meets_the_flush_before_the_guard_is_kept_and_the_table_put_back(
    node: Node, tmp_path: Path
) -> None:
    """kube-proxy's cleanup, then an endpoint leaving before the table guard's pass (the
    loop's lock held: the test is the loop): the change puts the whole table back as
    applied (the other Service and kube-ipvs0 too) and drains on it, the leaving pod's real
    server at weight 0 with its drain queued; every stream, through either pod, completes."""
    _uplink(node)
    pods = [node.make_pod(f"10.244.1.{i}", name=f"web-{i}", tcp=()) for i in (1, 2)]
    kept, gone = pods
    client = node.make_client()
    servers = [StreamServer(p, 8080) for p in pods]
    manifests, state = tmp_path / "m", tmp_path / "state"
    manifests.mkdir()
    api = (service("api", cluster_ip="10.96.0.11"), endpoint_slice("api", [endpoint(kept.ip)]))
    both = endpoint_slice("web", [endpoint(p.ip, pod=p.name) for p in pods])
    after = endpoint_slice("web", [endpoint(kept.ip, pod=kept.name)])
    netkit.write_manifests(manifests, "web.yaml", service("web"), both, *api)
    try:
        with guarded_daemon(node, manifests, state) as d:
            streams = [Stream(client.netns, VIP4, PORT) for _ in range(4)]
            wait_for(lambda: all(s.lines >= 20 for s in streams), what="streams flowing")
            assert {s.pod for s in streams} == {kept.name, gone.name}  # round robin
            with d.loop.lock:  # neither the guard's thread nor the audit's runs meanwhile
                flush_like_kube_proxy(node)
                netkit.write_manifests(manifests, "web.yaml", service("web"), after, *api)
                d.engine.handle(Upsert(ObjectKind.ENDPOINT_SLICE, after, time.monotonic()))
                d.engine.sync()
            assert d.metrics.value("ipvsctl_table_restores_total", {"what": "ipvs"}) == 1
            table = node.ipvsadm()
            web = table[f"{VIP4}:{PORT}/TCP"].real_servers
            assert {rs: w.weight for rs, w in web.items()} == {
                f"{kept.ip}:8080": 1,
                f"{gone.ip}:8080": 0,
            }
            assert "10.96.0.11:80/TCP" in table
            assert {VIP4, "10.96.0.11"} <= node.interface_addresses()
            key = ServiceKey(Protocol.TCP, VIP4, PORT)
            assert d.engine.drains.queue.get(key, RealServerKey(gone.ip, 8080)) is not None
            marks = [s.lines for s in streams]
            wait_for(
                lambda: all(s.lines > m + 20 for s, m in zip(streams, marks, strict=True)),
                timeout=90,
                what="every stream moving again",
            )
            results = [(s.pod, s.finish(), s.error) for s in streams]
            assert all(ok for _, ok, _ in results), results
    finally:
        for server in servers:
            server.close()


def test_nfnetlink_says_the_generation_moved_and_whether_ipvsctls_table_is_there(
    node: Node,
) -> None:
    """The generation read the netfilter sync polls (one nfnetlink message) moves with any
    program's nftables transaction, and the table lookup it then makes tells a deleted
    `inet ipvsctl` from a present one, on the real kernel."""
    watch = NftGeneration("inet ipvsctl", node.name)
    sh("nft", "add", "table", "inet", "ipvsctl", netns=node.name)
    first = watch.generation()
    assert watch.generation() == first  # a read moves nothing
    assert watch.table_exists()
    sh("nft", "add", "table", "ip", "someone_else", netns=node.name)
    second = watch.generation()
    assert second != first
    assert watch.table_exists()
    sh("nft", "delete", "table", "inet", "ipvsctl", netns=node.name)
    assert watch.generation() != second
    assert not watch.table_exists()
    assert not NftGeneration(
        "ip ipvsctl", node.name
    ).table_exists()  # a family is part of a table's name
    sh("nft", "delete", "table", "ip", "someone_else", netns=node.name)
    watch.close()

"""The stale-UDP-entry sweep on a real kernel, with real datagrams.

What the kernel does (6.1, seen here): a datagram to a UDP virtual server with no real
server is dropped by IPVS before conntrack confirms its entry, so it leaves none. But a
datagram to a VIP on the dummy interface with no UDP virtual server on that port (the
Service had no UDP port yet, or the daemon was not running) is delivered locally and leaves
an entry answered by the VIP itself. Once the virtual server exists, IPVS still schedules
that flow's datagrams (its own table, not conntrack's), but they keep riding the old entry:
NAT was settled for it at its first packet, so the node's masquerade rule never applies and
the endpoint sees the client's own address (in a cluster: replies that bypass the node, a
broken flow). A client that keeps its source port (a DNS resolver) stays there as long as
it keeps sending. Deleting the entry lets the next datagram start a fresh, masqueraded one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from devkit.builders import endpoint, endpoint_slice, service
from devkit.fakeapi.server import FakeAPIServer
from devkit.labkit import NODE_GW4, Node, Pod, sh, wait_for
from ipvsctl.kernel.netlink.conntrack import NetlinkConntrack
from ipvsctl.kube.client import KubeSource
from ipvsctl.kube.settings import KubeSettings
from ipvsctl.model import Protocol, RealServerKey, ServiceKey, VirtualServer
from ipvsctl.model.conntrack import ConntrackEntry
from ipvsctl.obs.metrics import Metrics
from ipvsctl.plan.conntrack import SweepTable, stale_entries
from ipvsctl.reconcile.conntrack_sweeper import ConntrackSweeper

pytestmark = pytest.mark.lab

VIP = "10.96.0.10"
# The node masquerades what it sends to the pods' DNS port, as a CNI or ipvsctl's own
# table would for traffic that must come back through the node.
_MASQUERADE = """\
table ip lab_nat {
    chain post {
        type nat hook postrouting priority 100; ip daddr 10.244.1.0/24 udp dport 5353 masquerade;
    }
}
"""


@pytest.fixture
def dns_pod(node: Node) -> Pod:
    sh("nft", "-f", "-", netns=node.name, stdin=_MASQUERADE)
    pod = node.make_pod("10.244.1.1", name="dns-1", tcp=(5353,))
    pod.serve("udp", 5353, report_peer=True)
    return pod


def to_vip(ct: NetlinkConntrack, client: Pod) -> list[ConntrackEntry]:
    return [
        e
        for e in ct.list_conntrack(Protocol.UDP, False)
        if e.orig_dst == VIP and e.orig_src == client.ip
    ]


def stale_entry(ct: NetlinkConntrack, client: Pod, sock: Any) -> ConntrackEntry:
    """Send from `sock` to VIP:53/UDP (no UDP virtual server: no answer) until the kernel
    holds the entry answered by the VIP."""
    port = sock.getsockname()[1]

    def made() -> ConntrackEntry | None:
        client.udp(VIP, 53, sock, timeout=0.5)
        return next(
            (e for e in to_vip(ct, client) if e.orig_sport == port and e.reply_src == VIP), None
        )

    return wait_for(made, what="a conntrack entry answered by the VIP")


def answer(client: Pod, sock: Any) -> tuple[str, str]:
    """(pod, the client address it saw) for one datagram from `sock`, retried."""
    text = wait_for(lambda: client.udp(VIP, 53, sock, timeout=1.0), what="a UDP answer")
    pod, peer = text.split()
    return pod, peer


def test_a_stale_entry_bypasses_masquerade_until_deleted(
    node: Node, client: Pod, dns_pod: Pod
) -> None:
    ct = NetlinkConntrack(netns=node.name)
    tcp = ServiceKey(Protocol.TCP, VIP, 53)  # the VIP is bound, with no UDP port yet
    node.kernel.add_virtual_server(VirtualServer(tcp), bind_address=True)
    sock = client.udp_socket(4)
    stale = stale_entry(ct, client, sock)

    udp = ServiceKey(Protocol.UDP, VIP, 53)
    node.kernel.add_virtual_server(VirtualServer(udp), bind_address=True)
    node.kernel.add_real_server(udp, RealServerKey(dns_pod.ip, 5353), 1)
    # served by IPVS, but on the old entry: not masqueraded
    assert answer(client, sock) == (dns_pod.name, client.ip)
    assert stale in to_vip(ct, client)

    table = SweepTable({(Protocol.UDP, VIP, 53): frozenset({dns_pod.ip})})
    found = stale_entries(ct.list_conntrack(Protocol.UDP, False), table)
    assert found == [stale]
    assert ct.delete_conntrack(found) == 1
    assert ct.delete_conntrack(found) == 0  # gone: not an error

    assert answer(client, sock) == (dns_pod.name, NODE_GW4)  # same source port, masqueraded
    assert [e.reply_src for e in to_vip(ct, client)] == [dns_pod.ip]
    sock.close()


@pytest.fixture
def api() -> Iterator[FakeAPIServer]:
    with FakeAPIServer() as server:
        yield server


def dns_service(*protocols: str) -> dict[str, Any]:
    return service(
        "dns",
        VIP,
        ports=[
            {"name": p.lower(), "port": 53, "protocol": p, "targetPort": 5353} for p in protocols
        ],
    )


def dns_slice(pod: Pod, *protocols: str) -> dict[str, Any]:
    return endpoint_slice(
        "dns",
        [endpoint(pod.ip, pod=pod.name)],
        ports=[{"name": p.lower(), "port": 5353, "protocol": p} for p in protocols],
    )


def test_the_daemon_sweeps_when_a_udp_port_gets_endpoints(
    node: Node, client: Pod, dns_pod: Pod, api: FakeAPIServer, make_daemon: Callable[..., Any]
) -> None:
    api.add(dns_service("TCP"))
    api.add(dns_slice(dns_pod, "TCP"))
    metrics = Metrics()
    source = KubeSource.from_config(
        apiserver=api.url,
        settings=KubeSettings(backoff_initial=0.05, backoff_max=0.5, healthy_watch_seconds=0.05),
    )
    ct = NetlinkConntrack(netns=node.name)
    d = make_daemon(node, source, metrics=metrics, conntrack=ct)
    wait_for(lambda: d.engine.started, timeout=180, what="the daemon's first sync")
    wait_for(
        lambda: d.part(ConntrackSweeper).last is not None, timeout=120, what="the start-up sweep"
    )
    sock = client.udp_socket(4)
    stale = stale_entry(ct, client, sock)  # made while the Service has no UDP port

    api.update(dns_service("TCP", "UDP"))
    api.update(dns_slice(dns_pod, "TCP", "UDP"))

    def swept() -> bool:
        # keep sending: the entry must not simply expire (30 s unanswered) meanwhile
        client.udp(VIP, 53, sock, timeout=0.5)
        return stale not in to_vip(ct, client)

    wait_for(swept, timeout=120, what="the sweep")
    assert d.part(ConntrackSweeper).last.reason == "endpoints"  # not the 60 s periodic sweep
    assert metrics.value("ipvsctl_conntrack_stale_entries_deleted_total") >= 1
    assert answer(client, sock) == (dns_pod.name, NODE_GW4)  # same source port, masqueraded
    assert [e.reply_src for e in to_vip(ct, client)] == [dns_pod.ip]
    sock.close()

"""ipvsctl's nftables table, healthCheckNodePorts and `ipvsctl cleanup` on a real kernel, with
the real daemon in-process: every path carries real TCP and UDP traffic, and the backends
report the source address they saw, so each assertion is about what masquerading did.

One node netns, shared by the tests of this module (in file order): pods on veths, a host
outside the node on a LAN veth (all its traffic to the node's services comes back through
the node: it is its only route), a client in the node's own netns (host network).

    web    Cluster policy: ClusterIP 10.96.0.10 / fd96::10, NodePorts 30080 (tcp) 30053
           (udp), external IP 203.0.113.10, LB IP 198.51.100.10; endpoint web-1
    local  externalTrafficPolicy Local, healthCheckNodePort 32000: ClusterIP 10.96.0.11 /
           fd96::11, NodePorts 30081/30054, external IP 203.0.113.11, LB IP 198.51.100.11;
           endpoint web-1 (on this node)
"""

from __future__ import annotations

import json
import os
import socket
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from devkit.builders import endpoint, endpoint_slice, service
from devkit.labkit import Node, Pod, _Server, sh, wait_for
from ipvsctl.healthcheck.server import HealthServer
from ipvsctl.kernel.netlink import configure_host
from ipvsctl.model import Protocol, ServiceKey, VirtualServer
from ipvsctl.netfilter.sync import NetfilterSync
from tests.lab import netkit
from tests.lab.netkit import (
    NODE_LAN,
    NODE_LAN6,
    OUTSIDE_IP,
    OUTSIDE_IP6,
    Client,
    HostClient,
    Outside,
    ask,
)

pytestmark = pytest.mark.lab

WEB1, WEB1_6 = "10.244.0.11", "fd00:10:244::11"
OTHER, OTHER6 = "10.244.0.21", "fd00:10:244::21"
HC_PORT = 32000
PORTS = [
    {"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080},
    {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 5353},
]
SLICE_PORTS = [
    {"name": "http", "port": 8080, "protocol": "TCP"},
    {"name": "dns", "port": 5353, "protocol": "UDP"},
]


TIMINGS: dict[str, float] = {}  # written to $IPVSCTL_LAB_OUT/netfilter-timings.json


def timing(name: str, since: float) -> None:
    TIMINGS[name] = round(time.monotonic() - since, 2)
    out = os.environ.get("IPVSCTL_LAB_OUT")
    if out:
        with open(os.path.join(out, "netfilter-timings.json"), "w") as f:
            json.dump(TIMINGS, f, indent=1)


def svc(name: str, n: int, local: bool, **extra: Any) -> dict[str, Any]:
    ports = [dict(PORTS[0], nodePort=30080 + n), dict(PORTS[1], nodePort=30053 + n)]
    spec: dict[str, Any] = {
        "type": "LoadBalancer",
        "externalIPs": [f"203.0.113.{10 + n}"],
        "ipFamilies": ["IPv4", "IPv6"],
        "ipFamilyPolicy": "RequireDualStack",
    }
    if local:
        spec.update(externalTrafficPolicy="Local", healthCheckNodePort=HC_PORT)
    spec.update(extra)
    return service(
        name,
        cluster_ip=[f"10.96.0.{10 + n}", f"fd96::{10 + n}"],
        ports=ports,
        lb_ips=[f"198.51.100.{10 + n}"],
        **spec,
    )


def slices(name: str, ready: bool = True, node: str = "node-a") -> list[dict[str, Any]]:
    return [
        endpoint_slice(
            name,
            [endpoint(WEB1, ready=ready, node=node, pod="web-1")],
            name=f"{name}-v4",
            ports=SLICE_PORTS,
        ),
        endpoint_slice(
            name,
            [endpoint(WEB1_6, ready=ready, node=node, pod="web-1")],
            name=f"{name}-v6",
            ports=SLICE_PORTS,
            address_type="IPv6",
        ),
    ]


@dataclass
class World:
    node: Node
    web1: Pod
    other: Pod
    outside: Outside
    host: HostClient
    manifests: Path
    state: Path
    daemon: Any
    node_addresses: set[str]

    def write(self, name: str, *objs: dict[str, Any]) -> None:
        netkit.write_manifests(self.manifests, name, *objs)

    def elements(self) -> dict[str, str]:
        out = {}
        for family in (4, 6):
            for address, proto, port, target in (
                self.daemon.nft.list_map("inet ipvsctl", f"services{family}") or []
            ):
                out[f"{address} {proto} {port}"] = target
        return out


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    node = Node()
    outside = None
    try:
        configure_host(kernel=node.kernel)
        web1 = node.make_pod(WEB1, WEB1_6, name="web-1", tcp=())
        netkit.serve_peers(web1, tcp=(8080,), udp=(5353,))
        other = node.make_pod(OTHER, OTHER6, name="other", tcp=())
        outside = Outside(node)
        host = HostClient(node)
        tmp = tmp_path_factory.mktemp("netfilter")
        manifests, state = tmp / "m", tmp / "state"
        manifests.mkdir()
        netkit.write_manifests(manifests, "web.yaml", svc("web", 0, False), *slices("web"))
        netkit.write_manifests(manifests, "local.yaml", svc("local", 1, True), *slices("local"))
        node_addresses = {
            line.split()[3].split("/")[0]
            for line in node.run("ip", "-o", "addr", "show").splitlines()
        }
        t0 = time.monotonic()
        with netkit.run_daemon(
            node, manifests, state, cluster_cidrs=("10.244.0.0/16", "fd00:10:244::/56")
        ) as d:
            w = World(node, web1, other, outside, host, manifests, state, d, node_addresses)
            wait_for(lambda: d.engine.started, timeout=120, what="first sync")
            wait_for(lambda: len(w.elements()) == 24, timeout=120, what="24 nft elements")
            timing("daemon_start_to_24_elements_s", t0)
            yield w
    finally:
        if outside is not None:
            outside.close()
        node.close()


def masqueraded(w: World, peer: str) -> bool:
    return peer in w.node_addresses


# --- masquerading and hairpin: every path, TCP and UDP -------------------------------------
PATHS = [
    # (what, client, address, tcp port, udp port, expected source: client|node)
    ("host network -> ClusterIP", "host", "10.96.0.10", 80, 53, "node"),
    ("host network -> ClusterIP v6", "host", "fd96::10", 80, 53, "node"),
    ("pod -> ClusterIP (inside the cluster CIDR)", "other", "10.96.0.10", 80, 53, "client"),
    ("pod -> ClusterIP v6", "other", "fd96::10", 80, 53, "client"),
    ("hairpin: pod -> its own Service -> itself", "web1", "10.96.0.10", 80, 53, "node"),
    ("hairpin v6", "web1", "fd96::10", 80, 53, "node"),
    ("hairpin through externalTrafficPolicy Local", "web1", "203.0.113.11", 80, 53, "node"),
    ("outside -> ClusterIP (outside the cluster CIDR)", "outside", "10.96.0.10", 80, 53, "node"),
    ("outside -> NodePort (Cluster)", "outside", NODE_LAN, 30080, 30053, "node"),
    ("outside -> NodePort v6 (Cluster)", "outside", NODE_LAN6, 30080, 30053, "node"),
    ("outside -> external IP (Cluster)", "outside", "203.0.113.10", 80, 53, "node"),
    ("outside -> LB IP (Cluster)", "outside", "198.51.100.10", 80, 53, "node"),
    ("outside -> NodePort (Local)", "outside", NODE_LAN, 30081, 30054, "client"),
    ("outside -> NodePort v6 (Local)", "outside", NODE_LAN6, 30081, 30054, "client"),
    ("outside -> external IP (Local)", "outside", "203.0.113.11", 80, 53, "client"),
    ("outside -> LB IP (Local)", "outside", "198.51.100.11", 80, 53, "client"),
]


@pytest.mark.parametrize(
    ("what", "who", "address", "tcp", "udp", "source"), PATHS, ids=[p[0] for p in PATHS]
)
def test_traffic_path_and_source_address(
    world: World, what: str, who: str, address: str, tcp: int, udp: int, source: str
) -> None:
    check_path(world, what, who, address, tcp, udp, source)


def check_path(
    world: World, what: str, who: str, address: str, tcp: int, udp: int, source: str
) -> None:
    client: Pod | Client = getattr(world, who)
    v6 = ":" in address
    own = {
        "outside": OUTSIDE_IP6 if v6 else OUTSIDE_IP,
        "other": OTHER6 if v6 else OTHER,
        "web1": WEB1_6 if v6 else WEB1,
    }.get(who)
    for proto, port in (("tcp", tcp), ("udp", udp)):
        pod, peer = ask(client, address, port, proto)
        assert pod == "web-1", (what, proto)
        if source == "client":
            assert peer == own, f"{what} {proto}: backend saw {peer}, not the client {own}"
        else:
            assert masqueraded(world, peer), (
                f"{what} {proto}: backend saw {peer}, not a node address (no masquerade)"
            )
            assert peer != own


# --- rules follow virtual servers, never endpoints ----------------------------------------
def test_endpoint_changes_leave_nftables_alone_service_changes_are_element_deltas(
    world: World,
) -> None:
    d = world.daemon
    before = world.elements()
    assert before["10.96.0.10 tcp 80"] == "cluster-ip"
    assert before[f"{NODE_LAN} udp 30053"] == "external"
    assert before[f"{NODE_LAN6} tcp 30081"] == "external-local"
    assert before["198.51.100.11 tcp 80"] == "external-local"
    runs = d.nft.runs
    listing = sh("nft", "-t", "list", "table", "inet", "ipvsctl", netns=world.node.name)

    # endpoints come and go: IPVS follows, nft is not even run
    world.write(
        "web.yaml",
        svc("web", 0, False),
        *slices("web"),
        endpoint_slice("web", [endpoint(OTHER, pod="other")], name="web-extra", ports=SLICE_PORTS),
    )
    wait_for(
        lambda: "10.244.0.21:8080" in world.node.ipvsadm()["10.96.0.10:80/TCP"].real_servers,
        timeout=60,
        what="second real server",
    )
    world.write("web.yaml", svc("web", 0, False), *slices("web"))

    def drained() -> bool:
        rs = world.node.ipvsadm()["10.96.0.10:80/TCP"].real_servers.get("10.244.0.21:8080")
        return rs is None or rs.weight == 0

    wait_for(drained, timeout=60, what="drained")
    time.sleep(1)
    assert d.nft.runs == runs
    assert world.elements() == before

    # a policy change: the Service's elements change verdict, in one transaction
    t0 = time.monotonic()
    world.write("web.yaml", svc("web", 0, True, healthCheckNodePort=32001), *slices("web"))
    wait_for(
        lambda: world.elements().get("203.0.113.10 tcp 80") == "external-local",
        timeout=60,
        what="verdict change",
    )
    timing("service_policy_change_to_nft_elements_s", t0)
    assert d.nft.runs > runs
    after = world.elements()
    assert {k for k, v in after.items() if v != before[k]} == {
        f"{a} {p} {port}"
        for a in ("203.0.113.10", "198.51.100.10", NODE_LAN, NODE_LAN6)
        for p, port in (
            ("tcp", 30080 if ":" in a or a == NODE_LAN else 80),
            ("udp", 30053 if ":" in a or a == NODE_LAN else 53),
        )
    }
    pod, peer = ask(world.outside, NODE_LAN, 30080)
    assert (pod, peer) == ("web-1", OUTSIDE_IP)  # Local now: the client's address is kept
    # the chains were not rewritten: only elements moved
    assert sh("nft", "-t", "list", "table", "inet", "ipvsctl", netns=world.node.name) == listing

    world.write("web.yaml", svc("web", 0, False), *slices("web"))
    wait_for(lambda: world.elements() == before, timeout=60, what="back to Cluster")
    assert masqueraded(world, ask(world.outside, NODE_LAN, 30080)[1])


def test_periodic_check_puts_back_a_flushed_table(world: World) -> None:
    sync = world.daemon.part(NetfilterSync)
    before = world.elements()
    metrics = world.daemon.metrics
    assert sync.check() and sync.audit()  # nothing to repair in normal operation
    assert metrics.value("ipvsctl_netfilter_repairs_total", {"kind": "table"}) == 0
    assert metrics.value("ipvsctl_netfilter_repairs_total", {"kind": "elements"}) == 0
    sh("nft", "delete", "table", "inet", "ipvsctl", netns=world.node.name)
    t0 = time.monotonic()
    sync._next_check = 0.0  # do not wait for the 30 s timer
    sync.wake.set()
    wait_for(lambda: world.elements() == before, timeout=60, what="table rewritten")
    timing("deleted_table_check_to_rewritten_s", t0)
    assert world.daemon.metrics.value("ipvsctl_netfilter_repairs_total", {"kind": "table"}) >= 1
    assert masqueraded(world, ask(world.outside, NODE_LAN, 30080)[1])


# --- loadBalancerSourceRanges ---------------------------------------------------------------
def refused(client: Pod | Client, address: str, tcp: int = 80, udp: int = 53) -> dict[str, bool]:
    """Whether new TCP and UDP connections from `client` are dropped: unanswered, or, for
    the node's own traffic (dropped at output), refused to the sender with EPERM."""
    try:
        client.connect(address, tcp, timeout=3).close()
        tcp_dropped = False
    except (TimeoutError, PermissionError):
        tcp_dropped = True

    def udp_dropped() -> bool:
        try:
            return client.udp(address, udp, timeout=1) is None
        except PermissionError:
            return True

    return {"tcp": tcp_dropped, "udp": all(udp_dropped() for _ in range(2))}


def test_load_balancer_source_ranges_admit_only_listed_sources(world: World) -> None:
    lb = "198.51.100.10"
    # The outside host's LAN is listed, and with it the node's own LAN address: the node
    # may reach the IP too (kube-proxy's allowFromNode).
    world.write(
        "web.yaml",
        svc("web", 0, False, loadBalancerSourceRanges=["192.168.50.0/24"]),
        *slices("web"),
    )
    wait_for(
        lambda: (
            "198.51.100.10 . tcp . 80"
            in sh("nft", "list", "set", "inet", "ipvsctl", "firewall4", netns=world.node.name)
        ),
        timeout=60,
        what="restricted",
    )
    for client in (world.outside, world.host):
        assert ask(client, lb, 80)[0] == "web-1"
        assert ask(client, lb, 53, "udp")[0] == "web-1"

    # Only 10/8 now: the outside host and the node are dropped, a pod in 10/8 is not, and
    # the same Service's NodePort and external IP stay open (ranges are for LB IPs).
    world.write(
        "web.yaml", svc("web", 0, False, loadBalancerSourceRanges=["10.0.0.0/8"]), *slices("web")
    )
    wait_for(
        lambda: (
            "10.0.0.0/8"
            in sh("nft", "list", "set", "inet", "ipvsctl", "firewall-allow4", netns=world.node.name)
        ),
        timeout=60,
        what="ranges changed",
    )
    assert refused(world.outside, lb) == {"tcp": True, "udp": True}
    assert refused(world.host, lb) == {"tcp": True, "udp": True}
    assert ask(world.other, lb, 80)[0] == "web-1"
    assert ask(world.outside, NODE_LAN, 30080)[0] == "web-1"
    assert ask(world.outside, "203.0.113.10", 80)[0] == "web-1"
    assert world.node.ipvsadm()[f"{lb}:80/TCP"].real_servers  # IPVS itself is unchanged

    # No ranges: open to all again.
    world.write("web.yaml", svc("web", 0, False), *slices("web"))
    wait_for(
        lambda: (
            "198.51.100.10"
            not in sh("nft", "list", "set", "inet", "ipvsctl", "firewall4", netns=world.node.name)
        ),
        timeout=60,
        what="open again",
    )
    assert ask(world.outside, lb, 80)[0] == "web-1"
    assert ask(world.outside, lb, 53, "udp")[0] == "web-1"


# --- the virtual-IP port filter ------------------------------------------------------------
def icmp_echo(netns: Any, address: str, timeout: float = 3.0) -> bool:
    """One ICMP echo (no `ping` binary in every lab): answered?"""
    s = netns.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    try:
        s.settimeout(timeout)
        body = struct.pack("!HH", 0x1234, 1) + b"ipvsctl"
        head = struct.pack("!BBH", 8, 0, 0) + body
        padded = head + b"\0" * (len(head) % 2)
        total = sum(struct.unpack(f"!{len(padded) // 2}H", padded))
        while total >> 16:
            total = (total & 0xFFFF) + (total >> 16)
        s.sendto(struct.pack("!BBH", 8, 0, ~total & 0xFFFF) + body, (address, 0))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            data, peer = s.recvfrom(2048)
            ihl = (data[0] & 0x0F) * 4
            if peer[0] == address and data[ihl] == 0:  # echo reply
                return True
        return False
    except TimeoutError:
        return False
    finally:
        s.close()


def tcp_refused(client: Pod | Client, address: str, port: int) -> bool:
    try:
        client.connect(address, port, timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


def test_port_filter_hides_node_listeners_behind_service_addresses(world: World) -> None:
    """kube-proxy's KUBE-IPVS-FILTER: a listener on the node (think sshd, the kubelet) at a
    port that is no Service port answers on the node's addresses, never through a ClusterIP,
    external IP or LB IP, whoever asks; the Service ports keep working."""
    node_listener = SimpleNamespace(netns=world.node.netns, name="node-sshd")
    servers = [_Server(node_listener, proto, 2222) for proto in ("tcp", "udp")]  # type: ignore[arg-type]
    try:
        # on the node's own address it is reachable: node addresses are not filtered
        assert ask(world.outside, NODE_LAN, 2222)[0] == "node-sshd"
        assert ask(world.outside, NODE_LAN, 2222, "udp")[0] == "node-sshd"
        assert ask(world.outside, NODE_LAN6, 2222)[0] == "node-sshd"
        clients: list[tuple[str, Pod | Client]] = [
            ("pod", world.other),
            ("outside", world.outside),
            ("node", world.host),
        ]
        for who, client in clients:
            for vip in ("10.96.0.10", "fd96::10", "198.51.100.10", "203.0.113.10"):
                assert tcp_refused(client, vip, 2222), f"{who} reached the node via {vip}"
                assert client.udp(vip, 2222, timeout=1) is None, f"{who} udp via {vip}"
                assert ask(client, vip, 80)[0] == "web-1", f"{who} -> {vip}:80"
                assert ask(client, vip, 53, "udp")[0] == "web-1", f"{who} -> {vip}:53/udp"
        # the load-balancer IP's healthCheckNodePort is let through (clouds probe it there)
        assert http_get(world.outside, "198.51.100.11", HC_PORT)[0] == 200
        assert icmp_echo(world.outside.netns, "10.96.0.10")  # ICMP is not filtered
        filter_sets = sh("nft", "list", "set", "inet", "ipvsctl", "vips4", netns=world.node.name)
        assert "10.96.0.10" in filter_sets and NODE_LAN not in filter_sets
    finally:
        for server in servers:
            server.close()


# --- healthCheckNodePort --------------------------------------------------------------------
def http_get(client: Pod, address: str, port: int) -> tuple[int, dict[str, Any]]:
    s = client.netns.socket(
        socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_STREAM
    )
    s.settimeout(20)
    try:
        s.connect((address, port))
        s.sendall(f"GET /healthz HTTP/1.1\r\nHost: {address}\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(4096):
            data += chunk
    finally:
        s.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def test_health_check_node_port_answers_with_local_endpoints(world: World) -> None:
    expect = {"service": {"namespace": "default", "name": "local"}, "serviceProxyHealthy": True}
    assert http_get(world.outside, NODE_LAN, HC_PORT) == (200, {**expect, "localEndpoints": 1})
    assert http_get(world.outside, NODE_LAN6, HC_PORT)[0] == 200

    world.write("local.yaml", svc("local", 1, True), *slices("local", ready=False))
    t0 = time.monotonic()
    wait_for(lambda: http_get(world.outside, NODE_LAN, HC_PORT)[0] == 503, timeout=60, what="503")
    timing("endpoint_not_ready_to_health_503_s", t0)
    assert http_get(world.outside, NODE_LAN, HC_PORT) == (503, {**expect, "localEndpoints": 0})

    world.write("local.yaml", svc("local", 1, True), *slices("local", node="node-b"))
    time.sleep(1)
    assert http_get(world.outside, NODE_LAN, HC_PORT)[1]["localEndpoints"] == 0

    world.write("local.yaml", svc("local", 1, True), *slices("local"))
    wait_for(
        lambda: http_get(world.outside, NODE_LAN, HC_PORT)[0] == 200, timeout=60, what="200 again"
    )

    (world.manifests / "local.yaml").unlink()  # the Service goes: so does its port

    def closed() -> bool:
        try:
            http_get(world.outside, NODE_LAN, HC_PORT)
        except ConnectionRefusedError:
            return True
        return False

    wait_for(closed, timeout=60, what="port closed")
    assert world.daemon.part(HealthServer).ports() == []


# --- a deleted Service's virtual servers drain -------------------------------------
def diagnose(world: World, what: object) -> str:
    """The kernel's and the daemon's view, for a failure's message (and the lab's out dir)."""
    node = world.node
    parts = [
        f"{what}",
        node.run("ipvsadm", "-Ln", check=False),
        node.run("ipvsadm", "-Lnc", check=False),
        node.run("conntrack", "-L", "-p", "tcp", check=False),
        node.run("ip", "-o", "addr", "show", "dev", "kube-ipvs0", check=False),
        json.dumps(world.daemon.status().get("drain_queue"), indent=1),
    ]
    text = "\n---\n".join(parts)
    out = os.environ.get("IPVSCTL_LAB_OUT")
    if out:
        with open(os.path.join(out, "vs-drain-diagnosis.txt"), "w") as f:
            f.write(text)
    return text


def refusal(client: Pod | Client, address: str, port: int) -> tuple[str, float]:
    """What a new TCP connection meets, and how fast: the exception's name ("connected"
    if it was answered) and the seconds it took."""
    t0 = time.monotonic()
    try:
        client.connect(address, port, timeout=20).close()
        what = "connected"
    except OSError as exc:
        what = type(exc).__name__
    return what, round(time.monotonic() - t0, 3)


def test_a_deleted_services_connections_survive_and_a_recreated_one_serves_new_ones(
    world: World,
) -> None:
    node, gone_vs, lb, external = world.node, "10.96.0.12:80/TCP", "198.51.100.12", "203.0.113.12"
    world.write("gone.yaml", svc("gone", 2, False), *slices("gone"))
    wait_for(
        lambda: gone_vs in node.ipvsadm() and f"{lb} tcp 80" in world.elements(),
        timeout=60,
        what="the Service programmed",
    )
    held = {
        "pod -> ClusterIP": world.other.connect("10.96.0.12", 80),
        "outside -> LB IP": world.outside.connect(lb, 80),
        "outside -> NodePort": world.outside.connect(NODE_LAN, 30082),
        "host -> external IP": world.host.connect(external, 80),
    }
    assert all(c.pod.startswith("web-1") for c in held.values())
    assert all(c.echo("before the deletion") for c in held.values())

    t0 = time.monotonic()
    (world.manifests / "gone.yaml").unlink()  # the Service is deleted
    wait_for(
        lambda: all(r.weight == 0 for r in node.ipvsadm()[gone_vs].real_servers.values()),
        timeout=60,
        what="weight 0",
    )
    timing("service_deleted_to_weight_0_s", t0)
    # its nftables elements stay while it drains (the port filter covers the bound address)
    assert f"{lb} tcp 80" in world.elements() and f"{NODE_LAN} tcp 30082" in world.elements()
    echoed = {k: c.echo("after the deletion") for k, c in held.items()}
    assert echoed == dict.fromkeys(held, True), diagnose(world, echoed)
    assert {"10.96.0.12", lb, external} <= node.interface_addresses()  # still bound
    assert "10.96.0.12:53/UDP" not in node.ipvsadm()  # UDP: at once, as its real servers
    # A new connection fails at once (CONTRACT.md "Draining"; NOTES.md §7: ICMP port
    # unreachable): recorded per path in the timings file.
    seen = {
        "pod -> ClusterIP": refusal(world.other, "10.96.0.12", 80),
        "outside -> LB IP": refusal(world.outside, lb, 80),
        "outside -> NodePort": refusal(world.outside, NODE_LAN, 30082),
    }
    TIMINGS["deleted_service_new_connection"] = {k: list(v) for k, v in seen.items()}
    timing("deleted_service_checked_s", t0)
    assert all(what == "ConnectionRefusedError" and took < 5 for what, took in seen.values()), seen

    # Created again with a new pod: it takes the virtual servers over in place.
    web2 = node.make_pod("10.244.0.31", name="web-2", tcp=())
    netkit.serve_peers(web2, tcp=(8080,))
    again = endpoint_slice(
        "gone", [endpoint(web2.ip, pod="web-2")], name="gone-v4", ports=SLICE_PORTS
    )
    world.write("gone.yaml", svc("gone", 2, False), again)

    def taken_over() -> bool:
        rss = node.ipvsadm()[gone_vs].real_servers
        return rss.get(f"{web2.ip}:8080") is not None and rss[f"{web2.ip}:8080"].weight == 1

    wait_for(taken_over, timeout=60, what="the new endpoint at weight 1")
    assert node.ipvsadm()[gone_vs].real_servers[f"{WEB1}:8080"].weight == 0  # still draining
    assert ask(world.other, "10.96.0.12", 80)[0] == "web-2"
    assert ask(world.outside, lb, 80)[0] == "web-2"
    assert ask(world.outside, NODE_LAN, 30082)[0] == "web-2"
    assert {k: c.echo("after the re-creation") for k, c in held.items()} == dict.fromkeys(
        held, True
    )
    status = world.daemon.status()
    drained = [
        e
        for e in status["drain_queue"]
        if (e["vip"], e["vport"], e["address"]) == ("10.96.0.12", 80, WEB1)
    ]
    # The slices' deletion comes first in the same poll and may be applied before the
    # Service's (or both in one sync): a real server already draining because its endpoint
    # left keeps that reason (and the earlier bound).
    assert drained and drained[0]["reason"] in ("vs_removed", "removed"), drained

    for c in held.values():  # the old connections end: the old real server goes, not the VS
        c.abort()
    wait_for(
        lambda: f"{WEB1}:8080" not in node.ipvsadm()[gone_vs].real_servers,
        timeout=120,
        what="the old real server drained",
    )
    assert ask(world.other, "10.96.0.12", 80)[0] == "web-2"

    (world.manifests / "gone.yaml").unlink()  # and gone for good: no connection holds it
    wait_for(lambda: gone_vs not in node.ipvsadm(), timeout=120, what="drained and deleted")
    wait_for(lambda: f"{lb} tcp 80" not in world.elements(), timeout=60, what="elements gone")
    wait_for(lambda: "10.96.0.12" not in node.interface_addresses(), timeout=60, what="unbound")
    web2.close()


# --- cleanup ----------------------------------------------------------------------------------
def test_cleanup_leaves_no_ipvsctl_virtual_server_address_or_table(world: World) -> None:
    node = world.node
    world.daemon.shutdown()  # (the fixture's own shutdown then finds nothing running)
    assert node.ipvsadm()
    assert node.interface_addresses()
    foreign = VirtualServer(ServiceKey(Protocol.TCP, "10.1.2.3", 80))  # not ipvsctl's
    node.kernel.add_virtual_server(foreign, bind_address=False)
    # another tool's VIP on kube-ipvs0, in kube-proxy's ipvs.excludeCIDRs: never touched
    excluded = VirtualServer(ServiceKey(Protocol.TCP, "10.96.200.1", 443))
    node.kernel.add_virtual_server(excluded, bind_address=True)
    config = world.state.parent / "kube-proxy.conf"
    config.write_text(
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
        "mode: ipvs\nipvs:\n  excludeCIDRs: [10.96.200.0/24]\n"
    )
    ipvsctl = str(Path(__file__).resolve().parents[2] / ".venv" / "bin" / "ipvsctl")
    common = ["--node-ip", NODE_LAN, "--node-ip", NODE_LAN6, "--state-dir", str(world.state)]
    t0 = time.monotonic()
    out = sh(
        "ip", "netns", "exec", node.name, ipvsctl, "cleanup", "--config", str(config), *common,
        timeout=600,
    )  # fmt: skip
    timing("ipvsctl_cleanup_process_s", t0)
    assert "deleted nftables table inet ipvsctl" in out
    assert "left interface kube-ipvs0" in out, out
    assert sorted(node.ipvsadm()) == ["10.1.2.3:80/TCP", "10.96.200.1:443/TCP"]
    assert node.interface_addresses() == {"10.96.200.1"}
    assert "table inet ipvsctl" not in node.run("nft", "list", "tables").splitlines()
    assert not (world.state / "drain-queue.json").exists()
    # without the file the excluded address is ipvsctl's by the rule: it goes, and the interface
    out = sh("ip", "netns", "exec", node.name, ipvsctl, "cleanup", *common, timeout=600)
    assert "deleted interface kube-ipvs0 (addresses: 10.96.200.1)" in out, out
    assert list(node.ipvsadm()) == ["10.1.2.3:80/TCP"]
    assert "kube-ipvs0" not in node.run("ip", "-o", "link", "show")
    again = sh(
        "ip",
        "netns",
        "exec",
        node.name,
        ipvsctl,
        "cleanup",
        "--node-ip",
        NODE_LAN,
        "--state-dir",
        str(world.state),
        timeout=600,
    )
    assert "nothing to remove" in again
    assert list(node.ipvsadm()) == ["10.1.2.3:80/TCP"]

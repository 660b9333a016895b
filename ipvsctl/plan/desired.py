"""What one Service asks of this node (CONTRACT.md "What becomes a virtual server").

Pure and deterministic: the same Service, slices and node always give the same value.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Collection, Iterable

from ipvsctl.model import (
    DesiredService,
    DesiredVirtualServer,
    EndpointInfo,
    NodeContext,
    Protocol,
    RealServerKey,
    ServiceKey,
    VirtualServer,
    VirtualServerKind,
    family_of,
)
from ipvsctl.model.ipvs import SCHED_FLAG_2
from ipvsctl.model.keys import real_server_order
from ipvsctl.model.objects import ServiceInfo, SliceInfo
from ipvsctl.plan.guard import refused_address, too_many
from ipvsctl.plan.topology import Topology, by_topology


def binds_address(kind: VirtualServerKind, address: str, node_ips: Collection[str]) -> bool:
    """Whether the address goes on the dummy interface: not a node IP (NodePorts), and, as
    kube-proxy's shouldBind, not an external or LB IP that is already one of the node's
    addresses (on another interface: adding and later removing it here would disturb the
    node's own address)."""
    return kind.binds_address and address not in node_ips


def _rank(ep: EndpointInfo) -> tuple[bool, bool, bool]:
    return (ep.ready, ep.serving, not ep.terminating)


# (family, port name, protocol) -> the slices' ports of that name, as (slice, port number)
SlicePorts = dict[tuple[int | None, str, Protocol], list[tuple[SliceInfo, int]]]


def slice_ports(slices: Iterable[SliceInfo]) -> SlicePorts:
    """The slices' ports by what a Service port matches them on, in slice order: one pass,
    so that a Service of P ports over slices of P ports costs O(P), not O(P x P) (1,024
    ports: 0.5 s a build, under the loop lock, at every change of a tenant's slice)."""
    found: SlicePorts = {}
    for sl in slices:
        for p in sl.ports:
            found.setdefault((sl.family, p.name, p.protocol), []).append((sl, p.port))
    return found


def collect_endpoints(
    matches: Iterable[tuple[SliceInfo, int]],
) -> dict[RealServerKey, EndpointInfo]:
    """Endpoints of one Service port and family (its `slice_ports` entry); an address:port
    in several slices counts once, with its best conditions (slices are read in name
    order, so this is stable)."""
    found: dict[RealServerKey, EndpointInfo] = {}
    for sl, port in matches:
        for ep in sl.endpoints:
            key = RealServerKey(ep.address, port)
            old = found.get(key)
            if old is None or _rank(ep) > _rank(old):
                found[key] = ep
    return found


def select_endpoints(
    endpoints: dict[RealServerKey, EndpointInfo],
    local_only: bool,
    node_name: str,
    topology: Topology | None = None,
) -> frozenset[RealServerKey]:
    """kube-proxy's CategorizeEndpoints: the ready ones; if none is ready, those serving and
    terminating (KEP-1669), so a Service whose pods are all terminating still answers.
    With `topology`, traffic policy Cluster narrows the ready ones by hints (plan.topology)."""
    if local_only:
        endpoints = {k: e for k, e in endpoints.items() if e.node_name == node_name}
    ready = frozenset(k for k, e in endpoints.items() if e.ready)
    if ready:
        return by_topology(ready, endpoints, topology) if topology and not local_only else ready
    return frozenset(k for k, e in endpoints.items() if e.serving and e.terminating)


def sorted_real_servers(real_servers: Iterable[RealServerKey]) -> tuple[RealServerKey, ...]:
    """`DesiredVirtualServer.real_servers`: in RealServerKey's order, sorted by a tuple key
    (compared in C, not by the dataclass's `__lt__`)."""
    return tuple(sorted(real_servers, key=real_server_order))


def source_ranges(
    ranges: tuple[str, ...] | None, lb_ip: str, node_ips: tuple[str, ...]
) -> tuple[str, ...] | None:
    """Who may open connections to a load-balancer IP: the Service's ranges of its family
    (None: everyone). As kube-proxy, the node itself may too when a range holds one of its
    addresses: the node reaches a local IP with that IP as its source address."""
    if ranges is None:
        return None
    family = family_of(lb_ip)
    nets = [n for n in map(ipaddress.ip_network, ranges) if n.version == family]
    allowed = [n.compressed for n in nets]
    if any(
        ipaddress.ip_address(ip) in n for n in nets for ip in node_ips if family_of(ip) == family
    ):
        allowed.append(ipaddress.ip_network(lb_ip).compressed)
    return tuple(allowed)


def build_desired_service(
    svc: ServiceInfo,
    slices: Iterable[SliceInfo],
    node: NodeContext,
    refused: list[str] | None = None,
) -> DesiredService:
    """The Service's virtual servers on this node. What Node safety refuses (plan/guard.py)
    is left out and said in `refused`: the whole Service when it would make too many."""
    slices = list(slices)
    endpoints_meta: dict[str, EndpointInfo] = {}
    for sl in slices:
        for ep in sl.endpoints:
            old = endpoints_meta.get(ep.address)
            if old is None or (ep.ready, not ep.terminating) > (old.ready, not old.terminating):
                endpoints_meta[ep.address] = ep

    if svc.type == "ExternalName":
        return DesiredService(
            svc.ref, {}, svc.drain_timeout, endpoints_meta, traffic_metrics=svc.traffic_metrics
        )
    too_many_reason = too_many(svc, node)
    if too_many_reason is not None:  # before building anything: the count is O(ports)
        if refused is not None:
            refused.append(too_many_reason)
        return DesiredService(
            svc.ref, {}, svc.drain_timeout, endpoints_meta, traffic_metrics=svc.traffic_metrics
        )

    scheduler = svc.scheduler or node.default_scheduler
    sched_flags = svc.sched_flags
    if sched_flags is None:
        # As kube-proxy: mh hashes on the source port too (mh-port), so that one client's
        # connections spread over the real servers.
        sched_flags = SCHED_FLAG_2 if scheduler == "mh" else 0
    hinted = svc.topology_hints and any(sl.has_hints for sl in slices)
    topo = Topology(node.node_name, node.zone) if hinted else None
    wanted: dict[ServiceKey, DesiredVirtualServer] = {}

    def add(
        kind: VirtualServerKind,
        address: str,
        port: int,
        proto: Protocol,
        port_name: str,
        real_servers: dict[int, tuple[RealServerKey, ...]],
    ) -> None:
        key = ServiceKey(proto, address, port)
        if key in wanted:  # e.g. an external IP equal to the cluster IP: first one wins
            return
        why = refused_address(kind, address, port, node)
        if why is not None:
            if refused is not None:
                refused.append(why)
            return
        vs = VirtualServer(key, scheduler, svc.affinity_timeout, sched_flags)
        local = svc.internal_local if kind is VirtualServerKind.CLUSTER_IP else svc.external_local
        ranges = (
            source_ranges(svc.source_ranges, address, node.node_ips)
            if kind is VirtualServerKind.LOAD_BALANCER
            else None
        )
        wanted[key] = DesiredVirtualServer(
            vs,
            kind,
            port_name,
            real_servers.get(family_of(address), ()),
            local,
            ranges,
        )

    has_external = bool(svc.external_ips) or svc.type in ("NodePort", "LoadBalancer")
    by_port = slice_ports(slices)
    for p in svc.ports:
        cluster: dict[int, tuple[RealServerKey, ...]] = {}
        external: dict[int, tuple[RealServerKey, ...]] = {}
        for family in (4, 6):
            eps = collect_endpoints(by_port.get((family, p.name, p.protocol), ()))
            selected = select_endpoints(eps, svc.internal_local, node.node_name, topo)
            cluster[family] = sorted_real_servers(selected)
            # Most Services have no external addresses, and most that do share the cluster
            # policy: one tuple then serves both (memory at 100,000 endpoints).
            if not has_external:
                continue
            same = svc.external_local == svc.internal_local
            ext = (
                selected
                if same
                else select_endpoints(eps, svc.external_local, node.node_name, topo)
            )
            if svc.external_local and not ext:
                # No local endpoint: the cluster-wide ones, as kube-proxy's IPVS mode
                # (kubernetes#97081), so pods and the host here still reach their own load
                # balancer; the healthCheckNodePort's 503 keeps outside traffic away.
                ext = select_endpoints(eps, False, node.node_name, topo)
            external[family] = cluster[family] if ext is selected else sorted_real_servers(ext)
        for ip in svc.cluster_ips:
            add(VirtualServerKind.CLUSTER_IP, ip, p.port, p.protocol, p.name, cluster)
        for ip in svc.external_ips:
            add(VirtualServerKind.EXTERNAL_IP, ip, p.port, p.protocol, p.name, external)
        if svc.type == "LoadBalancer":
            for ip in svc.load_balancer_ips:
                add(VirtualServerKind.LOAD_BALANCER, ip, p.port, p.protocol, p.name, external)
        if svc.type in ("NodePort", "LoadBalancer") and p.node_port:
            for ip in node.node_ips:
                if family_of(ip) in svc.families:
                    add(VirtualServerKind.NODE_PORT, ip, p.node_port, p.protocol, p.name, external)

    hc_port = (
        svc.health_check_node_port if svc.type == "LoadBalancer" and svc.external_local else None
    )
    return DesiredService(
        svc.ref,
        dict(sorted(wanted.items())),
        svc.drain_timeout,
        endpoints_meta,
        hc_port,
        traffic_metrics=svc.traffic_metrics,
    )

"""Which virtual servers are ipvsctl's (CONTRACT: ipvsctl never touches another tool's).
Pure. The daemon asks it for adoption and the drift audit, `ipvsctl cleanup` for what to
remove: one rule, so the two can never disagree."""

from __future__ import annotations

from collections.abc import Container, Iterable

from ipvsctl.model import ServiceKey, ServiceRef
from ipvsctl.model.cidrs import in_any
from ipvsctl.model.portrange import DEFAULT_NODE_PORT_RANGE


def is_owned(
    key: ServiceKey,
    bound: Container[str],
    node_ips: Container[str],
    node_ports: range = DEFAULT_NODE_PORT_RANGE,
    excluded: tuple[str, ...] = (),
) -> bool:
    """On an address of ipvsctl's dummy interface (`bound`), or a NodePort (a port in
    --service-node-port-range) on one of the node's IPs; never on an address in `excluded`
    (kube-proxy's `ipvs.excludeCIDRs`: another tool's, even on kube-ipvs0)."""
    if excluded and in_any(key.address, excluded):
        return False
    return key.address in bound or (key.port in node_ports and key.address in node_ips)


def may_take_over(key: ServiceKey, owned: bool, proxy_addresses: Container[str]) -> bool:
    """Whether an existing virtual server a Service wants may be taken over in place: ours,
    or another Kubernetes service proxy's (its address on kube-ipvs0 or kube-router's
    kube-dummy-if: `proxy_addresses`; a node address at a NodePort is already ours). Anyone
    else's (keepalived, an operator's ipvsadm) is left alone and the Service skips it."""
    return owned or key.address in proxy_addresses


def owned_virtual_servers(
    virtual_servers: Iterable[ServiceKey],
    bound: Iterable[str],
    node_ips: Iterable[str],
    node_ports: range = DEFAULT_NODE_PORT_RANGE,
    excluded: tuple[str, ...] = (),
) -> list[ServiceKey]:
    """The owned ones of `virtual_servers`, sorted."""
    bound_set, ips = set(bound), set(node_ips)
    return sorted(k for k in virtual_servers if is_owned(k, bound_set, ips, node_ports, excluded))


# A namespace no Kubernetes object has (namespaces are DNS labels): an orphan's stand-in
# Service can never be mistaken for a real one, and still reads as namespace/name.
ORPHAN_NAMESPACE = "(unknown)"


def orphan_service(key: ServiceKey) -> ServiceRef:
    """The stand-in Service of an orphan: an owned virtual server that no Service wants and
    whose Service is not known (deleted while the daemon was down, or the state file
    lost). It drains as a deleted Service's under this name, one per virtual server; a
    Service that claims the key takes it over in place, as any draining one."""
    return ServiceRef(ORPHAN_NAMESPACE, str(key))


def is_orphan_service(ref: ServiceRef) -> bool:
    return ref.namespace == ORPHAN_NAMESPACE

"""Desired state: what a node should program for one Service."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from ipvsctl.model.ipvs import VirtualServer
from ipvsctl.model.keys import PodRef, RealServerKey, ServiceKey, ServiceRef
from ipvsctl.model.portrange import DEFAULT_NODE_PORT_RANGE

# --max-table-entries: sized in docs/reference.md ("Node safety")
DEFAULT_MAX_TABLE_ENTRIES = 500_000


class VirtualServerKind(StrEnum):
    CLUSTER_IP = "ClusterIP"
    EXTERNAL_IP = "ExternalIP"
    LOAD_BALANCER = "LoadBalancer"
    NODE_PORT = "NodePort"

    @property
    def binds_address(self) -> bool:
        """Node IPs are the node's own; every other address goes on the dummy interface."""
        return self is not VirtualServerKind.NODE_PORT


@dataclass(frozen=True, slots=True)
class NodeContext:
    """What desired state depends on besides the objects: this node."""

    node_name: str
    node_ips: tuple[str, ...] = ()
    default_scheduler: str = "rr"
    zone: str | None = None  # label topology.kubernetes.io/zone of this node's Node
    # --service-proxy-name: serve only Services labelled with it (None: only unlabelled ones)
    service_proxy_name: str | None = None
    # Node safety (CONTRACT.md): the cluster's NodePort range (a node address at any other
    # port is never a virtual server), the API server's own addresses (never an external or
    # load-balancer IP), the most virtual servers one Service may make, and the most
    # entries (virtual plus real servers) all of them may (plan/capacity.py).
    node_port_range: range = DEFAULT_NODE_PORT_RANGE
    apiserver_ips: frozenset[str] = frozenset()
    max_virtual_servers: int = 1024
    max_table_entries: int = DEFAULT_MAX_TABLE_ENTRIES
    # Every address of the node (all interfaces but the proxies' dummy ones), whatever
    # `node_ips` (--node-ip, nodePortAddresses) chose for NodePorts: Node safety counts
    # them all (docker0's, a second NIC's). Followed while the daemon runs.
    host_ips: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class EndpointHints:
    """An endpoint's topology hints (`hints.forZones[].name`, `hints.forNodes[].name`)."""

    zones: frozenset[str] = frozenset()
    nodes: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class EndpointInfo:
    """One endpoint of an EndpointSlice as ipvsctl reads it (its first address). The same
    object serves the desired state and draining (its pod and conditions): at 100,000
    endpoints a second copy per endpoint costs megabytes.

    Its targetRef is kept as three fields, not a PodRef (`pod` makes one when asked): a
    PodRef per endpoint was 56 bytes more, 5.6 MB at 100,000 endpoints, all of it alive
    while the list is parsed. Equal fields, equal pods: equality is unchanged."""

    address: str
    ready: bool = True
    serving: bool = True
    terminating: bool = False
    node_name: str | None = None
    pod_namespace: str | None = None  # the targetRef Pod's (None: no Pod targetRef)
    pod_name: str | None = None
    pod_uid: str = ""  # "" unknown, as PodRef.uid
    hints: EndpointHints | None = None  # None: no (usable) hints

    @property
    def pod(self) -> PodRef | None:
        """The endpoint's Pod (its targetRef), or None."""
        if self.pod_name is None or self.pod_namespace is None:
            return None
        return PodRef(self.pod_namespace, self.pod_name, self.pod_uid)


@dataclass(frozen=True, slots=True)
class DesiredVirtualServer:
    vs: VirtualServer
    kind: VirtualServerKind
    port_name: str
    # Sorted (address, port), RealServerKey's order (plan/desired.py builds every one; the
    # diff walks it as it is), so equal sets compare equal: a tuple is a fifth of a
    # frozenset's size (~140 against ~700 bytes at 10 real servers, one per virtual server).
    real_servers: tuple[RealServerKey, ...] = ()
    local_only: bool = False  # traffic policy Local: only this node's endpoints, no SNAT
    # loadBalancerSourceRanges of a load-balancer IP, this family's (None: open to all)
    source_ranges: tuple[str, ...] | None = None

    @property
    def key(self) -> ServiceKey:
        return self.vs.key


@dataclass(frozen=True, slots=True)
class DesiredService:
    """Everything one Service asks of this node; compared by value to skip no-op events."""

    ref: ServiceRef
    virtual_servers: Mapping[ServiceKey, DesiredVirtualServer] = field(default_factory=dict)
    drain_timeout: float | None = None  # ipvsctl.io/drain-timeout, seconds
    endpoints: Mapping[str, EndpointInfo] = field(default_factory=dict)  # by address
    health_check_node_port: int | None = None  # serve kube-proxy's local-endpoints check
    traffic_metrics: bool = False  # opted in to per-Service traffic metrics (annotation)

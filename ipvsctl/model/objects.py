"""Kubernetes objects as ipvsctl keeps them: only the fields it reads, frozen, so two
versions that differ only in ignored fields compare equal. Produced by source/convert.py
(parsing and validation), read by plan/ (desired state). No I/O."""

from __future__ import annotations

from dataclasses import dataclass, field

from ipvsctl.model.desired import EndpointInfo
from ipvsctl.model.keys import Protocol, ServiceRef


@dataclass(frozen=True, slots=True)
class ServicePortInfo:
    name: str
    protocol: Protocol
    port: int
    node_port: int | None = None


@dataclass(frozen=True, slots=True)
class ServiceInfo:
    ref: ServiceRef
    type: str = "ClusterIP"
    cluster_ips: tuple[str, ...] = ()
    families: frozenset[int] = frozenset({4, 6})  # address families the Service serves
    external_ips: tuple[str, ...] = ()
    load_balancer_ips: tuple[str, ...] = ()
    ports: tuple[ServicePortInfo, ...] = ()
    affinity_timeout: int = 0  # 0 = no ClientIP affinity
    internal_local: bool = False
    external_local: bool = False
    scheduler: str | None = None  # from annotations
    sched_flags: int | None = None  # from annotations (None: the scheduler's default)
    drain_timeout: float | None = None  # from annotation
    traffic_metrics: bool = False  # ipvsctl.io/metrics: "true"
    health_check_node_port: int | None = None  # LoadBalancer with externalTrafficPolicy Local
    # spec.loadBalancerSourceRanges, normalized (None: not restricted). Empty when every
    # listed range was invalid: closed rather than open to all.
    source_ranges: tuple[str, ...] | None = None
    topology_hints: bool = True  # False: unknown spec.trafficDistribution, hints ignored
    # metadata.creationTimestamp, epoch seconds: the older of two Services claiming one
    # virtual server keeps it (plan/conflicts.py). None: unknown (ranks after any time).
    created: float | None = None


@dataclass(frozen=True, slots=True)
class SlicePortInfo:
    name: str
    protocol: Protocol
    port: int


@dataclass(frozen=True, slots=True)
class SliceInfo:
    namespace: str
    name: str
    service_name: str | None
    family: int | None  # None for FQDN slices, which ipvsctl ignores
    ports: tuple[SlicePortInfo, ...] = ()
    endpoints: tuple[EndpointInfo, ...] = ()
    has_hints: bool = False  # an endpoint carries topology hints (a zone change touches it)
    # endpoints.kubernetes.io/last-change-trigger-time (wall seconds; None: absent or
    # malformed, then `trigger_malformed`): for the network programming SLI only, so not
    # part of equality (a new time alone programs nothing).
    trigger_time: float | None = field(default=None, compare=False)
    trigger_malformed: bool = field(default=False, compare=False)

    @property
    def service(self) -> ServiceRef | None:
        return ServiceRef(self.namespace, self.service_name) if self.service_name else None

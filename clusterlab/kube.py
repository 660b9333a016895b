"""What the control plane publishes, as pure functions of the lab's state: Services, the
EndpointSlice controller's slice for a Service (conditions and topology hints as the real
controller writes them), Pods and Nodes. control.py calls these and hands the objects to the
fake API server; the unit tests check them against the rules they follow.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from devkit.fakeapi import objects

JSON = dict[str, Any]
NAMESPACE = "default"
PREFER_CLOSE = "PreferClose"


@dataclass(frozen=True)
class PortSpec:
    name: str
    port: int
    target_port: int
    protocol: str = "TCP"
    node_port: int | None = None


@dataclass(frozen=True)
class ServiceSpec:
    """A Service selecting the pods of one Deployment (`selector`)."""

    name: str
    selector: str
    cluster_ip: str
    ports: tuple[PortSpec, ...]
    type: str = "ClusterIP"
    traffic_distribution: str | None = None
    annotations: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class EndpointState:
    """One pod as the EndpointSlice controller sees it."""

    pod: str
    uid: str
    ip: str
    node: str
    zone: str
    ready: bool  # its readiness probe passes and it is not terminating
    serving: bool  # its readiness probe passes (terminating or not)
    terminating: bool  # deletionTimestamp set


@dataclass(frozen=True)
class NodeSpec:
    name: str
    ip: str
    zone: str
    pod_cidr: str
    taints: tuple[tuple[str, str], ...] = field(default=())  # (key, effect)


def service_object(spec: ServiceSpec) -> JSON:
    protocols = {p.protocol for p in spec.ports}
    obj = objects.service(
        spec.name,
        NAMESPACE,
        cluster_ip=spec.cluster_ip,
        ports=tuple((p.name, p.port, p.target_port) for p in spec.ports),
        protocol=protocols.pop() if len(protocols) == 1 else "TCP",
        type_=spec.type,
        annotations=dict(spec.annotations),
        selector={"app": spec.selector},
    )
    for port, p in zip(obj["spec"]["ports"], spec.ports, strict=True):
        port["protocol"] = p.protocol
        if p.node_port is not None:
            port["nodePort"] = p.node_port
    if spec.type in ("NodePort", "LoadBalancer"):
        obj["spec"]["externalTrafficPolicy"] = "Cluster"
    if spec.traffic_distribution:
        obj["spec"]["trafficDistribution"] = spec.traffic_distribution
    return obj


def slice_name(service: str) -> str:
    return f"{service}-cl4b"


def endpoint_slice(spec: ServiceSpec, endpoints: list[EndpointState]) -> JSON:
    """The Service's one EndpointSlice, as the EndpointSlice controller publishes it:
    terminating pods stay listed (`ready: false`, `serving` from their probe, `terminating:
    true`, KEP-1672) until their Pod object is gone; with `trafficDistribution:
    PreferClose`, every ready endpoint is hinted for its own zone (the controller's
    trafficdist heuristic; endpoints not ready get none)."""
    hinted = spec.traffic_distribution == PREFER_CLOSE
    eps = []
    for e in sorted(endpoints, key=lambda e: e.pod):
        ep = objects.endpoint(
            e.ip,
            ready=e.ready,
            serving=e.serving,
            terminating=e.terminating,
            node=e.node,
            pod=e.pod,
            namespace=NAMESPACE,
            uid=e.uid,
        )
        ep["zone"] = e.zone
        if hinted and e.ready:
            ep["hints"] = {"forZones": [{"name": e.zone}]}
        eps.append(ep)
    return objects.endpoint_slice(
        slice_name(spec.name),
        spec.name,
        eps,
        NAMESPACE,
        ports=tuple((p.name, p.target_port) for p in spec.ports),
        protocol=spec.ports[0].protocol,  # one protocol per Service in the lab
    )


def pod_object(
    name: str,
    uid: str,
    ip: str,
    node: str,
    app: str,
    grace: int,
    deletion_timestamp: str | None = None,
) -> JSON:
    obj = objects.pod(
        name,
        NAMESPACE,
        ip=ip,
        node=node,
        deletion_timestamp=deletion_timestamp,
        grace=grace,
        uid=uid,
    )
    obj["metadata"]["labels"] = {"app": app}
    return obj


def node_object(spec: NodeSpec) -> JSON:
    return objects.node(
        spec.name,
        spec.zone,
        taints=[{"key": k, "effect": e} for k, e in spec.taints],
        address=spec.ip,
        pod_cidr=spec.pod_cidr,
    )

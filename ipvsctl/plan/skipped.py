"""What `ipvsctl plan` read and will not serve, each with why (CONTRACT.md, `plan`'s
`skipped`): Services that make no virtual server (ExternalName, headless, no ports,
refused, every address another Service's), EndpointSlices with no Service to serve
(none named, not in the input, itself skipped, FQDN), and what was set aside before
parsing (another proxy's or headless-labelled Services, refused objects, other Nodes,
other kinds, documents that are no object). Pure: the caller says what it set aside.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ipvsctl.model import ServiceRef
from ipvsctl.model.objects import ServiceInfo, SliceInfo

EXTERNAL_NAME = "type ExternalName: a DNS name (CNAME), no virtual server"
HEADLESS = "headless (clusterIP: None): DNS gives the pods' addresses, no virtual server"
NO_PORTS = "no ports"
NO_VIRTUAL_SERVER = "no virtual server on this node"
NO_CLUSTER_IP = "no cluster IP yet (the API server allocates one) and no other address"
FQDN_SLICE = "addressType FQDN: no service proxy uses it"
NO_SERVICE_LABEL = "no kubernetes.io/service-name label: no Service to serve"
OTHER_KIND = "kind {kind}: not read by ipvsctl (Services, EndpointSlices and Nodes are)"
NOT_AN_OBJECT = "not a Kubernetes object"
OTHER_NODE = "another node's Node (this node is {node})"


@dataclass(frozen=True, slots=True)
class Skipped:
    kind: str  # "" for a document that is no object
    namespace: str
    name: str
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "namespace": self.namespace,
            "name": self.name,
            "reason": self.reason,
        }


def service_reason(svc: ServiceInfo, problems: Iterable[str], headless: bool = False) -> str:
    """Why a Service that was read made no virtual server: its type or shape first, else
    what refused or outranked each of its addresses (`problems`, said once each)."""
    if svc.type == "ExternalName":
        return EXTERNAL_NAME
    if headless and not svc.external_ips and svc.type == "ClusterIP":
        return HEADLESS
    if not svc.ports:
        return NO_PORTS
    if not svc.cluster_ips and not svc.external_ips and svc.type == "ClusterIP":
        return NO_CLUSTER_IP
    said = list(dict.fromkeys(problems))
    return "; ".join(said) if said else NO_VIRTUAL_SERVER


def slice_reason(
    sl: SliceInfo, services: Collection[ServiceRef], skipped: Collection[ServiceRef]
) -> str | None:
    """Why a slice gives no real server, None when its Service is served."""
    if sl.family is None:
        return FQDN_SLICE
    if sl.service is None:
        return NO_SERVICE_LABEL
    if sl.service in skipped:
        return f"its Service {sl.service} is skipped"
    if sl.service not in services:
        return f"its Service {sl.service} is not in the input"
    return None


def skipped_objects(
    services: Mapping[ServiceRef, ServiceInfo],
    served: Collection[ServiceRef],
    problems: Mapping[ServiceRef, list[str]],
    slices: Iterable[SliceInfo],
    set_aside: Iterable[Skipped],
    headless: Collection[ServiceRef] = (),
) -> list[Skipped]:
    """Every object read that makes no virtual server, sorted by kind, namespace, name:
    the Services read that serve nothing, the slices of no served Service, and what the
    caller set aside before parsing (Services not proxied, refused objects, other kinds).
    A set-aside Service's slices are skipped as its own."""
    out = list(set_aside)
    unserved = {ref for ref in services if ref not in served}
    out += (
        Skipped(
            "Service",
            ref.namespace,
            ref.name,
            service_reason(services[ref], problems.get(ref, ()), ref in headless),
        )
        for ref in unserved
    )
    skipped = unserved | {ServiceRef(s.namespace, s.name) for s in out if s.kind == "Service"}
    for sl in slices:
        why = slice_reason(sl, services.keys() | skipped, skipped)
        if why is not None:
            out.append(Skipped("EndpointSlice", sl.namespace, sl.name, why))
    return sorted(set(out), key=lambda s: (s.kind, s.namespace, s.name, s.reason))


def counts(skipped: Iterable[Skipped]) -> dict[str, int]:
    """How many of each kind, for the default view's one line."""
    out: dict[str, int] = {}
    for s in skipped:
        out[s.kind or "non-object"] = out.get(s.kind or "non-object", 0) + 1
    return out

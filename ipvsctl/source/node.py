"""This node's own Node object, as ipvsctl reads it. Pure.

Three facts matter: its zone (label `topology.kubernetes.io/zone`, for topology hints), and
whether it is leaving the cluster (`metadata.deletionTimestamp`, or the cluster autoscaler's
`ToBeDeletedByClusterAutoscaler` taint), which kube-proxy's health server (KEP-3836)
reports to cloud load balancers as `nodeEligible: false`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ipvsctl.source.convert import InvalidObject, Parsed
from ipvsctl.source.validate import short

ZONE_LABEL = "topology.kubernetes.io/zone"
TO_BE_DELETED_TAINT = "ToBeDeletedByClusterAutoscaler"


@dataclass(frozen=True, slots=True)
class NodeInfo:
    name: str
    zone: str | None = None
    deleting: bool = False  # metadata.deletionTimestamp is set
    to_be_deleted: bool = False  # tainted ToBeDeletedByClusterAutoscaler
    present: bool = True  # False: the Node was seen, then deleted

    @property
    def eligible(self) -> bool:
        """kube-proxy's NodeEligible: the Node exists, is not being deleted and carries no
        ToBeDeletedByClusterAutoscaler taint."""
        return self.present and not self.deleting and not self.to_be_deleted


def parse_node(obj: Mapping[str, Any]) -> Parsed[NodeInfo]:
    if not isinstance(obj, Mapping):
        raise InvalidObject("not an object")
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str) or not meta["name"]:
        raise InvalidObject("metadata.name is missing")
    warnings: list[str] = []
    labels = meta.get("labels")
    zone = labels.get(ZONE_LABEL) if isinstance(labels, Mapping) else None
    if zone is not None and (not isinstance(zone, str) or not zone):
        warnings.append(f"label {ZONE_LABEL}: {short(zone)} is not a zone name, ignored")
        zone = None
    spec = obj.get("spec")
    taints = spec.get("taints") if isinstance(spec, Mapping) else None
    if taints is not None and not isinstance(taints, list):
        warnings.append("spec.taints is not a list, ignored")
        taints = None
    tainted = any(
        isinstance(t, Mapping) and t.get("key") == TO_BE_DELETED_TAINT for t in taints or ()
    )
    return Parsed(
        NodeInfo(meta["name"], zone, bool(meta.get("deletionTimestamp")), tainted), tuple(warnings)
    )

"""This node's own Node object, as ipvsctl reads it. Pure.

Its zone (label `topology.kubernetes.io/zone`, for topology hints), and whether it is
leaving the cluster or cannot carry traffic, which kube-proxy's health server (KEP-3836)
reports to cloud load balancers as `nodeEligible: false` and ipvsctl's node drain follows:

- `metadata.deletionTimestamp` set, or the Node deleted;
- a taint whose key is one of `--draining-taints`, whatever its effect (the cluster
  autoscaler's `ToBeDeletedByClusterAutoscaler`, Karpenter's `karpenter.sh/disrupted`);
- the condition `NetworkUnavailable` with status `True` (the node's pod network is not set
  up: kubernetes#134648).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from ipvsctl.source.convert import InvalidObject, Parsed
from ipvsctl.source.validate import short

ZONE_LABEL = "topology.kubernetes.io/zone"
TO_BE_DELETED_TAINT = "ToBeDeletedByClusterAutoscaler"
KARPENTER_DISRUPTED_TAINT = "karpenter.sh/disrupted"
DEFAULT_DRAINING_TAINTS = (TO_BE_DELETED_TAINT, KARPENTER_DISRUPTED_TAINT)
NETWORK_UNAVAILABLE = "NetworkUnavailable"
MAX_TAINTS = 256  # a Node with more is hostile or broken: the first ones are read


@dataclass(frozen=True, slots=True)
class NodeInfo:
    name: str
    zone: str | None = None
    deleting: bool = False  # metadata.deletionTimestamp is set
    taints: frozenset[str] = frozenset()  # the keys of spec.taints
    network_unavailable: bool = False  # condition NetworkUnavailable is True
    present: bool = True  # False: the Node was seen, then deleted


def leaving_reasons(node: NodeInfo | None, draining_taints: Collection[str]) -> tuple[str, ...]:
    """Why this node must take no new load-balancer traffic: `deleted`, `deleting`,
    `taint:KEY` (each draining taint it carries, sorted), `network-unavailable`; empty when
    it may. A Node never seen (None: not readable) may: a missing RBAC rule must not take
    every node out of the cloud load balancers."""
    if node is None:
        return ()
    if not node.present:
        return ("deleted",)
    reasons = ["deleting"] if node.deleting else []
    reasons += [f"taint:{key}" for key in sorted(node.taints.intersection(draining_taints))]
    if node.network_unavailable:
        reasons.append("network-unavailable")
    return tuple(reasons)


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
    taints = _taint_keys(spec.get("taints") if isinstance(spec, Mapping) else None, warnings)
    status = obj.get("status")
    network_unavailable = _network_unavailable(
        status.get("conditions") if isinstance(status, Mapping) else None, warnings
    )
    return Parsed(
        NodeInfo(
            meta["name"],
            zone,
            deleting=bool(meta.get("deletionTimestamp")),
            taints=taints,
            network_unavailable=network_unavailable,
        ),
        tuple(warnings),
    )


def _taint_keys(taints: Any, warnings: list[str]) -> frozenset[str]:
    if taints is None:
        return frozenset()
    if not isinstance(taints, list):
        warnings.append("spec.taints is not a list, ignored")
        return frozenset()
    keys = [t.get("key") for t in taints[:MAX_TAINTS] if isinstance(t, Mapping)]
    bad = len(taints[:MAX_TAINTS]) - sum(isinstance(k, str) and bool(k) for k in keys)
    if bad:
        warnings.append(f"spec.taints: {bad} without a key, ignored")
    if len(taints) > MAX_TAINTS:
        warnings.append(f"spec.taints: {len(taints)} taints, only the first {MAX_TAINTS} read")
    return frozenset(k for k in keys if isinstance(k, str) and k)


def _network_unavailable(conditions: Any, warnings: list[str]) -> bool:
    """Condition NetworkUnavailable is True. Absent, Unknown or False: available (as the
    kubelet and the scheduler read it: only True taints the node)."""
    if conditions is None:
        return False
    if not isinstance(conditions, list):
        warnings.append("status.conditions is not a list, ignored")
        return False
    for c in conditions:
        if isinstance(c, Mapping) and c.get("type") == NETWORK_UNAVAILABLE:
            status = c.get("status")
            if status not in ("True", "False", "Unknown"):
                warnings.append(f"condition {NETWORK_UNAVAILABLE}: status {short(status)}, ignored")
                return False
            return bool(status == "True")
    return False

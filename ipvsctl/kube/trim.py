"""Cut API objects down to the fields ipvsctl reads, before they are emitted.

At 10,000 Services and 100,000 endpoints the full objects (managedFields, last-applied
annotations, statuses, hints) are several times larger than what the engine needs, and every
field that changes without mattering (resourceVersion, managedFields timestamps) would make an
unchanged object look changed. The output carries `kind` and `apiVersion` because list items
from the API server do not.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from typing import Any

from ipvsctl.source.convert import TRIGGER_TIME_ANNOTATION
from ipvsctl.source.events import RawObject

# Annotations and labels that can matter to a service proxy; the rest (kubectl's
# last-applied-configuration, cloud load-balancer settings, ...) is dropped.
SERVICE_ANNOTATION_PREFIXES = ("ipvsctl.io/", "kube-router.io/", "service.kubernetes.io/")
SERVICE_LABEL_PREFIXES = ("service.kubernetes.io/",)  # service-proxy-name, headless

SERVICE_SPEC_FIELDS = (
    "type",
    "clusterIP",
    "clusterIPs",
    "ipFamilies",
    "externalIPs",
    "loadBalancerSourceRanges",
    "ports",
    "sessionAffinity",
    "sessionAffinityConfig",
    "internalTrafficPolicy",
    "externalTrafficPolicy",
    "healthCheckNodePort",
    "trafficDistribution",
)


def _pick(src: Any, keys: Iterable[str]) -> RawObject:
    if not isinstance(src, Mapping):
        return {}
    return {k: src[k] for k in keys if src.get(k) is not None}


def _prefixed(src: Any, prefixes: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(src, Mapping):
        return {}
    return {k: v for k, v in src.items() if isinstance(k, str) and k.startswith(prefixes)}


def _metadata(obj: Mapping[str, Any]) -> tuple[Mapping[str, Any], Any]:
    """(the object's metadata to pick from, what to emit where it is not a mapping): a
    metadata that is a string or a list is passed on as it is, for validation to report
    (the object is skipped there, with its reason), never an error that fails a list."""
    meta = obj.get("metadata") or {}
    if isinstance(meta, Mapping):
        return meta, None
    return {}, meta


def trim_service(obj: Mapping[str, Any]) -> RawObject:
    meta, bad = _metadata(obj)
    # creationTimestamp: the older of two Services claiming one virtual server keeps it
    out_meta = _pick(meta, ("name", "namespace", "uid", "creationTimestamp"))
    annotations = _prefixed(meta.get("annotations"), SERVICE_ANNOTATION_PREFIXES)
    if annotations:
        out_meta["annotations"] = annotations
    labels = _prefixed(meta.get("labels"), SERVICE_LABEL_PREFIXES)
    if labels:
        out_meta["labels"] = labels
    out: RawObject = {
        "kind": "Service",
        "apiVersion": "v1",
        "metadata": out_meta if bad is None else bad,
        "spec": _pick(obj.get("spec"), SERVICE_SPEC_FIELDS),
    }
    status = obj.get("status")
    load_balancer = status.get("loadBalancer") if isinstance(status, Mapping) else None
    if load_balancer:
        out["status"] = {"loadBalancer": load_balancer}
    return out


# Endpoints dominate memory and time at scale (100,000 of them), hence the plain code below:
# repeated values are shared instead of copied per endpoint (node names, namespaces and kinds
# interned; the few distinct `conditions` dicts reused). Safe because emitted objects are
# read-only.
_CONDITIONS: dict[tuple[tuple[str, Any], ...], dict[str, Any]] = {}
_intern = sys.intern


def _shared_conditions(conditions: Any) -> Any:
    if type(conditions) is not dict or len(conditions) > 3:
        return conditions
    try:
        key = tuple(conditions.items())
        shared = _CONDITIONS.get(key)
    except TypeError:  # unhashable values: leave them for validation to report
        return conditions
    if shared is None:
        if len(_CONDITIONS) > 256:  # only ever a handful of legitimate combinations
            return conditions
        shared = _CONDITIONS[key] = dict(key)
    return shared


def _trim_endpoint(ep: Any) -> Any:
    if type(ep) is not dict:
        return ep  # let the engine's validation report it
    out: dict[str, Any] = {}
    v = ep.get("addresses")
    if v is not None:
        out["addresses"] = v
    v = ep.get("conditions")
    if v is not None:
        out["conditions"] = _shared_conditions(v)
    v = ep.get("nodeName")
    if v is not None:
        out["nodeName"] = _intern(v) if type(v) is str else v
    v = ep.get("hints")
    if v is not None:
        out["hints"] = v
    target = ep.get("targetRef")
    if type(target) is dict:
        ref: dict[str, Any] = {}
        v = target.get("kind")
        if v is not None:
            ref["kind"] = _intern(v) if type(v) is str else v
        v = target.get("namespace")
        if v is not None:
            ref["namespace"] = _intern(v) if type(v) is str else v
        v = target.get("name")
        if v is not None:
            ref["name"] = v
        v = target.get("uid")  # two pods of one name (a StatefulSet's) are two endpoints
        if v is not None:
            ref["uid"] = v
        out["targetRef"] = ref
    return out


def trim_endpoint_slice(obj: Mapping[str, Any]) -> RawObject:
    meta, bad = _metadata(obj)
    out_meta = _pick(meta, ("name", "namespace", "labels"))
    # only the trigger time (the network programming SLI); kubectl's last-applied and the
    # rest are dropped
    annotations = _pick(meta.get("annotations"), (TRIGGER_TIME_ANNOTATION,))
    if annotations:
        out_meta["annotations"] = annotations
    out: RawObject = {
        "kind": "EndpointSlice",
        "apiVersion": "discovery.k8s.io/v1",
        "metadata": out_meta if bad is None else bad,
    }
    if obj.get("addressType") is not None:
        out["addressType"] = obj["addressType"]
    if obj.get("ports") is not None:
        out["ports"] = obj["ports"]
    endpoints = obj.get("endpoints")
    if isinstance(endpoints, list):
        out["endpoints"] = [_trim_endpoint(ep) for ep in endpoints]
    elif endpoints is not None:
        out["endpoints"] = endpoints
    return out


NODE_LABELS = ("topology.kubernetes.io/zone",)
NODE_CONDITIONS = ("NetworkUnavailable",)


def trim_node(obj: Mapping[str, Any]) -> RawObject:
    """This node's Node: its zone label, deletionTimestamp, its taints' keys (which ones
    mean "leaving" is `--draining-taints`'s to say) and the NetworkUnavailable condition's
    status. Node status changes every few seconds (heartbeats); trimmed, those updates
    compare equal and cost nothing."""
    meta, bad = _metadata(obj)
    out_meta = _pick(meta, ("name", "deletionTimestamp"))
    labels = meta.get("labels")
    if isinstance(labels, Mapping):
        picked = {k: labels[k] for k in NODE_LABELS if k in labels}
        if picked:
            out_meta["labels"] = picked
    out: RawObject = {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": out_meta if bad is None else bad,
    }
    spec = obj.get("spec")
    taints = spec.get("taints") if isinstance(spec, Mapping) else None
    if isinstance(taints, list):
        kept = [_pick(t, ("key",)) if isinstance(t, Mapping) else t for t in taints]
        if kept:
            out["spec"] = {"taints": kept}
    elif taints is not None:
        out["spec"] = {"taints": taints}  # for validation to report
    status = obj.get("status")
    conditions = status.get("conditions") if isinstance(status, Mapping) else None
    if isinstance(conditions, list):
        kept = [
            _pick(c, ("type", "status"))
            for c in conditions
            if isinstance(c, Mapping) and c.get("type") in NODE_CONDITIONS
        ]
        if kept:
            out["status"] = {"conditions": kept}
    elif conditions is not None:
        out["status"] = {"conditions": conditions}
    return out

"""Raw Kubernetes objects -> small frozen values. Pure; every problem is an InvalidObject.

Only the fields ipvsctl reads are kept, so 10,000 Services and 100,000 endpoints stay small,
and two versions of an object that differ only in fields ipvsctl ignores compare equal (a
relist or a status-only update then causes no work).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar

from ipvsctl.model import EndpointInfo, Protocol, ServiceRef, family_of, normalize_ip
from ipvsctl.model.ipvs import IPVS_SCHEDULERS, SCHED_FLAG_1, SCHED_FLAG_2, SCHED_FLAG_3
from ipvsctl.model.objects import (
    ServiceInfo,
    ServicePortInfo,
    SliceInfo,
    SlicePortInfo,
)
from ipvsctl.source.duration import parse_duration
from ipvsctl.source.hints import parse_hints, parse_traffic_distribution
from ipvsctl.source.shared import share
from ipvsctl.source.validate import (
    InvalidObject,
    affinity_timeout,
    cidr,
    condition,
    ip,
    items,
    mapping,
    object_meta,
    optional_str,
    port,
    protocol,
    short,
    special_address,
)

SERVICE_NAME_LABEL = "kubernetes.io/service-name"
SERVICE_PROXY_NAME_LABEL = "service.kubernetes.io/service-proxy-name"
HEADLESS_LABEL = "service.kubernetes.io/headless"
SCHEDULER_ANNOTATIONS = ("ipvsctl.io/scheduler", "kube-router.io/service.scheduler")
DRAIN_TIMEOUT_ANNOTATION = "ipvsctl.io/drain-timeout"
# Set by the EndpointSlice controller: when the change that led to this version happened
# (kube-proxy's network programming SLI starts there).
TRIGGER_TIME_ANNOTATION = "endpoints.kubernetes.io/last-change-trigger-time"
# Opts the Service in to per-Service traffic metrics (--service-metrics annotated)
METRICS_ANNOTATION = "ipvsctl.io/metrics"
# kube-router's Service annotations that mean nothing to ipvsctl, with what to do instead
# (docs/migrating-from-kube-router.md); any other kube-router.io/service.* is ignored too.
KUBE_ROUTER_IGNORED = {
    "kube-router.io/service.dsr": "ipvsctl forwards with NAT only",
    "kube-router.io/service.local": "use internalTrafficPolicy/externalTrafficPolicy: Local",
    "kube-router.io/service.hairpin": "hairpin is always on",
    "kube-router.io/service.hairpin.externalips": "hairpin is always on",
    "kube-router.io/service.skiplbips": "every load-balancer IP is served",
}
KUBE_ROUTER_HONOURED = frozenset(
    {"kube-router.io/service.scheduler", "kube-router.io/service.schedflags"}
)
SCHED_FLAGS_ANNOTATIONS = ("ipvsctl.io/scheduler-flags", "kube-router.io/service.schedflags")
# ipvsadm's names for the scheduler flags (flag-1..3 as kube-router's annotation takes them)
SCHED_FLAG_NAMES = {
    "flag-1": SCHED_FLAG_1,
    "sh-fallback": SCHED_FLAG_1,
    "mh-fallback": SCHED_FLAG_1,
    "flag-2": SCHED_FLAG_2,
    "sh-port": SCHED_FLAG_2,
    "mh-port": SCHED_FLAG_2,
    "flag-3": SCHED_FLAG_3,
}
DEFAULT_AFFINITY_TIMEOUT = 10800  # seconds, as Kubernetes
SERVICE_TYPES = frozenset({"ClusterIP", "NodePort", "LoadBalancer", "ExternalName"})


# InvalidObject is defined in validate, imported from here by the store; the parsed types
# live in model (plan reads them) and are imported from here by callers of the parsers.
__all__ = ["InvalidObject", "ServiceInfo", "ServicePortInfo", "SliceInfo", "SlicePortInfo"]


T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Parsed(Generic[T]):
    """A parsed object and the non-fatal problems found in it (ignored annotations, ...)."""

    value: T
    warnings: tuple[str, ...] = ()


def object_name(obj: Mapping[str, Any]) -> str:
    """namespace/name for log lines, as far as it can be read."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    if not isinstance(meta, Mapping):
        return "<no metadata>"
    # short(): a name that is a YAML-aliased list must not be str()-ed whole
    ns, name = meta.get("namespace") or "default", meta.get("name") or "<no name>"
    ns, name = (v if isinstance(v, str) else short(v) for v in (ns, name))
    return f"{ns}/{name}"


def service_label_selector(proxy_name: str | None) -> str:
    """The label selector of the Services this proxy serves, as kube-proxy's."""
    if proxy_name:
        return f"{SERVICE_PROXY_NAME_LABEL}={proxy_name},!{HEADLESS_LABEL}"
    return f"!{HEADLESS_LABEL},!{SERVICE_PROXY_NAME_LABEL}"


def is_proxied(obj: Mapping[str, Any], proxy_name: str | None) -> bool:
    """Whether this proxy serves the Service (kube-proxy's label rules): not labelled
    headless (any value), and its service-proxy-name label equal to `proxy_name`, or absent
    when there is none. The same rule as `service_label_selector`, for sources without
    one (manifests, plan) and for a Service relabelled away while watched."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    labels = meta.get("labels") if isinstance(meta, Mapping) else None
    if not isinstance(labels, Mapping):
        return not proxy_name
    if HEADLESS_LABEL in labels:
        return False
    if SERVICE_PROXY_NAME_LABEL not in labels:
        return not proxy_name
    return bool(proxy_name) and labels[SERVICE_PROXY_NAME_LABEL] == proxy_name


def unproxied_reason(obj: Mapping[str, Any], proxy_name: str | None) -> str | None:
    """Why `is_proxied` says no, in a user's words (`plan`'s skipped list); None when it
    says yes."""
    if is_proxied(obj, proxy_name):
        return None
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    labels = meta.get("labels") if isinstance(meta, Mapping) else None
    labels = labels if isinstance(labels, Mapping) else {}
    if HEADLESS_LABEL in labels:
        return f"labelled {HEADLESS_LABEL}: no proxy serves it (as kube-proxy)"
    if SERVICE_PROXY_NAME_LABEL in labels:
        value = labels[SERVICE_PROXY_NAME_LABEL]
        other = value if isinstance(value, str) else short(value)
        mine = f"--service-proxy-name is {proxy_name}" if proxy_name else "no --service-proxy-name"
        return f"labelled {SERVICE_PROXY_NAME_LABEL}={other}: another proxy's ({mine})"
    return f"not labelled {SERVICE_PROXY_NAME_LABEL}={proxy_name} (--service-proxy-name)"


def is_headless(obj: Mapping[str, Any]) -> bool:
    """`spec.clusterIP` (or one of `spec.clusterIPs`) is `None`: no cluster IP by design."""
    spec = obj.get("spec") if isinstance(obj, Mapping) else None
    if not isinstance(spec, Mapping):
        return False
    ips = spec.get("clusterIPs")
    return spec.get("clusterIP") == "None" or (isinstance(ips, list) and "None" in ips)


# One frozenset per combination, shared by every ServiceInfo (216 bytes each otherwise).
_FAMILIES = {f: f for f in (frozenset({4}), frozenset({6}), frozenset({4, 6}))}


def _dedupe(items: list[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


def parse_service(obj: Mapping[str, Any], default_scheduler: str = "rr") -> Parsed[ServiceInfo]:
    """A Service, field group by field group; the field checks are validate.py's."""
    namespace, name, meta = object_meta(obj)
    spec = mapping(obj.get("spec"), "spec")
    status = mapping(obj.get("status"), "status")
    annotations = mapping(meta.get("annotations"), "metadata.annotations")
    warnings: list[str] = []

    svc_type = optional_str(spec.get("type"), "spec.type") or "ClusterIP"
    if svc_type not in SERVICE_TYPES:
        raise InvalidObject(f"spec.type: unknown type {short(svc_type)}")
    # In this order: the first problem found is the one reported, and warnings keep it.
    cluster_ips, families = _cluster_ips(spec)
    external_ips = _dedupe(
        [ip(a, "spec.externalIPs") for a in items(spec.get("externalIPs"), "spec.externalIPs")]
    )
    lb_ips = _load_balancer_ips(status, warnings) if svc_type == "LoadBalancer" else ()
    cluster_ips = _never_special(cluster_ips, "spec.clusterIPs", warnings)
    external_ips = _never_special(external_ips, "spec.externalIPs", warnings)
    lb_ips = _never_special(lb_ips, "status.loadBalancer.ingress[].ip", warnings)
    ports = _service_ports(spec)
    affinity = _affinity(spec)
    scheduler, sched_flags = _scheduling(annotations, default_scheduler, warnings)
    _kube_router_ignored(annotations, warnings)
    drain_timeout = _drain_timeout(annotations, warnings)
    traffic_metrics = _traffic_metrics(annotations, warnings)
    source_ranges = _source_ranges(spec, svc_type, warnings)
    topology_hints, warning = parse_traffic_distribution(spec.get("trafficDistribution"))
    if warning:
        warnings.append(warning)
    hc = spec.get("healthCheckNodePort")
    hc_port = port(hc, "spec.healthCheckNodePort") if hc else None

    info = ServiceInfo(
        ref=ServiceRef(share(namespace), name),
        type=svc_type,
        cluster_ips=cluster_ips,
        families=_FAMILIES[frozenset(families or (4, 6))],
        external_ips=external_ips,
        load_balancer_ips=lb_ips,
        ports=ports,
        affinity_timeout=affinity,
        internal_local=spec.get("internalTrafficPolicy") == "Local",
        external_local=spec.get("externalTrafficPolicy") == "Local",
        scheduler=scheduler,
        sched_flags=sched_flags,
        drain_timeout=drain_timeout,
        traffic_metrics=traffic_metrics,
        health_check_node_port=hc_port,
        source_ranges=source_ranges,
        topology_hints=topology_hints,
        created=_created(meta, warnings),
    )
    return Parsed(info, tuple(warnings))


def _cluster_ips(spec: Mapping[str, Any]) -> tuple[tuple[str, ...], set[int]]:
    """spec.clusterIPs (or clusterIP; none when headless) and the Service's families
    (theirs, else spec.ipFamilies)."""
    raw_ips = items(spec.get("clusterIPs"), "spec.clusterIPs") or (
        [spec["clusterIP"]] if spec.get("clusterIP") else []
    )
    headless = any(a == "None" for a in raw_ips)
    cluster_ips = (
        () if headless else _dedupe([ip(a, "spec.clusterIPs") for a in raw_ips if a != ""])
    )
    families = {family_of(a) for a in cluster_ips}
    if not families:
        for fam in items(spec.get("ipFamilies"), "spec.ipFamilies"):
            if fam in ("IPv4", "IPv6"):
                families.add(4 if fam == "IPv4" else 6)
    return cluster_ips, families


def _never_special(addresses: tuple[str, ...], where: str, warnings: list[str]) -> tuple[str, ...]:
    """The addresses without those that are never a virtual server (CONTRACT "Node safety"):
    `externalIPs: [127.0.0.1]` or an ingress of 169.254.169.254 (anyone with services/status
    may write it) would otherwise capture the node's own or its metadata service's traffic."""
    kept = []
    for address in addresses:
        why = special_address(address)
        if why is None:
            kept.append(address)
        else:
            warnings.append(f"{where}: {address} is {why}, never a virtual server, ignored")
    return tuple(kept) if len(kept) != len(addresses) else addresses


def _load_balancer_ips(status: Mapping[str, Any], warnings: list[str]) -> tuple[str, ...]:
    """status.loadBalancer.ingress[].ip of a LoadBalancer Service, but `ipMode: Proxy`."""
    out: list[str] = []
    lb = mapping(status.get("loadBalancer"), "status.loadBalancer")
    for ing in items(lb.get("ingress"), "status.loadBalancer.ingress"):
        ing = mapping(ing, "status.loadBalancer.ingress[]")
        if not ing.get("ip"):  # hostname-only ingresses have no VIP to program
            continue
        address = ip(ing["ip"], "status.loadBalancer.ingress[].ip")
        ip_mode = ing.get("ipMode")
        if ip_mode == "Proxy":
            # KEP-1860: the load balancer proxies (PROXY protocol, TLS); in-cluster
            # traffic must reach it, not be captured here.
            continue
        if ip_mode not in (None, "VIP"):
            warnings.append(
                f"status.loadBalancer.ingress[].ipMode: unknown mode "
                f"{short(ip_mode)} for {address}, taken as VIP"
            )
        out.append(address)
    return _dedupe(out)


def _service_ports(spec: Mapping[str, Any]) -> tuple[ServicePortInfo, ...]:
    ports = []
    seen_names: set[tuple[str, Protocol, int]] = set()
    for i, p in enumerate(items(spec.get("ports"), "spec.ports")):
        p = mapping(p, f"spec.ports[{i}]")
        port_name = p.get("name") or ""
        if not isinstance(port_name, str):
            raise InvalidObject(f"spec.ports[{i}].name is not a string")
        proto = protocol(p.get("protocol"), f"spec.ports[{i}].protocol")
        number = port(p.get("port"), f"spec.ports[{i}].port")
        node_port = p.get("nodePort")
        node_port = port(node_port, f"spec.ports[{i}].nodePort") if node_port else None
        if (port_name, proto, number) in seen_names:
            continue
        seen_names.add((port_name, proto, number))
        ports.append(ServicePortInfo(share(port_name), proto, number, node_port))
    return tuple(ports)


def _affinity(spec: Mapping[str, Any]) -> int:
    """ClientIP session affinity's timeout (0: none)."""
    if spec.get("sessionAffinity") != "ClientIP":
        return 0
    cfg = mapping(spec.get("sessionAffinityConfig"), "spec.sessionAffinityConfig")
    client_ip = mapping(cfg.get("clientIP"), "spec.sessionAffinityConfig.clientIP")
    timeout = client_ip.get("timeoutSeconds")
    if timeout is None:
        return DEFAULT_AFFINITY_TIMEOUT
    return affinity_timeout(timeout, "spec.sessionAffinityConfig.clientIP.timeoutSeconds")


def _scheduling(
    annotations: Mapping[str, Any], default_scheduler: str, warnings: list[str]
) -> tuple[str | None, int | None]:
    """The scheduler and its flags from the annotations (ipvsctl's first, then
    kube-router's); None: the default."""
    scheduler = None
    for key in SCHEDULER_ANNOTATIONS:
        value = annotations.get(key)
        if value:
            if isinstance(value, str) and value in IPVS_SCHEDULERS:
                scheduler = value
            else:
                warnings.append(
                    f"annotation {key}: unknown scheduler {short(value)}, using {default_scheduler}"
                )
            break

    sched_flags = None
    for key in SCHED_FLAGS_ANNOTATIONS:
        value = annotations.get(key)
        if value is None:
            continue
        if not isinstance(value, str):  # str() of an aliased YAML list is gigabytes
            warnings.append(f"annotation {key}: {short(value)} is not a string, ignored")
            break
        names = [n.strip() for n in value.split(",") if n.strip()]
        unknown = [n for n in names if n not in SCHED_FLAG_NAMES]
        if unknown:
            warnings.append(
                f"annotation {key}: unknown scheduler flags {short(unknown)} "
                f"(known: flag-1, flag-2, flag-3, sh-/mh-fallback, sh-/mh-port), "
                "ignored"
            )
        else:
            sched_flags = 0
            for n in names:
                sched_flags |= SCHED_FLAG_NAMES[n]
        break
    return scheduler, sched_flags


# kube-router annotations named in one warning line, at most (the rest are counted)
IGNORED_SHOWN = 8


def _kube_router_ignored(annotations: Mapping[str, Any], warnings: list[str]) -> None:
    keys = sorted(
        k
        for k in annotations
        if isinstance(k, str)
        and k.startswith("kube-router.io/service.")
        and k not in KUBE_ROUTER_HONOURED
    )
    if not keys:
        return
    # one line per Service, however many keys and however long (a manifest's keys are
    # not the API server's, which bounds them): each shown short, a few of them
    ignored = [
        f"{key if len(key) <= 80 else short(key)} "
        f"({KUBE_ROUTER_IGNORED.get(key, 'no ipvsctl meaning')})"
        for key in keys[:IGNORED_SHOWN]
    ]
    more = f" and {len(keys) - IGNORED_SHOWN} more" if len(keys) > IGNORED_SHOWN else ""
    warnings.append(f"kube-router annotations ignored: {', '.join(ignored)}{more}")


def _drain_timeout(annotations: Mapping[str, Any], warnings: list[str]) -> float | None:
    raw_timeout = annotations.get(DRAIN_TIMEOUT_ANNOTATION)
    if raw_timeout is None:
        return None
    try:
        return parse_duration(raw_timeout)
    except ValueError as exc:
        # The next rules of the deadline order apply (CONTRACT.md "Draining").
        warnings.append(f"annotation {DRAIN_TIMEOUT_ANNOTATION}: {exc}, ignored")
        return None


def _traffic_metrics(annotations: Mapping[str, Any], warnings: list[str]) -> bool:
    raw = annotations.get(METRICS_ANNOTATION)
    if raw is None:
        return False
    value = raw.strip().lower() if isinstance(raw, str) else raw
    if value not in ("true", "false"):
        # short(): a value's repr is unbounded (a YAML alias list of a 1 MB string: 1.3 GB)
        warnings.append(
            f'annotation {METRICS_ANNOTATION}: {short(raw)} is not "true" or "false", ignored'
        )
    return value == "true"


def _source_ranges(
    spec: Mapping[str, Any], svc_type: str, warnings: list[str]
) -> tuple[str, ...] | None:
    raw_ranges = items(spec.get("loadBalancerSourceRanges"), "spec.loadBalancerSourceRanges")
    if svc_type != "LoadBalancer" or not raw_ranges:
        return None
    valid = []
    for text in raw_ranges:
        try:
            if not isinstance(text, str):
                raise ValueError(text)
            valid.append(cidr(text))
        except ValueError:
            warnings.append(f"spec.loadBalancerSourceRanges: {short(text)} is not a CIDR, ignored")
    return _dedupe(valid)


def _created(meta: Mapping[str, Any], warnings: list[str]) -> float | None:
    raw_created = meta.get("creationTimestamp")
    if not raw_created:
        return None
    try:
        if not isinstance(raw_created, str):
            raise ValueError(raw_created)
        return parse_timestamp(raw_created)
    except ValueError:
        warnings.append(f"metadata.creationTimestamp: {short(raw_created)} is not a time, ignored")
        return None


_ADDRESS_TYPES = {"IPv4": 4, "IPv6": 6, "FQDN": None}


def _endpoint(
    ep: Any, i: int, family: int, address_type: str, namespace: str, warnings: list[str]
) -> EndpointInfo:
    """One endpoint of a slice. Every check of the general helpers, but the common shapes
    (dicts, strings) take a fast path and the error's location text is built only for an
    error: ~40% of one change's CPU was this loop (bench hot spot 4)."""
    if type(ep) is not dict:
        ep = mapping(ep, f"endpoints[{i}]")
    addresses = ep.get("addresses")
    if type(addresses) is not list:
        addresses = items(addresses, f"endpoints[{i}].addresses")
    if not addresses:
        raise InvalidObject(f"endpoints[{i}].addresses is empty")
    # As kube-proxy: the first address is the endpoint; the others are the same pod.
    first = addresses[0]
    try:
        address = normalize_ip(first) if type(first) is str else None
    except ValueError:
        address = None
    if address is None:
        address = ip(first, f"endpoints[{i}].addresses[0]")
    if family_of(address) != family:
        raise InvalidObject(
            f"endpoints[{i}].addresses[0]: {address} is not an {address_type} address"
        )
    conditions = ep.get("conditions")
    if type(conditions) is not dict:
        conditions = mapping(conditions, f"endpoints[{i}].conditions")
    ready = condition(conditions, "ready", True)  # checked in this order: the same error
    target = ep.get("targetRef")
    if type(target) is not dict:
        target = mapping(target, f"endpoints[{i}].targetRef")
    pod_namespace: str | None = None
    pod_name: str | None = None
    uid = ""
    if target.get("kind") == "Pod" and target.get("name"):
        ns, pod_name = target.get("namespace"), target["name"]
        if ns is not None and type(ns) is not str:
            ns = optional_str(ns, f"endpoints[{i}].targetRef.namespace")
        if type(pod_name) is not str:
            pod_name = optional_str(pod_name, f"endpoints[{i}].targetRef.name")
        uid = target.get("uid")
        if uid is not None and (type(uid) is not str or len(uid) > 128):
            raise InvalidObject(f"endpoints[{i}].targetRef.uid: {short(uid)} is not a uid")
        uid = uid or ""
        pod_name = pod_name or ""
        # Most targetRefs are in the slice's namespace: its string (shared), not a copy.
        pod_namespace = share(ns) if ns and ns != namespace else namespace
    node_name = ep.get("nodeName")
    raw_hints = ep.get("hints")
    hints = None
    if raw_hints is not None:
        hints, warning = parse_hints(raw_hints, f"endpoints[{i}].hints")
        if warning:
            warnings.append(warning)
    return EndpointInfo(
        address,
        ready,
        condition(conditions, "serving", True),
        condition(conditions, "terminating", False),
        share(node_name) if isinstance(node_name, str) else None,
        pod_namespace,
        pod_name,
        uid,
        hints,
    )


def parse_endpoint_slice(obj: Mapping[str, Any]) -> Parsed[SliceInfo]:
    namespace, name, meta = object_meta(obj)
    namespace = share(namespace)  # and every endpoint's pod in it (most are)
    labels = mapping(meta.get("labels"), "metadata.labels")
    service_name = (
        optional_str(labels.get(SERVICE_NAME_LABEL), f"metadata.labels.{SERVICE_NAME_LABEL}")
        or None
    )
    address_type = optional_str(obj.get("addressType"), "addressType")
    if address_type not in _ADDRESS_TYPES:
        raise InvalidObject(f"addressType: unknown address type {short(address_type)}")
    family = _ADDRESS_TYPES[address_type]
    if family is None:
        return Parsed(SliceInfo(namespace, name, service_name, None))
    trigger_time, trigger_malformed = _trigger_time(meta)

    ports = []
    for i, p in enumerate(items(obj.get("ports"), "ports")):
        p = mapping(p, f"ports[{i}]")
        if p.get("port") is None:  # "all ports": kube-proxy ignores these too
            continue
        port_name = p.get("name") or ""
        if not isinstance(port_name, str):
            raise InvalidObject(f"ports[{i}].name is not a string")
        ports.append(
            SlicePortInfo(
                share(port_name),
                protocol(p.get("protocol"), f"ports[{i}].protocol"),
                port(p.get("port"), f"ports[{i}].port"),
            )
        )

    warnings: list[str] = []
    endpoints = [
        _endpoint(ep, i, family, address_type, namespace, warnings)
        for i, ep in enumerate(items(obj.get("endpoints"), "endpoints"))
    ]
    has_hints = any(ep.hints is not None for ep in endpoints)
    return Parsed(
        SliceInfo(
            namespace,
            name,
            service_name,
            family,
            tuple(ports),
            tuple(endpoints),
            has_hints,
            trigger_time,
            trigger_malformed,
        ),
        tuple(warnings),
    )


def _trigger_time(meta: Mapping[str, Any]) -> tuple[float | None, bool]:
    """The trigger-time annotation: (epoch seconds, False); (None, False) when absent;
    (None, True) when it is not an RFC 3339 time (hostile or broken: never observed)."""
    annotations = meta.get("annotations")
    raw = annotations.get(TRIGGER_TIME_ANNOTATION) if isinstance(annotations, Mapping) else None
    return parse_trigger_time(raw)


def trigger_annotation(obj: Any) -> Any:
    """An object's trigger-time annotation as sent (None when absent or unreadable)."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
    return annotations.get(TRIGGER_TIME_ANNOTATION) if isinstance(annotations, Mapping) else None


def parse_trigger_time(raw: Any) -> tuple[float | None, bool]:
    """The trigger-time annotation's value, as `_trigger_time` says."""
    if raw is None:
        return None, False
    if not isinstance(raw, str) or len(raw) > 64:
        return None, True
    try:
        t = parse_timestamp(raw)
    except (ValueError, OverflowError):
        return None, True
    return (t, False) if math.isfinite(t) else (None, True)


def parse_timestamp(value: str) -> float:
    """RFC 3339 (as the API server writes it) -> epoch seconds."""
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()

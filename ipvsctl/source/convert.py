"""Raw Kubernetes objects -> small frozen values. Pure; every problem is an InvalidObject.

Only the fields ipvsctl reads are kept, so 10,000 Services and 100,000 endpoints stay small,
and two versions of an object that differ only in fields ipvsctl ignores compare equal (a
relist or a status-only update then causes no work).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar

from ipvsctl.model import EndpointInfo, PodRef, Protocol, ServiceRef, family_of, normalize_ip
from ipvsctl.model.ipvs import IPVS_SCHEDULERS, SCHED_FLAG_1, SCHED_FLAG_2, SCHED_FLAG_3
from ipvsctl.model.objects import (
    ServiceInfo,
    ServicePortInfo,
    SliceInfo,
    SlicePortInfo,
)
from ipvsctl.source.duration import parse_duration
from ipvsctl.source.hints import parse_hints, parse_traffic_distribution
from ipvsctl.source.validate import (
    GENERAL_CHECKS,
    InvalidObject,
    affinity_timeout,
    cidr,
    optional_str,
)

SERVICE_NAME_LABEL = "kubernetes.io/service-name"
SERVICE_PROXY_NAME_LABEL = "service.kubernetes.io/service-proxy-name"
HEADLESS_LABEL = "service.kubernetes.io/headless"
SCHEDULER_ANNOTATIONS = ("ipvsctl.io/scheduler", "kube-router.io/service.scheduler")
DRAIN_TIMEOUT_ANNOTATION = "ipvsctl.io/drain-timeout"
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
    {"kube-router.io/service.scheduler", "kube-router.io/service.schedflags"})
SCHED_FLAGS_ANNOTATIONS = ("ipvsctl.io/scheduler-flags", "kube-router.io/service.schedflags")
# ipvsadm's names for the scheduler flags (flag-1..3 as kube-router's annotation takes them)
SCHED_FLAG_NAMES = {
    "flag-1": SCHED_FLAG_1, "sh-fallback": SCHED_FLAG_1, "mh-fallback": SCHED_FLAG_1,
    "flag-2": SCHED_FLAG_2, "sh-port": SCHED_FLAG_2, "mh-port": SCHED_FLAG_2,
    "flag-3": SCHED_FLAG_3,
}
DEFAULT_AFFINITY_TIMEOUT = 10800  # seconds, as Kubernetes
SERVICE_TYPES = frozenset({"ClusterIP", "NodePort", "LoadBalancer", "ExternalName"})


# InvalidObject is defined in validate, imported from here by the store; the parsed types
# live in model (plan reads them) and are imported from here by callers of the parsers.
__all__ = ["InvalidObject", "ServiceInfo", "ServicePortInfo", "SliceInfo",
           "SlicePortInfo"]


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
    return f"{meta.get('namespace') or 'default'}/{meta.get('name') or '<no name>'}"


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


def _meta(obj: Mapping[str, Any]) -> tuple[str, str, Mapping[str, Any]]:
    if not isinstance(obj, Mapping):
        raise InvalidObject("not an object")
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str) or not meta["name"]:
        raise InvalidObject("metadata.name is missing")
    namespace = meta.get("namespace") or "default"
    if not isinstance(namespace, str):
        raise InvalidObject("metadata.namespace is not a string")
    return namespace, meta["name"], meta


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    GENERAL_CHECKS.calls += 1
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidObject(f"{where} is not an object")
    return value


def _list(value: Any, where: str) -> list[Any]:
    GENERAL_CHECKS.calls += 1
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidObject(f"{where} is not a list")
    return value


def _ip(value: Any, where: str) -> str:
    GENERAL_CHECKS.calls += 1
    if not isinstance(value, str):
        raise InvalidObject(f"{where}: {value!r} is not an IP address")
    try:
        return normalize_ip(value)
    except ValueError:
        raise InvalidObject(f"{where}: {value!r} is not an IP address") from None


def _port(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise InvalidObject(f"{where}: {value!r} is not a port number")
    return value


def _protocol(value: Any, where: str) -> Protocol:
    if value is None:
        return Protocol.TCP
    try:
        return Protocol(value)
    except ValueError:
        raise InvalidObject(f"{where}: unknown protocol {value!r}") from None


def _dedupe(items: list[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


def parse_service(obj: Mapping[str, Any], default_scheduler: str = "rr") -> Parsed[ServiceInfo]:
    namespace, name, meta = _meta(obj)
    spec = _mapping(obj.get("spec"), "spec")
    status = _mapping(obj.get("status"), "status")
    annotations = _mapping(meta.get("annotations"), "metadata.annotations")
    warnings: list[str] = []

    svc_type = optional_str(spec.get("type"), "spec.type") or "ClusterIP"
    if svc_type not in SERVICE_TYPES:
        raise InvalidObject(f"spec.type: unknown type {svc_type!r}")

    raw_ips = _list(spec.get("clusterIPs"), "spec.clusterIPs") or (
        [spec["clusterIP"]] if spec.get("clusterIP") else []
    )
    headless = any(ip == "None" for ip in raw_ips)
    cluster_ips = () if headless else _dedupe(
        [_ip(ip, "spec.clusterIPs") for ip in raw_ips if ip != ""]
    )
    families = {family_of(ip) for ip in cluster_ips}
    if not families:
        for fam in _list(spec.get("ipFamilies"), "spec.ipFamilies"):
            if fam in ("IPv4", "IPv6"):
                families.add(4 if fam == "IPv4" else 6)

    external_ips = _dedupe(
        [_ip(ip, "spec.externalIPs") for ip in _list(spec.get("externalIPs"), "spec.externalIPs")]
    )
    lb_ips: list[str] = []
    if svc_type == "LoadBalancer":
        lb = _mapping(status.get("loadBalancer"), "status.loadBalancer")
        for ing in _list(lb.get("ingress"), "status.loadBalancer.ingress"):
            ing = _mapping(ing, "status.loadBalancer.ingress[]")
            if not ing.get("ip"):  # hostname-only ingresses have no VIP to program
                continue
            ip = _ip(ing["ip"], "status.loadBalancer.ingress[].ip")
            ip_mode = ing.get("ipMode")
            if ip_mode == "Proxy":
                # KEP-1860: the load balancer proxies (PROXY protocol, TLS); in-cluster
                # traffic must reach it, not be captured here.
                continue
            if ip_mode not in (None, "VIP"):
                warnings.append(f"status.loadBalancer.ingress[].ipMode: unknown mode "
                                f"{ip_mode!r} for {ip}, taken as VIP")
            lb_ips.append(ip)

    ports = []
    seen_names: set[tuple[str, Protocol, int]] = set()
    for i, p in enumerate(_list(spec.get("ports"), "spec.ports")):
        p = _mapping(p, f"spec.ports[{i}]")
        port_name = p.get("name") or ""
        if not isinstance(port_name, str):
            raise InvalidObject(f"spec.ports[{i}].name is not a string")
        proto = _protocol(p.get("protocol"), f"spec.ports[{i}].protocol")
        port = _port(p.get("port"), f"spec.ports[{i}].port")
        node_port = p.get("nodePort")
        node_port = _port(node_port, f"spec.ports[{i}].nodePort") if node_port else None
        if (port_name, proto, port) in seen_names:
            continue
        seen_names.add((port_name, proto, port))
        ports.append(ServicePortInfo(port_name, proto, port, node_port))

    affinity = 0
    if spec.get("sessionAffinity") == "ClientIP":
        cfg = _mapping(spec.get("sessionAffinityConfig"), "spec.sessionAffinityConfig")
        client_ip = _mapping(cfg.get("clientIP"), "spec.sessionAffinityConfig.clientIP")
        timeout = client_ip.get("timeoutSeconds")
        if timeout is None:
            affinity = DEFAULT_AFFINITY_TIMEOUT
        else:
            affinity = affinity_timeout(
                timeout, "spec.sessionAffinityConfig.clientIP.timeoutSeconds")

    scheduler = None
    for key in SCHEDULER_ANNOTATIONS:
        value = annotations.get(key)
        if value:
            if isinstance(value, str) and value in IPVS_SCHEDULERS:
                scheduler = value
            else:
                warnings.append(
                    f"annotation {key}: unknown scheduler {value!r}, using {default_scheduler}"
                )
            break

    sched_flags = None
    for key in SCHED_FLAGS_ANNOTATIONS:
        value = annotations.get(key)
        if value is None:
            continue
        names = [n.strip() for n in str(value).split(",") if n.strip()]
        unknown = [n for n in names if n not in SCHED_FLAG_NAMES]
        if unknown:
            warnings.append(f"annotation {key}: unknown scheduler flags {unknown!r} "
                            f"(known: flag-1, flag-2, flag-3, sh-/mh-fallback, sh-/mh-port), "
                            "ignored")
        else:
            sched_flags = 0
            for n in names:
                sched_flags |= SCHED_FLAG_NAMES[n]
        break

    ignored = [
        f"{key} ({KUBE_ROUTER_IGNORED.get(key, 'no ipvsctl meaning')})"
        for key in sorted(k for k in annotations if isinstance(k, str))
        if key.startswith("kube-router.io/service.") and key not in KUBE_ROUTER_HONOURED
    ]
    if ignored:  # one line per Service, however many
        warnings.append(f"kube-router annotations ignored: {', '.join(ignored)}")

    drain_timeout = None
    raw_timeout = annotations.get(DRAIN_TIMEOUT_ANNOTATION)
    if raw_timeout is not None:
        try:
            drain_timeout = parse_duration(raw_timeout)
        except ValueError as exc:
            # The next rules of the deadline order apply (CONTRACT.md "Draining").
            warnings.append(f"annotation {DRAIN_TIMEOUT_ANNOTATION}: {exc}, ignored")

    source_ranges = None
    raw_ranges = _list(spec.get("loadBalancerSourceRanges"), "spec.loadBalancerSourceRanges")
    if svc_type == "LoadBalancer" and raw_ranges:
        valid = []
        for text in raw_ranges:
            try:
                valid.append(cidr(str(text)))
            except ValueError:
                warnings.append(f"spec.loadBalancerSourceRanges: {text!r} is not a CIDR, ignored")
        source_ranges = _dedupe(valid)

    topology_hints, warning = parse_traffic_distribution(spec.get("trafficDistribution"))
    if warning:
        warnings.append(warning)

    hc = spec.get("healthCheckNodePort")
    hc_port = _port(hc, "spec.healthCheckNodePort") if hc else None

    created = None
    raw_created = meta.get("creationTimestamp")
    if raw_created:
        try:
            created = parse_timestamp(str(raw_created))
        except ValueError:
            warnings.append(f"metadata.creationTimestamp: {raw_created!r} is not a time, ignored")

    info = ServiceInfo(
        ref=ServiceRef(namespace, name),
        type=svc_type,
        cluster_ips=cluster_ips,
        families=frozenset(families or {4, 6}),
        external_ips=external_ips,
        load_balancer_ips=_dedupe(lb_ips),
        ports=tuple(ports),
        affinity_timeout=affinity,
        internal_local=spec.get("internalTrafficPolicy") == "Local",
        external_local=spec.get("externalTrafficPolicy") == "Local",
        scheduler=scheduler,
        sched_flags=sched_flags,
        drain_timeout=drain_timeout,
        health_check_node_port=hc_port,
        source_ranges=source_ranges,
        topology_hints=topology_hints,
        created=created,
    )
    return Parsed(info, tuple(warnings))


_ADDRESS_TYPES = {"IPv4": 4, "IPv6": 6, "FQDN": None}


def _condition(conditions: Mapping[str, Any], name: str, default: bool) -> bool:
    value = conditions.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InvalidObject(f"endpoints[].conditions.{name}: {value!r} is not a boolean")
    return value


def _endpoint(ep: Any, i: int, family: int, address_type: str, namespace: str,
              warnings: list[str]) -> EndpointInfo:
    """One endpoint of a slice. Every check of the general helpers, but the common shapes
    (dicts, strings) take a fast path and the error's location text is built only for an
    error: ~40% of one change's CPU was this loop (bench hot spot 4)."""
    if type(ep) is not dict:
        ep = _mapping(ep, f"endpoints[{i}]")
    addresses = ep.get("addresses")
    if type(addresses) is not list:
        addresses = _list(addresses, f"endpoints[{i}].addresses")
    if not addresses:
        raise InvalidObject(f"endpoints[{i}].addresses is empty")
    # As kube-proxy: the first address is the endpoint; the others are the same pod.
    first = addresses[0]
    try:
        address = normalize_ip(first) if type(first) is str else None
    except ValueError:
        address = None
    if address is None:
        address = _ip(first, f"endpoints[{i}].addresses[0]")
    if family_of(address) != family:
        raise InvalidObject(
            f"endpoints[{i}].addresses[0]: {address} is not an {address_type} address")
    conditions = ep.get("conditions")
    if type(conditions) is not dict:
        conditions = _mapping(conditions, f"endpoints[{i}].conditions")
    ready = _condition(conditions, "ready", True)  # checked in this order: the same error
    target = ep.get("targetRef")
    if type(target) is not dict:
        target = _mapping(target, f"endpoints[{i}].targetRef")
    pod = None
    if target.get("kind") == "Pod" and target.get("name"):
        ns, pod_name = target.get("namespace"), target["name"]
        if ns is not None and type(ns) is not str:
            ns = optional_str(ns, f"endpoints[{i}].targetRef.namespace")
        if type(pod_name) is not str:
            pod_name = optional_str(pod_name, f"endpoints[{i}].targetRef.name")
        uid = target.get("uid")
        if uid is not None and (type(uid) is not str or len(uid) > 128):
            raise InvalidObject(f"endpoints[{i}].targetRef.uid: {uid!r} is not a uid")
        pod = PodRef(ns or namespace, pod_name or "", uid or "")
    node_name = ep.get("nodeName")
    raw_hints = ep.get("hints")
    hints = None
    if raw_hints is not None:
        hints, warning = parse_hints(raw_hints, f"endpoints[{i}].hints")
        if warning:
            warnings.append(warning)
    return EndpointInfo(address, ready, _condition(conditions, "serving", True),
                        _condition(conditions, "terminating", False),
                        node_name if isinstance(node_name, str) else None, pod, hints)


def parse_endpoint_slice(obj: Mapping[str, Any]) -> Parsed[SliceInfo]:
    namespace, name, meta = _meta(obj)
    labels = _mapping(meta.get("labels"), "metadata.labels")
    service_name = optional_str(labels.get(SERVICE_NAME_LABEL),
                                f"metadata.labels.{SERVICE_NAME_LABEL}") or None
    address_type = optional_str(obj.get("addressType"), "addressType")
    if address_type not in _ADDRESS_TYPES:
        raise InvalidObject(f"addressType: unknown address type {address_type!r}")
    family = _ADDRESS_TYPES[address_type]
    if family is None:
        return Parsed(SliceInfo(namespace, name, service_name, None))

    ports = []
    for i, p in enumerate(_list(obj.get("ports"), "ports")):
        p = _mapping(p, f"ports[{i}]")
        if p.get("port") is None:  # "all ports": kube-proxy ignores these too
            continue
        port_name = p.get("name") or ""
        if not isinstance(port_name, str):
            raise InvalidObject(f"ports[{i}].name is not a string")
        ports.append(
            SlicePortInfo(
                port_name,
                _protocol(p.get("protocol"), f"ports[{i}].protocol"),
                _port(p.get("port"), f"ports[{i}].port"),
            )
        )

    warnings: list[str] = []
    endpoints = [_endpoint(ep, i, family, address_type, namespace, warnings)
                 for i, ep in enumerate(_list(obj.get("endpoints"), "endpoints"))]
    has_hints = any(ep.hints is not None for ep in endpoints)
    return Parsed(SliceInfo(namespace, name, service_name, family, tuple(ports), tuple(endpoints),
                            has_hints), tuple(warnings))


def parse_timestamp(value: str) -> float:
    """RFC 3339 (as the API server writes it) -> epoch seconds."""
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()

"""Builders for realistic Service / EndpointSlice / Pod JSON (as the API server returns them,
managedFields included) and a bulk `populate` for demos and benchmarks."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator, Sequence
from typing import Any

JSON = dict[str, Any]

_MANAGED = [
    {
        "manager": "kube-controller-manager",
        "operation": "Update",
        "apiVersion": "v1",
        "time": "2024-01-01T00:00:00Z",
        "fieldsType": "FieldsV1",
        "fieldsV1": {"f:metadata": {"f:labels": {".": {}}}},
    }
]


def service(
    name: str,
    namespace: str = "default",
    *,
    cluster_ip: str = "10.96.0.10",
    ports: Sequence[tuple[str, int, int]] = (("http", 80, 8080),),
    protocol: str = "TCP",
    type_: str = "ClusterIP",
    annotations: dict[str, str] | None = None,
    **spec: Any,
) -> JSON:
    """A Service; `ports` are (name, port, targetPort)."""
    return {
        "kind": "Service",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "annotations": dict(annotations or {}),
            "managedFields": _MANAGED,
        },
        "spec": {
            "type": type_,
            "clusterIP": cluster_ip,
            "clusterIPs": [cluster_ip],
            "ipFamilies": ["IPv6" if ":" in cluster_ip else "IPv4"],
            "ports": [
                {"name": n, "protocol": protocol, "port": p, "targetPort": t} for n, p, t in ports
            ],
            "sessionAffinity": "None",
            "internalTrafficPolicy": "Cluster",
            **spec,
        },
        "status": {"loadBalancer": {}},
    }


def endpoint(
    address: str,
    *,
    ready: bool = True,
    serving: bool | None = None,
    terminating: bool = False,
    node: str = "node-1",
    pod: str | None = None,
    namespace: str = "default",
    uid: str | None = None,
) -> JSON:
    ep: JSON = {
        "addresses": [address],
        "conditions": {
            "ready": ready,
            "serving": ready if serving is None else serving,
            "terminating": terminating,
        },
        "nodeName": node,
        "zone": "zone-a",
    }
    if pod is not None:
        ep["targetRef"] = {
            "kind": "Pod",
            "namespace": namespace,
            "name": pod,
            "uid": uid or "u-" + pod,
        }
    return ep


def endpoint_slice(
    name: str,
    service_name: str,
    endpoints: Sequence[JSON],
    namespace: str = "default",
    *,
    ports: Sequence[tuple[str, int]] = (("http", 8080),),
    protocol: str = "TCP",
    address_type: str = "IPv4",
) -> JSON:
    return {
        "kind": "EndpointSlice",
        "apiVersion": "discovery.k8s.io/v1",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {
                "kubernetes.io/service-name": service_name,
                "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
            },
            "managedFields": _MANAGED,
        },
        "addressType": address_type,
        "ports": [{"name": n, "protocol": protocol, "port": p} for n, p in ports],
        "endpoints": list(endpoints),
    }


def pod(
    name: str,
    namespace: str = "default",
    *,
    ip: str = "10.244.1.5",
    node: str = "node-1",
    deletion_timestamp: str | None = None,
    grace: int = 30,
    uid: str | None = None,
) -> JSON:
    """A Pod: the daemon reads none (CONTRACT.md "Draining"); tests serve them to show it
    never asks."""
    meta: JSON = {
        "name": name,
        "namespace": namespace,
        "managedFields": _MANAGED,
        "uid": uid or "u-" + name,
    }
    if deletion_timestamp is not None:
        meta["deletionTimestamp"] = deletion_timestamp
        meta["deletionGracePeriodSeconds"] = grace
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": meta,
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": grace,
            "containers": [{"name": "app", "image": "nginx"}],
        },
        "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]},
    }


def node(
    name: str,
    zone: str | None = None,
    *,
    taints: list[JSON] | None = None,
    address: str = "192.0.2.10",
    pod_cidr: str = "10.244.1.0/24",
) -> JSON:
    """A Node as the API server sends it (status and all), cluster-scoped."""
    labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}
    if zone is not None:
        labels["topology.kubernetes.io/zone"] = zone
    return {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {"name": name, "labels": labels, "managedFields": _MANAGED},
        "spec": {"podCIDR": pod_cidr, "taints": list(taints or [])},
        "status": {
            "conditions": [{"type": "Ready", "status": "True"}],
            "addresses": [{"type": "InternalIP", "address": address}],
        },
    }


def cluster(services: int, endpoints_per_service: int, *, namespaces: int = 10) -> Iterator[JSON]:
    """`services` Services, each with one EndpointSlice of `endpoints_per_service` ready
    endpoints (distinct pod IPs), spread over `namespaces` namespaces. A generator, so the
    fake server can load it without a second copy in memory."""
    vip_base = int(ipaddress.IPv4Address("10.96.0.0"))
    pod_base = int(ipaddress.IPv4Address("10.128.0.0"))
    for i in range(services):
        ns = f"ns-{i % namespaces}"
        name = f"svc-{i}"
        yield service(name, ns, cluster_ip=str(ipaddress.IPv4Address(vip_base + 1 + i)))
        eps = [
            endpoint(
                str(ipaddress.IPv4Address(pod_base + i * endpoints_per_service + j)),
                pod=f"{name}-{j}",
                namespace=ns,
                node=f"node-{j % 50}",
            )
            for j in range(endpoints_per_service)
        ]
        yield endpoint_slice(f"{name}-abcde", name, eps, ns)

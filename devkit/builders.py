"""Builders of raw Kubernetes objects, as the API server would send them."""

from __future__ import annotations

import itertools
from typing import Any

_counter = itertools.count(1)


def service(
    name: str,
    cluster_ip: str | list[str] | None = "10.96.0.10",
    ports: list[dict[str, Any]] | None = None,
    namespace: str = "default",
    annotations: dict[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    s: dict[str, Any] = {
        "ports": ports
        if ports is not None
        else [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}]
    }
    if isinstance(cluster_ip, list):
        s["clusterIPs"] = cluster_ip
        s["clusterIP"] = cluster_ip[0]
    elif cluster_ip is not None:
        s["clusterIP"] = cluster_ip
    lb = spec.pop("lb_ips", None)
    s.update(spec)
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace, "resourceVersion": str(next(_counter))},
        "spec": s,
    }
    if annotations:
        obj["metadata"]["annotations"] = annotations
    if lb:
        obj["status"] = {"loadBalancer": {"ingress": [{"ip": ip} for ip in lb]}}
    return obj


def endpoint(
    address: str,
    ready: bool | None = True,
    serving: bool | None = None,
    terminating: bool | None = None,
    node: str | None = "node-a",
    pod: str | None = None,
    namespace: str = "default",
    uid: str | None = None,
) -> dict[str, Any]:
    conditions: dict[str, Any] = {}
    if ready is not None:
        conditions["ready"] = ready
    if serving is not None:
        conditions["serving"] = serving
    if terminating is not None:
        conditions["terminating"] = terminating
    ep: dict[str, Any] = {"addresses": [address], "conditions": conditions}
    if node:
        ep["nodeName"] = node
    if pod:
        ep["targetRef"] = {"kind": "Pod", "name": pod, "namespace": namespace}
        if uid:
            ep["targetRef"]["uid"] = uid
    return ep


def terminating(
    address: str,
    pod: str | None = None,
    node: str = "node-a",
    serving: bool = True,
    uid: str | None = None,
) -> dict[str, Any]:
    return endpoint(
        address, ready=False, serving=serving, terminating=True, node=node, pod=pod, uid=uid
    )


def endpoint_slice(
    service_name: str,
    endpoints: list[dict[str, Any]],
    name: str | None = None,
    ports: list[dict[str, Any]] | None = None,
    address_type: str = "IPv4",
    namespace: str = "default",
) -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": name or f"{service_name}-abc",
            "namespace": namespace,
            "labels": {"kubernetes.io/service-name": service_name},
            "resourceVersion": str(next(_counter)),
        },
        "addressType": address_type,
        "ports": ports
        if ports is not None
        else [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": endpoints,
    }


def pod(
    name: str,
    deletion_timestamp: str | None = None,
    namespace: str = "default",
    uid: str | None = None,
) -> dict[str, Any]:
    """A Pod, for the fake API server (the daemon reads none: tests check it never asks)."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if uid:
        meta["uid"] = uid
    if deletion_timestamp:
        meta["deletionTimestamp"] = deletion_timestamp
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"nodeName": "node-a"}}

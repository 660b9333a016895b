"""Synthetic clusters for the benchmarks, as the engine receives them (trimmed like the API
source trims them): N ClusterIP Services with one EndpointSlice of E ready endpoints each."""

from __future__ import annotations

import copy
from typing import Any

from devkit.fakeapi import objects
from ipvsctl.kube.trim import trim_endpoint_slice, trim_service
from ipvsctl.model import Protocol, RealServerKey, ServiceKey

RawObject = dict[str, Any]


def cluster(n: int, e: int) -> tuple[list[RawObject], list[RawObject]]:
    """(services, slices) for n Services of e endpoints (devkit.fakeapi.objects.cluster)."""
    services: list[RawObject] = []
    slices: list[RawObject] = []
    for obj in objects.cluster(n, e):
        if obj["kind"] == "Service":
            services.append(trim_service(obj))
        else:
            slices.append(trim_endpoint_slice(obj))
    return services, slices


def vs_key(svc: RawObject) -> ServiceKey:
    port = svc["spec"]["ports"][0]
    return ServiceKey(Protocol.TCP, svc["spec"]["clusterIP"], port["port"])


def rs_key(sl: RawObject, j: int) -> RealServerKey:
    return RealServerKey(sl["endpoints"][j]["addresses"][0], sl["ports"][0]["port"])


def with_ready(sl: RawObject, j: int, ready: bool) -> RawObject:
    """The slice with endpoint j ready or not (a pod failing, then passing, its readiness
    probe): one real server to weight 0, then back to 1."""
    out = copy.deepcopy(sl)
    ep = out["endpoints"][j]
    ep["conditions"] = {"ready": ready, "serving": ready, "terminating": False}
    return out

"""Pure parts of the API adapter: trimming, backoff, splitting watch streams."""

from __future__ import annotations

import random

import pytest

from ipvsctl.kube.backoff import Backoff
from ipvsctl.kube.decode import iter_lines
from ipvsctl.kube.trim import trim_endpoint_slice, trim_service

MANAGED = [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}]


def test_trim_service_keeps_what_the_engine_reads() -> None:
    obj = {
        "metadata": {
            "name": "web",
            "namespace": "prod",
            "uid": "u1",
            "resourceVersion": "123",
            "generation": 4,
            "creationTimestamp": "2024-01-01T00:00:00Z",
            "managedFields": MANAGED,
            "labels": {"app": "web", "service.kubernetes.io/service-proxy-name": "other"},
            "annotations": {
                "kubectl.kubernetes.io/last-applied-configuration": "{...}" * 100,
                "ipvsctl.io/scheduler": "wrr",
                "ipvsctl.io/drain-timeout": "60",
                "kube-router.io/service.scheduler": "lc",
                "service.beta.kubernetes.io/aws-load-balancer-type": "nlb",
            },
        },
        "spec": {
            "type": "LoadBalancer",
            "clusterIP": "10.96.0.10",
            "clusterIPs": ["10.96.0.10", "fd00::10"],
            "ipFamilies": ["IPv4", "IPv6"],
            "ipFamilyPolicy": "PreferDualStack",
            "externalIPs": ["192.0.2.1"],
            "ports": [{"name": "http", "protocol": "TCP", "port": 80, "nodePort": 30080}],
            "selector": {"app": "web"},
            "sessionAffinity": "ClientIP",
            "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 60}},
            "internalTrafficPolicy": "Local",
            "externalTrafficPolicy": "Local",
            "healthCheckNodePort": 31000,
            "allocateLoadBalancerNodePorts": True,
        },
        "status": {
            "loadBalancer": {"ingress": [{"ip": "198.51.100.1"}]},
            "conditions": [{"type": "x"}],
        },
    }
    assert trim_service(obj) == {
        "kind": "Service",
        "apiVersion": "v1",
        "metadata": {
            "name": "web",
            "namespace": "prod",
            "uid": "u1",
            # the older of two Services claiming one virtual server keeps it
            "creationTimestamp": "2024-01-01T00:00:00Z",
            "labels": {"service.kubernetes.io/service-proxy-name": "other"},
            "annotations": {
                "ipvsctl.io/scheduler": "wrr",
                "ipvsctl.io/drain-timeout": "60",
                "kube-router.io/service.scheduler": "lc",
            },
        },
        "spec": {
            k: v
            for k, v in obj["spec"].items()
            if k not in ("ipFamilyPolicy", "selector", "allocateLoadBalancerNodePorts")
        },
        "status": {"loadBalancer": {"ingress": [{"ip": "198.51.100.1"}]}},
    }


def test_trim_service_minimal_and_equal_across_resource_versions() -> None:
    a = trim_service({"metadata": {"name": "x", "resourceVersion": "1"}, "spec": {}})
    b = trim_service(
        {
            "metadata": {"name": "x", "resourceVersion": "2", "managedFields": MANAGED},
            "spec": {},
            "status": {},
        }
    )
    assert a == b == {"kind": "Service", "apiVersion": "v1", "metadata": {"name": "x"}, "spec": {}}


def test_trim_endpoint_slice() -> None:
    obj = {
        "metadata": {
            "name": "web-abc",
            "namespace": "prod",
            "labels": {"kubernetes.io/service-name": "web"},
            "managedFields": MANAGED,
            "resourceVersion": "9",
            "ownerReferences": [{"kind": "Service"}],
        },
        "addressType": "IPv4",
        "ports": [{"name": "http", "protocol": "TCP", "port": 8080, "appProtocol": "http"}],
        "endpoints": [
            {
                "addresses": ["10.244.1.5"],
                "conditions": {"ready": False, "serving": True, "terminating": True},
                "nodeName": "node-1",
                "zone": "a",
                "hostname": "h",
                "hints": {"forZones": [{"name": "a"}]},
                "targetRef": {
                    "kind": "Pod",
                    "namespace": "prod",
                    "name": "web-1",
                    "uid": "u",
                    "resourceVersion": "77",
                },
            },
            {"addresses": ["10.244.1.6"]},
        ],
    }
    assert trim_endpoint_slice(obj) == {
        "kind": "EndpointSlice",
        "apiVersion": "discovery.k8s.io/v1",
        "metadata": {
            "name": "web-abc",
            "namespace": "prod",
            "labels": {"kubernetes.io/service-name": "web"},
        },
        "addressType": "IPv4",
        "ports": obj["ports"],
        "endpoints": [
            {
                "addresses": ["10.244.1.5"],
                "conditions": {"ready": False, "serving": True, "terminating": True},
                "nodeName": "node-1",
                "hints": {"forZones": [{"name": "a"}]},  # topology (plan.topology)
                "targetRef": {"kind": "Pod", "namespace": "prod", "name": "web-1", "uid": "u"},
            },
            {"addresses": ["10.244.1.6"]},
        ],
    }


def test_trim_endpoint_slice_shares_repeated_values() -> None:
    eps = [
        {
            "addresses": [f"10.0.0.{i}"],
            "nodeName": "node-" + "1" * (i // 10 + 1),
            "conditions": {"ready": True, "serving": True, "terminating": False},
        }
        for i in range(3)
    ]
    out = trim_endpoint_slice({"metadata": {"name": "s"}, "endpoints": eps})["endpoints"]
    assert out[0]["conditions"] is out[1]["conditions"] is out[2]["conditions"]
    assert out[0]["conditions"] == {"ready": True, "serving": True, "terminating": False}
    assert out[0]["nodeName"] is out[2]["nodeName"]
    odd = {"ready": True, "serving": [1]}  # unhashable: passed through, not shared
    out = trim_endpoint_slice({"metadata": {"name": "s"}, "endpoints": [{"conditions": odd}]})[
        "endpoints"
    ]
    assert out[0]["conditions"] is odd


def test_trim_endpoint_slice_passes_malformed_parts_through_for_validation() -> None:
    out = trim_endpoint_slice({"metadata": {"name": "s"}, "endpoints": "bad"})
    assert out["endpoints"] == "bad"
    assert trim_endpoint_slice({"metadata": {"name": "s"}, "endpoints": [7]})["endpoints"] == [7]


def test_backoff_doubles_to_the_cap_with_jitter_and_resets() -> None:
    b = Backoff(0.5, 30.0, jitter=0.2, rng=random.Random(1))
    delays = [b.next() for _ in range(10)]
    for d, base in zip(delays, [0.5, 1, 2, 4, 8, 16, 30, 30, 30, 30], strict=True):
        assert 0.8 * base <= d <= base
    assert delays[:7] == sorted(delays[:7])
    b.reset()
    assert b.next() <= 0.5


def test_backoff_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        Backoff(0, 1)
    with pytest.raises(ValueError):
        Backoff(2, 1)


def test_iter_lines_splits_across_chunks() -> None:
    chunks = [b'{"a":1}\n{"b"', b":2}\n\n", b'{"c":3}\n{"d":4}\n', b"", b'{"e":5}']
    assert list(iter_lines(iter(chunks))) == [
        b'{"a":1}',
        b'{"b":2}',
        b'{"c":3}',
        b'{"d":4}',
        b'{"e":5}',
    ]


def test_gc_paused_nests_and_restores() -> None:
    import gc

    from ipvsctl.obs.gcpause import paused as gc_paused

    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()  # it only re-enables what it disabled
    finally:
        gc.enable()

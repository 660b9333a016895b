"""A live cluster's dump as `kubectl get nodes,svc,endpointslices -A -o yaml|json` prints it:
one `kind: List`, every object as the API server stores it (managedFields, kubectl's
last-applied annotation, owner references, statuses), keys sorted as kubectl sorts them.
The input of `plan`'s memory and time benchmark (bench/plan_memory.py) and its regression
test. Object sizes are those of a real cluster's (bench/control_plane.py TYPICAL_BYTES:
Service ~1.5 kB, EndpointSlice of 10 endpoints ~3 kB, as JSON)."""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

JSON = dict[str, Any]
NODES = 50
_TIME = "2026-01-01T00:00:00Z"


def _node(i: int) -> JSON:
    name = f"node-{i}"
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
            "creationTimestamp": _TIME,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "topology.kubernetes.io/zone": f"zone-{i % 3}",
            },
            "name": name,
            "resourceVersion": str(1000 + i),
            "uid": f"00000000-0000-4000-8000-{i:012d}",
        },
        "spec": {"podCIDR": f"10.244.{i}.0/24", "podCIDRs": [f"10.244.{i}.0/24"]},
        "status": {
            "addresses": [
                {
                    "address": str(
                        ipaddress.IPv4Address(int(ipaddress.IPv4Address("192.0.2.0")) + i)
                    ),
                    "type": "InternalIP",
                },
                {"address": name, "type": "Hostname"},
            ],
            "conditions": [
                {
                    "lastHeartbeatTime": _TIME,
                    "lastTransitionTime": _TIME,
                    "message": m,
                    "reason": r,
                    "status": s,
                    "type": t,
                }
                for t, s, r, m in (
                    (
                        "MemoryPressure",
                        "False",
                        "KubeletHasSufficientMemory",
                        "kubelet has sufficient memory available",
                    ),
                    (
                        "DiskPressure",
                        "False",
                        "KubeletHasNoDiskPressure",
                        "kubelet has no disk pressure",
                    ),
                    (
                        "PIDPressure",
                        "False",
                        "KubeletHasSufficientPID",
                        "kubelet has sufficient PID available",
                    ),
                    ("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
                )
            ],
            "images": [
                {
                    "names": [
                        f"registry.example/app-{k}@sha256:{k:064x}",
                        f"registry.example/app-{k}:v1",
                    ],
                    "sizeBytes": 50_000_000 + k,
                }
                for k in range(10)
            ],
            "nodeInfo": {
                "architecture": "amd64",
                "kernelVersion": "6.1.0-18-amd64",
                "kubeletVersion": "v1.31.0",
                "osImage": "Debian GNU/Linux 12",
            },
        },
    }


def _service(i: int, ns: str, name: str, ip: str) -> JSON:
    applied = json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"annotations": {}, "labels": {"app": name}, "name": name, "namespace": ns},
            "spec": {
                "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}],
                "selector": {"app": name},
            },
        },
        separators=(",", ":"),
    )
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": applied + "\n"},
            "creationTimestamp": _TIME,
            "labels": {"app": name},
            "managedFields": [
                {
                    "apiVersion": "v1",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {
                        "f:metadata": {
                            "f:annotations": {
                                ".": {},
                                "f:kubectl.kubernetes.io/last-applied-configuration": {},
                            },
                            "f:labels": {".": {}, "f:app": {}},
                        },
                        "f:spec": {
                            "f:internalTrafficPolicy": {},
                            "f:ports": {
                                ".": {},
                                'k:{"port":80,"protocol":"TCP"}': {
                                    ".": {},
                                    "f:name": {},
                                    "f:port": {},
                                    "f:protocol": {},
                                    "f:targetPort": {},
                                },
                            },
                            "f:selector": {},
                            "f:sessionAffinity": {},
                            "f:type": {},
                        },
                    },
                    "manager": "kubectl-client-side-apply",
                    "operation": "Update",
                    "time": _TIME,
                }
            ],
            "name": name,
            "namespace": ns,
            "resourceVersion": str(100_000 + i),
            "uid": f"11111111-0000-4000-8000-{i:012d}",
        },
        "spec": {
            "clusterIP": ip,
            "clusterIPs": [ip],
            "internalTrafficPolicy": "Cluster",
            "ipFamilies": ["IPv4"],
            "ipFamilyPolicy": "SingleStack",
            "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}],
            "selector": {"app": name},
            "sessionAffinity": "None",
            "type": "ClusterIP",
        },
        "status": {"loadBalancer": {}},
    }


def _slice(i: int, ns: str, name: str, e: int) -> JSON:
    pod_base = int(ipaddress.IPv4Address("10.128.0.0")) + i * e
    return {
        "addressType": "IPv4",
        "apiVersion": "discovery.k8s.io/v1",
        "endpoints": [
            {
                "addresses": [str(ipaddress.IPv4Address(pod_base + j))],
                "conditions": {"ready": True, "serving": True, "terminating": False},
                "nodeName": f"node-{j % NODES}",
                "targetRef": {
                    "kind": "Pod",
                    "name": f"{name}-7d9f8b6c5-{j:05d}",
                    "namespace": ns,
                    "uid": f"22222222-{i:04x}-4000-8000-{j:012d}",
                },
                "zone": f"zone-{j % 3}",
            }
            for j in range(e)
        ],
        "kind": "EndpointSlice",
        "metadata": {
            "annotations": {"endpoints.kubernetes.io/last-change-trigger-time": _TIME},
            "creationTimestamp": _TIME,
            "generateName": f"{name}-",
            "generation": 1,
            "labels": {
                "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
                "kubernetes.io/service-name": name,
            },
            "managedFields": [
                {
                    "apiVersion": "discovery.k8s.io/v1",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {
                        "f:addressType": {},
                        "f:endpoints": {},
                        "f:metadata": {
                            "f:annotations": {
                                ".": {},
                                "f:endpoints.kubernetes.io/last-change-trigger-time": {},
                            },
                            "f:generateName": {},
                            "f:labels": {
                                ".": {},
                                "f:endpointslice.kubernetes.io/managed-by": {},
                                "f:kubernetes.io/service-name": {},
                            },
                            "f:ownerReferences": {
                                ".": {},
                                f'k:{{"uid":"11111111-0000-4000-8000-{i:012d}"}}': {},
                            },
                        },
                        "f:ports": {},
                    },
                    "manager": "kube-controller-manager",
                    "operation": "Update",
                    "time": _TIME,
                }
            ],
            "name": f"{name}-x{i:05x}",
            "namespace": ns,
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "blockOwnerDeletion": True,
                    "controller": True,
                    "kind": "Service",
                    "name": name,
                    "uid": f"11111111-0000-4000-8000-{i:012d}",
                }
            ],
            "resourceVersion": str(200_000 + i),
            "uid": f"33333333-0000-4000-8000-{i:012d}",
        },
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
    }


def items(services: int, endpoints_per_service: int, *, namespaces: int = 10) -> Iterator[JSON]:
    """Nodes, then Services, then EndpointSlices, as `kubectl get nodes,svc,endpointslices`
    orders them."""
    yield from (_node(i) for i in range(NODES))
    vip = int(ipaddress.IPv4Address("10.96.0.0"))
    for i in range(services):
        yield _service(
            i, f"ns-{i % namespaces}", f"svc-{i}", str(ipaddress.IPv4Address(vip + 1 + i))
        )
    for i in range(services):
        yield _slice(i, f"ns-{i % namespaces}", f"svc-{i}", endpoints_per_service)


def write(path: Path, services: int, endpoints_per_service: int) -> Path:
    """The dump as JSON (kubectl's 4-space indent) or YAML (by the suffix), written one item at
    a time (the whole List never in this process's memory)."""
    tail = ',\n    "kind": "List",\n    "metadata": {\n        "resourceVersion": ""\n    }\n}\n'
    with path.open("w", encoding="utf-8") as out:
        if path.suffix == ".json":
            out.write('{\n    "apiVersion": "v1",\n    "items": [\n')
            for n, item in enumerate(items(services, endpoints_per_service)):
                text = json.dumps(item, indent=4, sort_keys=True)
                out.write(
                    (",\n" if n else "") + "\n".join("        " + ln for ln in text.split("\n"))
                )
            out.write("\n    ]" + tail)
        else:
            dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
            out.write("apiVersion: v1\nitems:\n")
            for item in items(services, endpoints_per_service):
                text = yaml.dump([item], Dumper=dumper, default_flow_style=False, sort_keys=True)
                out.write(text)
            out.write('kind: List\nmetadata:\n  resourceVersion: ""\n')
    return path

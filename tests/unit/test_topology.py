"""Topology hints and trafficDistribution, as kube-proxy's CategorizeEndpoints
(pkg/proxy/topology.go, TestCategorizeEndpoints): table cases through the real conversion
and planner, this node's zone from a `kind: Node` as `plan` reads it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from devkit.builders import endpoint, endpoint_slice, service, terminating
from ipvsctl.cli.render import plan_json
from ipvsctl.model import NodeContext
from ipvsctl.reconcile.cluster import plan_objects
from ipvsctl.source.events import ObjectKind
from ipvsctl.source.hints import parse_hints

NODE = NodeContext("node-a", ("192.0.2.10",), "rr")


def node(name: str = "node-a", zone: str | None = "zone-a", **meta: Any) -> dict[str, Any]:
    labels = {"topology.kubernetes.io/zone": zone} if zone is not None else {}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, **meta},
    }


def ep(
    address: str,
    zones: list[str] | None = None,
    nodes: list[str] | None = None,
    ready: bool = True,
    on: str = "node-b",
    **kw: Any,
) -> dict[str, Any]:
    e = endpoint(address, ready=ready, node=on, **kw) if ready else terminating(address, node=on)
    hints: dict[str, Any] = {}
    if zones is not None:
        hints["forZones"] = [{"name": z} for z in zones]
    if nodes is not None:
        hints["forNodes"] = [{"name": n} for n in nodes]
    if zones is not None or nodes is not None:
        e["hints"] = hints
    return e


def plan(svc: dict, endpoints: list[dict], nodes: list[dict]) -> tuple[dict, list]:
    result, problems = plan_objects(
        {
            ObjectKind.NODE: nodes,
            ObjectKind.SERVICE: [svc],
            ObjectKind.ENDPOINT_SLICE: [endpoint_slice("web", endpoints)],
        },
        NODE,
    )
    out = {}
    for v in plan_json(result)["virtual_servers"]:
        out[f"{v['address']}:{v['port']}"] = sorted(r["address"] for r in v["real_servers"])
    return out, problems


@dataclass
class Case:
    name: str
    endpoints: list[dict]
    want: list[str]  # the cluster IP's real servers
    nodes: list[dict] = field(default_factory=lambda: [node()])
    spec: dict[str, Any] = field(default_factory=dict)
    want_external: list[str] | None = None  # with an external IP: its real servers
    problems: int = 0


CASES = [
    Case("no hints, no filtering", [ep("10.0.0.1"), ep("10.0.0.2")], ["10.0.0.1", "10.0.0.2"]),
    Case(
        "normal endpoint filtering by zone",
        [
            ep("10.0.0.1", ["zone-a"]),
            ep("10.0.0.2", ["zone-b"]),
            ep("10.0.0.3", ["zone-c"]),
            ep("10.0.0.4", ["zone-a"]),
        ],
        ["10.0.0.1", "10.0.0.4"],
    ),
    Case(
        "PreferClose and PreferSameZone filter the same way",
        [ep("10.0.0.1", ["zone-a"]), ep("10.0.0.2", ["zone-b"])],
        ["10.0.0.1"],
        spec={"trafficDistribution": "PreferClose"},
    ),
    Case(
        "multiple zone hints per endpoint",
        [
            ep("10.0.0.1", ["zone-a", "zone-b"]),
            ep("10.0.0.2", ["zone-b"]),
            ep("10.0.0.3", ["zone-c", "zone-a"]),
        ],
        ["10.0.0.1", "10.0.0.3"],
    ),
    Case(
        "node without a zone label: no filtering",
        [ep("10.0.0.1", ["zone-a"]), ep("10.0.0.2", ["zone-b"])],
        ["10.0.0.1", "10.0.0.2"],
        nodes=[node(zone=None)],
    ),
    Case(
        "no Node object at all: no filtering",
        [ep("10.0.0.1", ["zone-a"]), ep("10.0.0.2", ["zone-b"])],
        ["10.0.0.1", "10.0.0.2"],
        nodes=[],
    ),
    Case(
        "another node's Node is not ours",
        [ep("10.0.0.1", ["zone-a"]), ep("10.0.0.2", ["zone-b"])],
        ["10.0.0.1", "10.0.0.2"],
        nodes=[node("node-b", "zone-a")],
    ),
    Case(
        "node in a zone no endpoint is hinted for: no filtering",
        [ep("10.0.0.1", ["zone-b"]), ep("10.0.0.2", ["zone-c"])],
        ["10.0.0.1", "10.0.0.2"],
    ),
    Case(
        "one ready endpoint without hints: no filtering",
        [ep("10.0.0.1", ["zone-a"]), ep("10.0.0.2", ["zone-b"]), ep("10.0.0.3")],
        ["10.0.0.1", "10.0.0.2", "10.0.0.3"],
    ),
    Case(
        "an unready endpoint without hints does not matter",
        [ep("10.0.0.1", ["zone-a"]), ep("10.0.0.2", ["zone-b"]), ep("10.0.0.3", ready=False)],
        ["10.0.0.1"],
    ),
    Case(
        "no ready endpoints: serving terminating ones, topology ignored",
        [ep("10.0.0.1", ready=False), ep("10.0.0.2", ready=False)],
        ["10.0.0.1", "10.0.0.2"],
    ),
    Case(
        "node hints checked before zone hints",
        [
            ep("10.0.0.1", ["zone-a"], ["node-a"]),
            ep("10.0.0.2", ["zone-a"], ["node-c"]),
            ep("10.0.0.3", ["zone-b"], ["node-b"]),
        ],
        ["10.0.0.1"],
        spec={"trafficDistribution": "PreferSameNode"},
    ),
    Case(
        "node hints for other nodes only: fall back to zone hints",
        [
            ep("10.0.0.1", ["zone-a"], ["node-c"]),
            ep("10.0.0.2", ["zone-a"], ["node-d"]),
            ep("10.0.0.3", ["zone-b"], ["node-b"]),
        ],
        ["10.0.0.1", "10.0.0.2"],
    ),
    Case(
        "node hints on some endpoints only: zone hints",
        [
            ep("10.0.0.1", ["zone-a"], ["node-a"]),
            ep("10.0.0.2", ["zone-a"]),
            ep("10.0.0.3", ["zone-b"]),
        ],
        ["10.0.0.1", "10.0.0.2"],
    ),
    Case(
        "node hints without a zone",
        [ep("10.0.0.1", nodes=["node-a"]), ep("10.0.0.2", nodes=["node-b"])],
        ["10.0.0.1"],
        nodes=[],
    ),
    Case(
        "internalTrafficPolicy Local ignores topology",
        [ep("10.0.0.1", ["zone-b"], on="node-a"), ep("10.0.0.2", ["zone-a"], on="node-b")],
        ["10.0.0.1"],
        spec={"internalTrafficPolicy": "Local"},
    ),
    Case(
        "externalTrafficPolicy Local: topology for the cluster IP only",
        [ep("10.0.0.1", ["zone-b"], on="node-a"), ep("10.0.0.2", ["zone-a"], on="node-b")],
        ["10.0.0.2"],
        spec={"externalTrafficPolicy": "Local", "type": "NodePort", "externalIPs": ["203.0.113.7"]},
        want_external=["10.0.0.1"],
    ),
    Case(
        "externalTrafficPolicy Cluster: topology for external addresses too",
        [ep("10.0.0.1", ["zone-b"]), ep("10.0.0.2", ["zone-a"])],
        ["10.0.0.2"],
        spec={"externalIPs": ["203.0.113.7"]},
        want_external=["10.0.0.2"],
    ),
    Case(
        "unknown trafficDistribution: warning, no topology, Service kept",
        [ep("10.0.0.1", ["zone-a"]), ep("10.0.0.2", ["zone-b"])],
        ["10.0.0.1", "10.0.0.2"],
        spec={"trafficDistribution": "PreferFarAway"},
        problems=1,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_categorize_endpoints(case: Case) -> None:
    got, problems = plan(service("web", **case.spec), case.endpoints, case.nodes)
    assert got["10.96.0.10:80"] == case.want
    if case.want_external is not None:
        assert got["203.0.113.7:80"] == case.want_external
    assert len(problems) == case.problems, problems
    assert all(not p.fatal for p in problems)


@pytest.mark.parametrize(
    "hints",
    [
        "zone-a",
        {"forZones": "zone-a"},
        {"forZones": [{"name": ""}]},
        {"forZones": ["zone-a"]},
        {"forNodes": [{"nom": "node-a"}]},
    ],
)
def test_malformed_hints_are_a_warning_and_no_topology(hints: Any) -> None:
    good = ep("10.0.0.1", ["zone-a"])
    bad = ep("10.0.0.2", ["zone-b"])
    bad["hints"] = hints
    got, problems = plan(service("web"), [good, bad], [node()])
    assert got["10.96.0.10:80"] == ["10.0.0.1", "10.0.0.2"]  # not narrowed, not skipped
    assert [(p.kind, p.fatal) for p in problems] == [(ObjectKind.ENDPOINT_SLICE, False)]
    assert "hints ignored" in problems[0].reason


def test_equal_hints_are_shared_between_endpoints() -> None:
    a, _ = parse_hints({"forZones": [{"name": "zone-a"}]}, "h")
    b, _ = parse_hints({"forZones": [{"name": "zone-a"}]}, "h")
    assert a is b and a is not None and a.zones == {"zone-a"}
    assert parse_hints({"forZones": []}, "h") == (None, None)

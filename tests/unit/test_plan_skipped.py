"""`ipvsctl plan` says what it leaves out: every object read that makes no virtual server,
with why, listed by `-o wide` and `-o json` (`skipped`) and counted in one line by the
default view; and what it serves shows its healthCheckNodePort, drain timeout, scheduler
flags, and why a Local virtual server has cluster-wide endpoints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ipvsctl.cli.app import app
from ipvsctl.model import ServiceRef
from ipvsctl.model.keys import Protocol
from ipvsctl.model.objects import ServiceInfo, ServicePortInfo, SliceInfo
from ipvsctl.plan.skipped import (
    EXTERNAL_NAME,
    FQDN_SLICE,
    HEADLESS,
    NO_CLUSTER_IP,
    NO_PORTS,
    NO_SERVICE_LABEL,
    NO_VIRTUAL_SERVER,
    Skipped,
    service_reason,
    skipped_objects,
    slice_reason,
)

CASE = Path(__file__).parents[1] / "golden" / "plan" / "skipped-objects" / "objects.yaml"
REF = ServiceRef("shop", "web")
PORT = (ServicePortInfo("http", Protocol.TCP, 80),)


@pytest.mark.parametrize(
    ("svc", "problems", "headless", "why"),
    [
        (ServiceInfo(REF, type="ExternalName"), [], False, EXTERNAL_NAME),
        (ServiceInfo(REF, ports=PORT), [], True, HEADLESS),
        (ServiceInfo(REF, cluster_ips=("10.96.0.1",)), [], False, NO_PORTS),
        (ServiceInfo(REF, ports=PORT), [], False, NO_CLUSTER_IP),
        (ServiceInfo(REF, cluster_ips=("10.96.0.1",), ports=PORT), [], False, NO_VIRTUAL_SERVER),
        (
            ServiceInfo(REF, cluster_ips=("10.96.0.1",), ports=PORT),
            [
                "virtual server 10.96.0.1:80/TCP is a/b's",
                "virtual server 10.96.0.1:80/TCP is a/b's",
            ],
            False,
            "virtual server 10.96.0.1:80/TCP is a/b's",
        ),
    ],
)
def test_a_service_that_serves_nothing_says_why(svc, problems, headless, why):
    assert service_reason(svc, problems, headless) == why


@pytest.mark.parametrize(
    ("sl", "why"),
    [
        (SliceInfo("shop", "web-1", "web", 4), None),
        (SliceInfo("shop", "web-1", "web", None), FQDN_SLICE),
        (SliceInfo("shop", "x-1", None, 4), NO_SERVICE_LABEL),
        (SliceInfo("shop", "db-1", "db", 4), "its Service shop/db is skipped"),
        (SliceInfo("shop", "lost-1", "lost", 4), "its Service shop/lost is not in the input"),
    ],
)
def test_a_slice_of_no_served_service_says_why(sl, why):
    services = {REF, ServiceRef("shop", "db")}
    assert slice_reason(sl, services, {ServiceRef("shop", "db")}) == why


def test_a_set_aside_services_slices_are_skipped_with_it():
    aside = Skipped("Service", "shop", "other", "another proxy's")
    out = skipped_objects({}, (), {}, [SliceInfo("shop", "other-1", "other", 4)], [aside])
    assert out == [
        Skipped("EndpointSlice", "shop", "other-1", "its Service shop/other is skipped"),
        aside,
    ]


def plan(*args: str, path: Path = CASE) -> str:
    r = CliRunner().invoke(
        app, ["plan", "-f", str(path), "--node-name", "node-a", "--node-ip", "192.0.2.10", *args]
    )
    assert r.exit_code == 0, r.output
    return r.stdout


EXPECTED = {
    ("Service", "shop/db"): "headless",
    ("Service", "shop/ext"): "ExternalName",
    ("Service", "shop/other"): "service-proxy-name=cilium",
    ("Service", "shop/bad"): "unknown type 'Wormhole'",
    ("EndpointSlice", "shop/db-1"): "its Service shop/db is skipped",
    ("EndpointSlice", "shop/lost-1"): "its Service shop/lost is not in the input",
    ("ConfigMap", "shop/settings"): "not read by ipvsctl",
    ("Node", "node-b"): "another node's Node",
}


def test_json_lists_every_object_that_makes_no_virtual_server_with_why():
    doc = json.loads(plan("-o", "json"))
    got = {
        (s["kind"], f"{s['namespace']}/{s['name']}" if s["namespace"] else s["name"]): s["reason"]
        for s in doc["skipped"]
    }
    assert got.keys() == EXPECTED.keys()
    for key, words in EXPECTED.items():
        assert words in got[key], (key, got[key])
    assert {v["service"] for v in doc["virtual_servers"]} == {"shop/web"}


def test_wide_shows_the_same_list_and_the_default_view_counts_it():
    doc = json.loads(plan("-o", "json"))
    wide = plan("-o", "wide").splitlines()
    listed = wide[wide.index("") + 2 :]
    assert len(listed) == len(doc["skipped"])
    for line, s in zip(listed, doc["skipped"], strict=True):
        assert line.startswith(s["kind"]) and line.endswith(s["reason"])
    last = plan().splitlines()[-1]
    assert last == (
        "skipped 8 (no virtual server): 1 ConfigMap, 2 EndpointSlice, 1 Node, 4 Service;"
        " -o wide says why"
    )


def test_a_document_that_is_no_object_is_listed(tmp_path):
    f = tmp_path / "x.yaml"
    f.write_text("just a string\n---\n- a\n- list\n")
    doc = json.loads(plan("-o", "json", path=f))
    assert doc == {
        "virtual_servers": [],
        "skipped": [
            {
                "kind": "",
                "namespace": "",
                "name": f"document {n} of {f}",
                "reason": "not a Kubernetes object",
            }
            for n in (1, 2)
        ],
    }
    assert (
        plan(path=f)
        == "no virtual servers\nskipped 2 (no virtual server): 2 non-object; -o wide says why\n"
    )


def test_what_it_serves_shows_health_check_drain_timeout_flags_and_local_fallback():
    vss = {v["kind"]: v for v in json.loads(plan("-o", "json"))["virtual_servers"]}
    assert {v["health_check_node_port"] for v in vss.values()} == {32001}
    assert {v["drain_timeout"] for v in vss.values()} == {45.0}
    assert {v["scheduler"] for v in vss.values()} == {"mh"}
    # Local, and the only endpoint is on node-b: the cluster-wide endpoint, said so
    assert [k for k, v in vss.items() if v["traffic_policy_local_fallback"]] == [
        "NodePort",
        "LoadBalancer",
    ]
    text = plan()
    assert text.count("mh(mh-port)") == 3
    assert text.count("(Local, but no endpoint on node-a: the cluster-wide ones") == 2
    wide = plan("-o", "wide")
    assert "32001" in wide and "45s" in wide

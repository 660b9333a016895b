"""One copy of what many endpoints repeat (memory): the sharing must never make
two different values equal, nor two equal values different."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from devkit.builders import endpoint, endpoint_slice, service
from devkit.harness import Harness
from ipvsctl.model import NodeContext, PodRef, Protocol, RealServerKey, ServiceKey, normalize_ip
from ipvsctl.persist.drain_state import DrainStateFile
from ipvsctl.plan.conflicts import Claims, claims_of
from ipvsctl.plan.desired import build_desired_service
from ipvsctl.source import shared
from ipvsctl.source.convert import parse_endpoint_slice, parse_service

NODE = NodeContext("node-a", ("192.0.2.10",))


def decoded(obj: dict[str, Any]) -> dict[str, Any]:
    """As the API's JSON arrives: every string value a new object (literals are shared)."""
    return json.loads(json.dumps(obj))


def test_endpoints_share_their_node_names_namespaces_and_port_names():
    eps = [endpoint(f"10.244.0.{i}", node="node-b", pod=f"web-{i}", uid=f"u{i}") for i in (1, 2)]
    a = parse_endpoint_slice(decoded(endpoint_slice("web", eps))).value
    b = parse_endpoint_slice(decoded(endpoint_slice("web", eps, name="web-xyz"))).value
    nodes = {id(ep.node_name) for sl in (a, b) for ep in sl.endpoints}
    namespaces = {
        id(x) for sl in (a, b) for x in (sl.namespace, *(e.pod.namespace for e in sl.endpoints))
    }
    assert len(nodes) == 1 and len(namespaces) == 1
    assert a.ports[0].name is b.ports[0].name
    svc = parse_service(decoded(service("web"))).value
    assert svc.ref.namespace is a.namespace and svc.ports[0].name is a.ports[0].name


def test_a_slice_differing_only_in_a_shared_field_is_a_change():
    before = parse_endpoint_slice(decoded(endpoint_slice("web", [endpoint("10.244.0.1")])))
    moved = parse_endpoint_slice(
        decoded(endpoint_slice("web", [endpoint("10.244.0.1", node="node-b")]))
    )
    renamed = endpoint_slice("web", [endpoint("10.244.0.1")])
    renamed["ports"][0]["name"] = "https"
    again = parse_endpoint_slice(decoded(endpoint_slice("web", [endpoint("10.244.0.1")])))
    assert before.value.endpoints[0].node_name == "node-a"
    assert moved.value.endpoints[0].node_name == "node-b"
    assert moved.value != before.value
    assert parse_endpoint_slice(decoded(renamed)).value != before.value
    assert again.value == before.value


def test_two_pods_of_one_name_with_different_uids_still_differ():
    one = parse_endpoint_slice(
        decoded(endpoint_slice("web", [endpoint("10.244.0.1", pod="web-0", uid="uid-1")]))
    ).value
    other = parse_endpoint_slice(
        decoded(endpoint_slice("web", [endpoint("10.244.0.1", pod="web-0", uid="uid-2")]))
    ).value
    assert one.endpoints[0].pod != other.endpoints[0].pod
    assert not one.endpoints[0].pod.same_pod(other.endpoints[0].pod)
    assert one != other


def test_a_pod_in_another_namespace_keeps_its_namespace():
    sl = parse_endpoint_slice(
        decoded(endpoint_slice("web", [endpoint("10.244.0.1", pod="p", namespace="other")]))
    ).value
    assert sl.namespace == "default" and sl.endpoints[0].pod.namespace == "other"


def test_the_table_is_bounded_and_starts_again_when_full(monkeypatch):
    monkeypatch.setattr(shared, "_table", {})
    monkeypatch.setattr(shared, "MAX_SHARED", 3)
    first = shared.share("".join(["node-", "1"]))
    assert shared.share("".join(["node-", "1"])) is first
    for i in range(2, 5):
        shared.share(f"node-{i}")
    assert len(shared._table) <= 3
    fresh = "".join(["node-", "1"])
    assert shared.share(fresh) == first  # equal either way; the copy is what was dropped
    assert shared.share("".join(["node-", "1"])) is shared.share(fresh)


def test_real_servers_are_sorted_whatever_the_slices_order():
    svc = parse_service(service("web")).value
    addresses = ["10.244.0.10", "10.244.0.2", "10.244.0.100", "10.244.0.9"]
    one = parse_endpoint_slice(endpoint_slice("web", [endpoint(a) for a in addresses])).value
    other = parse_endpoint_slice(
        endpoint_slice("web", [endpoint(a) for a in reversed(addresses)])
    ).value
    a, b = (build_desired_service(svc, [sl], NODE) for sl in (one, other))
    (dvs,) = a.virtual_servers.values()
    assert dvs.real_servers == tuple(sorted(RealServerKey(x, 8080) for x in addresses))
    assert a == b


def test_external_addresses_share_the_cluster_real_servers():
    svc = parse_service(service("web", type="NodePort", externalIPs=["192.0.2.99"])).value
    sl = parse_endpoint_slice(endpoint_slice("web", [endpoint("10.244.0.1")])).value
    desired = build_desired_service(svc, [sl], NODE)
    sets = [dvs.real_servers for dvs in desired.virtual_servers.values()]
    assert len(sets) == 2 and sets[0] == (RealServerKey("10.244.0.1", 8080),)
    assert sets[0] is sets[1]


def test_claims_are_replaced_and_released():
    svc = parse_service(service("web")).value
    desired = build_desired_service(svc, [], NODE)
    claims = Claims()
    assert claims.update(svc.ref, claims_of(desired, None)) == set()
    assert claims.by_ref[svc.ref] == tuple(desired.virtual_servers)
    claims.update(svc.ref, {})
    assert claims.by_key == {} and claims.by_ref == {}


def test_a_drained_endpoint_keeps_its_pod_and_the_state_file_round_trips(tmp_path: Path):
    key, rs = ServiceKey(Protocol.TCP, "10.96.0.10", 80), RealServerKey("10.244.0.1", 8080)
    h = Harness()
    gone = endpoint("10.244.0.1", pod="web-0", namespace="other", uid="uid-1")
    h.start(
        [decoded(service("web"))],
        [decoded(endpoint_slice("web", [gone, endpoint("10.244.0.2", pod="web-1")]))],
    )
    h.fake.set_connections(key, rs, active=1, inactive=0)
    h.upsert(decoded(endpoint_slice("web", [endpoint("10.244.0.2", pod="web-1")])))
    (entry,) = h.engine.drains.queue.entries()
    assert entry.rs == rs and entry.pod == PodRef("other", "web-0", "uid-1")
    f = DrainStateFile(tmp_path)
    f.save([entry])
    assert f.load() == [entry]


def test_an_endpoint_without_a_pod_target_has_no_pod():
    node = endpoint("10.244.0.1")
    node["targetRef"] = {"kind": "Node", "name": "node-a"}
    sl = parse_endpoint_slice(decoded(endpoint_slice("web", [node, endpoint("10.244.0.2")])))
    assert [ep.pod for ep in sl.value.endpoints] == [None, None]
    named = parse_endpoint_slice(decoded(endpoint_slice("web", [endpoint("10.244.0.1", pod="p")])))
    assert named.value.endpoints[0].pod == PodRef("default", "p", "")
    assert named.value != sl.value


def test_an_address_already_in_its_normal_form_is_kept_not_copied():
    for text in ("10.244.0.1", "2001:db8::1"):
        raw = json.loads(json.dumps(text))
        assert normalize_ip(raw) is raw
    assert normalize_ip("2001:DB8:0::1") == "2001:db8::1"
    assert normalize_ip(" 10.0.0.1 ") == "10.0.0.1"

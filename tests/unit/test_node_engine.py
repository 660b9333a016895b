"""This node's Node in the engine: its zone narrows hinted Services incrementally (only the
Services whose slices carry hints are rebuilt), its deletion and taint are kept for the
health server, and a source that sends Nodes holds the first sync until it has."""

from __future__ import annotations

from typing import Any

from devkit.builders import endpoint, endpoint_slice, service
from devkit.harness import NODE, Harness, rs, vs
from ipvsctl.kernel.fake import FakeKernel
from ipvsctl.model import ServiceRef
from ipvsctl.obs.metrics import Metrics
from ipvsctl.reconcile.clock import ManualClock
from ipvsctl.reconcile.engine import Engine, EngineConfig
from ipvsctl.source.events import Delete, ObjectKind, Replace, Upsert
from ipvsctl.source.node import DEFAULT_DRAINING_TAINTS, leaving_reasons

NODE_KIND = ObjectKind.NODE


def leaving(h: Harness) -> tuple[str, ...]:
    return leaving_reasons(h.engine.intake.store.node, DEFAULT_DRAINING_TAINTS)


def node(
    zone: str | None = "zone-a",
    name: str = "node-a",
    taint: str | None = None,
    deleting: bool = False,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": {}}
    if zone:
        meta["labels"]["topology.kubernetes.io/zone"] = zone
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    obj: dict[str, Any] = {"apiVersion": "v1", "kind": "Node", "metadata": meta}
    if taint:
        obj["spec"] = {"taints": [{"key": taint, "effect": "NoSchedule"}]}
    return obj


def hinted(address: str, zone: str) -> dict[str, Any]:
    e = endpoint(address, node="node-b")
    e["hints"] = {"forZones": [{"name": zone}]}
    return e


def two_services() -> tuple[list[dict], list[dict]]:
    services = [service("web"), service("plain", cluster_ip="10.96.0.11")]
    slices = [
        endpoint_slice("web", [hinted("10.244.1.1", "zone-a"), hinted("10.244.2.1", "zone-b")]),
        endpoint_slice("plain", [endpoint("10.244.3.1"), endpoint("10.244.3.2")]),
    ]
    return services, slices


def test_zone_change_rebuilds_only_hinted_services_and_drains_gracefully() -> None:
    h = Harness()
    h.engine.handle(Replace(NODE_KIND, [node("zone-a")], 0.0))
    h.start(*two_services())
    assert h.engine.config.node.zone == "zone-a"
    assert h.fake.weight(vs(), rs("10.244.1.1")) == 1
    assert h.fake.weight(vs(), rs("10.244.2.1")) is None
    h.ops()

    h.upsert(node("zone-b"), sync=False)
    assert h.engine.dirty == {ServiceRef("default", "web")}  # not "plain": no hints
    h.engine.sync()
    # The zone-a endpoint drains (weight 0), the zone-b one is added; "plain" untouched.
    assert h.fake.weight(vs(), rs("10.244.2.1")) == 1
    assert h.fake.weight(vs(), rs("10.244.1.1")) == 0
    assert all("10.96.0.11" not in op for op in h.ops())


def test_unchanged_node_updates_cost_nothing() -> None:
    h = Harness()
    h.start(*two_services())
    h.upsert(node("zone-a"), sync=False)
    assert h.engine.dirty  # the zone is new: the hinted Service is rebuilt
    h.engine.sync()
    other = node("zone-a")
    other["metadata"]["resourceVersion"] = "99"
    other["status"] = {"conditions": [{"type": "Ready", "status": "True"}]}
    h.upsert(other, sync=False)
    assert h.engine.dirty == set()


def test_other_nodes_are_ignored_and_deletion_clears_the_zone() -> None:
    h = Harness()
    h.engine.handle(Replace(NODE_KIND, [node("zone-b", name="node-b"), node("zone-a")], 0.0))
    h.start(*two_services())
    assert h.engine.config.node.zone == "zone-a"
    assert h.engine.intake.store.node is not None and leaving(h) == ()
    h.engine.handle(Delete(NODE_KIND, "default", "node-b", 1.0))
    assert h.engine.intake.store.node.present
    h.engine.handle(Delete(NODE_KIND, "default", "node-a", 1.0))
    assert h.engine.config.node.zone is None
    assert not h.engine.intake.store.node.present and leaving(h) == ("deleted",)
    h.engine.sync()  # without a zone: every endpoint
    assert h.fake.weight(vs(), rs("10.244.2.1")) == 1
    assert h.fake.weight(vs(), rs("10.244.1.1")) == 1


def test_leaving_follows_deletion_and_the_draining_taints() -> None:
    h = Harness()
    h.upsert(node(), sync=False)
    assert leaving(h) == ()
    h.upsert(node(taint="ToBeDeletedByClusterAutoscaler"), sync=False)
    assert leaving(h) == ("taint:ToBeDeletedByClusterAutoscaler",)
    h.upsert(node(taint="karpenter.sh/disrupted"), sync=False)
    assert leaving(h) == ("taint:karpenter.sh/disrupted",)
    h.upsert(node(taint="node.kubernetes.io/unschedulable"), sync=False)
    assert leaving(h) == ()
    h.upsert(node(deleting=True), sync=False)
    assert leaving(h) == ("deleting",)


def test_relist_without_our_node_means_it_was_deleted() -> None:
    h = Harness()
    h.engine.handle(Replace(NODE_KIND, [], 0.0))
    assert h.engine.intake.store.node is None  # never seen: unknown, not deleted
    h.engine.handle(Replace(NODE_KIND, [node()], 0.0))
    h.engine.handle(Replace(NODE_KIND, [], 0.0))
    assert h.engine.intake.store.node is not None and not h.engine.intake.store.node.present


def test_first_sync_waits_for_the_node_when_the_source_sends_one() -> None:
    kernel = FakeKernel()
    engine = Engine(
        kernel, EngineConfig(NODE, wait_for_node=True), clock=ManualClock(), metrics=Metrics()
    )
    services, slices = two_services()
    engine.handle(Replace(ObjectKind.SERVICE, services, 0.0))
    engine.handle(Replace(ObjectKind.ENDPOINT_SLICE, slices, 0.0))
    assert not engine.ready
    engine.sync()
    assert kernel.list_virtual_servers() == []
    engine.handle(Replace(NODE_KIND, [node("zone-b")], 0.0))
    assert engine.ready
    engine.sync()
    # Programmed once, already narrowed: the zone-a endpoint never went in.
    assert kernel.weight(vs(), rs("10.244.2.1")) == 1
    assert kernel.weight(vs(), rs("10.244.1.1")) is None


def test_a_bad_node_is_reported_and_ignored() -> None:
    h = Harness()
    bad = node()
    bad["metadata"]["labels"]["topology.kubernetes.io/zone"] = 7
    bad["spec"] = {"taints": "ToBeDeletedByClusterAutoscaler"}
    h.engine.handle(Upsert(NODE_KIND, bad, 0.0))
    assert h.metrics.value("ipvsctl_invalid_objects_total", {"kind": "Node"}) == 2
    assert h.engine.intake.store.node is not None and h.engine.intake.store.node.zone is None
    assert leaving(h) == ()


def test_pending_since_and_last_updated_follow_syncs() -> None:
    h = Harness()
    services, slices = two_services()
    h.engine.handle(Replace(ObjectKind.SERVICE, services, 5.0))
    assert h.engine.pending_since == 5.0 and h.engine.last_updated is None
    h.engine.handle(Replace(ObjectKind.ENDPOINT_SLICE, slices, 6.0))
    assert h.engine.pending_since == 5.0  # the oldest
    h.engine.sync()
    assert h.engine.pending_since is None and h.engine.last_updated == h.clock.wall()

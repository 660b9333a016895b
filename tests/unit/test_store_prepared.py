"""A Replace of prepared objects (parsed where the list was decoded, kube/watch.py) has the
same outcome as the same Replace of raw objects: every change, problem, warning, trigger and
synced kind, and the same store after it."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devkit.builders import endpoint, endpoint_slice, service
from ipvsctl.source.convert import SERVICE_PROXY_NAME_LABEL, TRIGGER_TIME_ANNOTATION
from ipvsctl.source.events import ObjectKind, PreparedReplace, Replace
from ipvsctl.source.prepare import Prepared, Preparer
from ipvsctl.source.store import ObjectStore, StoreChange
from tests.unit.test_hostile_manifests import HOSTILE, _json

SVC, EPS, NODE = ObjectKind.SERVICE, ObjectKind.ENDPOINT_SLICE, ObjectKind.NODE
CONFIGS = [
    {},
    {"default_scheduler": "wrr", "node_name": "node-a", "service_proxy_name": "mine"},
]


def _labelled(obj: dict[str, Any], labels: dict[str, str]) -> dict[str, Any]:
    obj["metadata"].setdefault("labels", {}).update(labels)
    return obj


def _triggered(obj: dict[str, Any], when: Any) -> dict[str, Any]:
    obj["metadata"].setdefault("annotations", {})[TRIGGER_TIME_ANNOTATION] = when
    return obj


def _node(name: str, **meta: Any) -> dict[str, Any]:
    return {"kind": "Node", "metadata": {"name": name, **meta}, "spec": {}}


SERVICES = [
    service("web", cluster_ip="10.96.0.10"),
    service("db", cluster_ip="10.96.0.11", namespace="prod"),
    # a warning (an unknown scheduler) and a fatal problem
    service("sched", cluster_ip="10.96.0.12", annotations={"ipvsctl.io/scheduler": "nope"}),
    service("bad-ip", cluster_ip="10.96.0.300"),
    # not proxied: headless-labelled, another proxy's, this proxy's (with CONFIGS[1])
    _labelled(service("headless", cluster_ip="10.96.0.13"), {"service.kubernetes.io/headless": ""}),
    _labelled(service("other", cluster_ip="10.96.0.14"), {SERVICE_PROXY_NAME_LABEL: "other"}),
    _labelled(service("ours", cluster_ip="10.96.0.15"), {SERVICE_PROXY_NAME_LABEL: "mine"}),
    _labelled(
        service("ours-sched", cluster_ip="10.96.0.16", annotations={"ipvsctl.io/scheduler": "x"}),
        {SERVICE_PROXY_NAME_LABEL: "mine"},
    ),
    _labelled(service("ours-bad", cluster_ip="10.96.0.300"), {SERVICE_PROXY_NAME_LABEL: "mine"}),
    {"kind": "Service", "metadata": {}},  # no name: skipped, not listed
    *(obj for obj in HOSTILE.values() if obj.get("kind") != "EndpointSlice"),
]
SLICES = [
    _triggered(
        endpoint_slice("web", [endpoint("10.244.1.5"), endpoint("10.244.2.5")]),
        "2026-11-27T00:00:00Z",
    ),
    _triggered(endpoint_slice("db", [endpoint("10.244.1.6")], namespace="prod"), "yesterday"),
    endpoint_slice("web", [endpoint("10.244.1.7", node="node-b")], name="web-2"),
    endpoint_slice("fqdn", [endpoint("example.com")], address_type="FQDN"),
    endpoint_slice("bad", [endpoint("10.244.1.300")]),
    *(obj for obj in HOSTILE.values() if obj.get("kind") == "EndpointSlice"),
]
NODES = [_node("node-a", labels={"topology.kubernetes.io/zone": "z1"}), _node("node-b")]


def _state(store: ObjectStore) -> tuple[Any, ...]:
    return (
        store.services,
        store.slices,
        store.slices_by_service,
        store.node,
        store.synced,
    )


def _both(config: dict[str, Any], replaces: list[tuple[ObjectKind, list[Any]]]) -> None:
    """Apply each Replace raw to one store and prepared to another: equal at every step."""
    raw, prepared = ObjectStore(**config), ObjectStore(**config)
    preparer = prepared.preparer
    for kind, objects in replaces:
        made = [preparer(kind, copy.deepcopy(o)) for o in objects]
        assert all(isinstance(p, Prepared) for p in made)
        expected = raw.apply(Replace(kind, copy.deepcopy(objects), 0.0))
        got = prepared.apply(PreparedReplace(kind, made, 0.0))
        assert got == expected
        assert _state(prepared) == _state(raw)


@pytest.mark.parametrize("config", CONFIGS)
def test_a_prepared_replace_changes_the_store_as_the_raw_one(config: dict[str, Any]) -> None:
    first = [(SVC, SERVICES), (EPS, SLICES), (NODE, NODES)]
    _both(config, first)


@pytest.mark.parametrize("config", CONFIGS)
def test_a_prepared_relist_reports_what_a_raw_one_does(config: dict[str, Any]) -> None:
    moved = copy.deepcopy(SLICES)
    moved[0]["endpoints"].pop()  # one endpoint gone
    del moved[2]  # a slice gone
    relabelled = copy.deepcopy(SERVICES)
    _labelled(relabelled[0], {"service.kubernetes.io/headless": ""})  # no longer ours
    _both(
        config,
        [
            (SVC, SERVICES),
            (EPS, SLICES),
            (NODE, NODES),
            (SVC, SERVICES),  # unchanged: only the problems again
            (EPS, SLICES),
            (SVC, relabelled),
            (EPS, moved),
            (NODE, []),  # this node's Node gone
        ],
    )


def test_an_unchanged_prepared_relist_reports_nothing_to_do() -> None:
    good = SERVICES[:2]
    store = ObjectStore()
    store.apply(PreparedReplace(SVC, [store.preparer(SVC, o) for o in good], 0.0))
    again = store.apply(PreparedReplace(SVC, [store.preparer(SVC, o) for o in good], 0.0))
    assert again == StoreChange(synced=SVC)


def test_a_replace_prepared_by_another_configuration_is_refused() -> None:
    store = ObjectStore(default_scheduler="rr")
    other = Preparer(default_scheduler="wrr")
    with pytest.raises(ValueError, match="prepared"):  # nothing applied, not even the first
        mine = store.preparer(SVC, SERVICES[1])
        store.apply(PreparedReplace(SVC, [mine, other(SVC, SERVICES[0])], 0.0))
    with pytest.raises(ValueError, match="prepared"):  # an equal preparer, another kind
        store.apply(PreparedReplace(EPS, [Preparer()(SVC, SERVICES[0])], 0.0))
    assert store.services == {} and store.synced == set()
    # An equal configuration (the daemon's source builds its own) is the store's own.
    store.apply(PreparedReplace(SVC, [Preparer(default_scheduler="rr")(SVC, SERVICES[0])], 0.0))
    assert len(store.services) == 1


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(list(ObjectKind)),
    st.lists(_json, max_size=3),
    st.lists(_json, max_size=3),
    st.sampled_from(CONFIGS),
)
def test_fuzz_any_shape_prepared_or_raw_is_the_same_replace(
    kind: ObjectKind, first: list[Any], second: list[Any], config: dict[str, Any]
) -> None:
    _both(config, [(kind, first + SERVICES[:1]), (kind, second)])

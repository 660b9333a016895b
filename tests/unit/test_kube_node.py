"""This node's Node from the API server: one list+watch of one object by field selector,
through the real client against the fake API server; a Node that cannot be read does not
hold the daemon up."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator

import pytest

from devkit.fakeapi import FakeAPIServer, objects
from ipvsctl.kube.client import KubeSource
from ipvsctl.kube.trim import trim_node
from ipvsctl.source.events import Delete, ObjectKind, Replace, SourceEvent, Upsert
from tests.unit.test_kube_source import FAST, WAIT, api, logs  # noqa: F401

NODE = ObjectKind.NODE
TAINT = {"key": "ToBeDeletedByClusterAutoscaler", "value": "1700000000", "effect": "NoSchedule"}


class Source:
    def __init__(self, server: FakeAPIServer, node_name: str = "node-a") -> None:
        self.events: dict[ObjectKind, queue.Queue[SourceEvent]] = {
            k: queue.Queue() for k in ObjectKind
        }
        self.restarts: queue.Queue[tuple[str, str]] = queue.Queue()
        self.source = KubeSource.from_config(
            None,
            server.url,
            environ={},
            settings=FAST,
            node_name=node_name,
            on_watch_restart=lambda res, reason: self.restarts.put((res, reason)),
        )
        self.stop = threading.Event()
        self.thread = threading.Thread(
            target=self.source.run,
            args=(lambda e: self.events[e.kind].put(e), self.stop),
            daemon=True,
        )
        self.thread.start()

    def next(self, kind: ObjectKind = NODE) -> SourceEvent:
        return self.events[kind].get(timeout=WAIT)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(WAIT)


@pytest.fixture
def source(api: FakeAPIServer) -> Iterator[object]:  # noqa: F811
    made: list[Source] = []

    def make(node_name: str = "node-a") -> Source:
        made.append(Source(api, node_name))
        return made[-1]

    yield make
    for s in made:
        s.close()


def test_only_this_nodes_node_is_listed_and_watched(api, source) -> None:  # noqa: F811
    api.add(objects.node("node-a", "zone-a"))
    api.add(objects.node("node-b", "zone-b"))
    s = source()
    first = s.next()
    assert isinstance(first, Replace)
    assert first.objects == [
        {
            "kind": "Node",
            "apiVersion": "v1",
            "metadata": {"name": "node-a", "labels": {"topology.kubernetes.io/zone": "zone-a"}},
        }
    ]
    assert s.source.emits_node
    assert api.wait_for(lambda: api.open_watches("Node") == 1, WAIT)
    node_requests = [r for r in api.requests if r.resource == "nodes"]
    assert {r.verb for r in node_requests} == {"list", "watch"}
    assert all(r.query.get("fieldSelector") == "metadata.name=node-a" for r in node_requests)

    api.update(objects.node("node-b", "zone-c"))  # not ours: never delivered
    api.update(objects.node("node-a", "zone-a", taints=[TAINT]))
    event = s.next()
    assert isinstance(event, Upsert)
    assert event.obj["spec"] == {"taints": [{"key": TAINT["key"]}]}
    api.delete("Node", "default", "node-a")
    event = s.next()
    assert isinstance(event, Delete) and event.name == "node-a"
    assert s.events[NODE].empty()


def test_a_missing_node_lists_empty(api, source) -> None:  # noqa: F811
    s = source("node-x")
    first = s.next()
    assert isinstance(first, Replace) and first.objects == []
    assert api.wait_for(lambda: api.open_watches("Node") == 1, WAIT)
    api.add(objects.node("node-x", "zone-a"))
    assert isinstance(s.next(), Upsert)


def test_forbidden_node_is_one_line_an_empty_replace_and_retries(api, source, logs) -> None:  # noqa: F811
    api.add(objects.service("web", cluster_ip="10.96.0.10"))
    api.add(objects.node("node-a", "zone-a"))
    api.fail_next("list", "Node", status=403, times=3)
    s = source()
    first = s.next()
    assert isinstance(first, Replace) and first.objects == []  # the daemon goes on
    assert isinstance(s.next(ObjectKind.SERVICE), Replace)
    rec = logs.next(
        "node object not readable: no zone for topology hints, node counted eligible; retrying"
    )
    assert "403" in rec.fields["error"]
    # The fault passes (RBAC fixed): the Node is listed and used.
    listed = s.next()
    assert isinstance(listed, Replace) and len(listed.objects) == 1
    assert s.events[NODE].empty()
    msgs = [r.getMessage() for r in logs.all()]
    assert (
        msgs.count(
            "node object not readable: no zone for topology hints, node counted eligible; retrying"
        )
        == 1
    )
    reasons = set()
    while not s.restarts.empty():
        reasons.add(s.restarts.get())
    assert ("nodes", "error") in reasons


def test_trim_node_keeps_zone_deletion_taint_keys_and_network_condition_only() -> None:
    obj = objects.node(
        "node-a",
        "zone-a",
        taints=[TAINT, {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}],
    )
    obj["metadata"]["deletionTimestamp"] = "2026-11-23T00:00:00Z"
    obj["metadata"]["resourceVersion"] = "7"
    obj["status"] = {
        "conditions": [
            {"type": "Ready", "status": "True", "lastHeartbeatTime": "2026-11-23T00:00:01Z"},
            {
                "type": "NetworkUnavailable",
                "status": "False",
                "lastHeartbeatTime": "2026-11-23T00:00:01Z",
                "reason": "RouteCreated",
            },
        ]
    }
    trimmed = trim_node(obj)
    assert trimmed == {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {
            "name": "node-a",
            "deletionTimestamp": "2026-11-23T00:00:00Z",
            "labels": {"topology.kubernetes.io/zone": "zone-a"},
        },
        "spec": {"taints": [{"key": TAINT["key"]}, {"key": "node.kubernetes.io/unschedulable"}]},
        "status": {"conditions": [{"type": "NetworkUnavailable", "status": "False"}]},
    }
    # a heartbeat changes nothing that is kept: the update compares equal
    obj["status"]["conditions"][1]["lastHeartbeatTime"] = "2026-11-23T00:00:41Z"
    assert trim_node(obj) == trimmed

# ruff: noqa: F811  (pytest fixtures imported from test_kube_source)
"""What the API server sends that cannot be read is skipped, never the whole list or the
watch; a source whose lists or watches keep failing says so. KubeSource through the real
`kubernetes` client against the fake API server serving the broken objects verbatim."""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
from typing import Any

import pytest

from devkit.fakeapi import FakeAPIServer, objects
from ipvsctl.kube.config import load_configuration, new_api_client
from ipvsctl.kube.listwatch import SERVICES, ListWatch
from ipvsctl.kube.trim import trim_service
from ipvsctl.kube.watch import Reflector
from ipvsctl.model import ServiceRef
from ipvsctl.source.events import (
    Delete,
    ObjectKind,
    PreparedReplace,
    PreparedUpsert,
    Replace,
    SourceEvent,
    Upsert,
)
from ipvsctl.source.prepare import Preparer
from ipvsctl.source.store import ObjectStore
from tests.unit.test_kube_source import FAST, SVC, WAIT, api, harness, logs  # noqa: F401

DEEP = b"[" * 5000 + b"]" * 5000  # past the JSON decoder's depth limit (~1,000)

# One Service as a broken server (or a proxy in front of it) could send it, by how it
# cannot be read: trimmed and parsed into a reported problem, or not decodable at all.
UNREADABLE = {
    "metadata-a-string": b'{"kind":"Service","apiVersion":"v1","metadata":"bad"}',
    "metadata-a-list": b'{"kind":"Service","apiVersion":"v1","metadata":[1,2]}',
    "not-an-object": b"7",
    "nested-too-deeply": b'{"kind":"Service","metadata":{"name":"bad","namespace":"default"},'
    b'"spec":{"ports":' + DEEP + b"}}",
}


def reported(events: list[SourceEvent], invalid: queue.Queue[str]) -> tuple[ObjectStore, int]:
    """The store the events make, and how many objects were reported unreadable: skipped
    at the source (counted there) or by the store (a problem the engine counts)."""
    store = ObjectStore()
    problems = sum(1 for event in events for p in store.apply(event).problems if p.fatal)
    skipped = 0
    while not invalid.empty():
        assert invalid.get() == "Service"
        skipped += 1
    return store, problems + skipped


@pytest.mark.parametrize("watch_list", [False, True], ids=["list", "watch-list"])
@pytest.mark.parametrize("prepared", [True, False], ids=["prepared", "raw"])
@pytest.mark.parametrize("shape", sorted(UNREADABLE))
def test_a_list_skips_an_object_it_cannot_read(api, harness, shape, prepared, watch_list):
    api.add(objects.service("web", cluster_ip="10.96.0.10"))
    api.put_raw("Service", "default", "bad", UNREADABLE[shape])
    api.add(objects.service("zz", cluster_ip="10.96.0.11"))  # after it in the list
    settings = dataclasses.replace(FAST, watch_list=watch_list)
    h = harness(settings, Preparer() if prepared else None).start()

    listed = h.replace(SVC)
    store, unreadable = reported([listed], h.invalid)
    assert {r.name for r in store.services} == {"kubernetes", "web", "zz"}
    assert unreadable == 1
    h.wait_watching("Service", 1)
    assert h.restarts.empty()  # the list was not failed, and is not retried
    assert h.health.empty()


SLICES = {
    "metadata-a-string": b'{"kind":"EndpointSlice","metadata":"bad"}',
    "endpoints-a-number": b'{"kind":"EndpointSlice","metadata":{"name":"bad-1",'
    b'"namespace":"default","labels":{"kubernetes.io/service-name":"bad"}},'
    b'"addressType":"IPv4","endpoints":5}',
    "not-an-object": b"[]",
}


@pytest.mark.parametrize("prepared", [True, False], ids=["prepared", "raw"])
@pytest.mark.parametrize("shape", sorted(SLICES))
def test_a_slice_list_skips_a_slice_it_cannot_read(api, harness, shape, prepared):
    api.add(objects.endpoint_slice("web-1", "web", [objects.endpoint("10.244.1.5", node="n1")]))
    api.put_raw("EndpointSlice", "default", "bad-1", SLICES[shape])
    h = harness(FAST, Preparer() if prepared else None).start()
    listed = h.replace(ObjectKind.ENDPOINT_SLICE)
    store = ObjectStore()
    problems = [p for p in store.apply(listed).problems if p.fatal]
    skipped = [h.invalid.get() for _ in range(h.invalid.qsize())]
    assert set(store.slices) == {("default", "web-1")}
    assert len(problems) + len(skipped) == 1 and set(skipped) <= {"EndpointSlice"}
    assert h.source.cluster_nodes == 1
    assert h.restarts.empty()


@pytest.mark.parametrize("shape", sorted(UNREADABLE))
def test_a_watch_event_it_cannot_read_is_skipped_and_the_watch_goes_on(api, harness, shape):
    api.add(objects.service("web", cluster_ip="10.96.0.10"))
    h = harness(prepare=Preparer()).start()
    listed = h.replace(SVC)
    h.wait_watching("Service", 1)

    api.put_raw("Service", "default", "web", UNREADABLE[shape])  # MODIFIED, unreadable
    api.add(objects.service("db", cluster_ip="10.96.0.11"))  # then a good change
    events: list[SourceEvent] = [listed]
    while not (isinstance(events[-1], PreparedUpsert) and events[-1].obj.key == ("default", "db")):
        events.append(h.next(SVC))
    assert not any(isinstance(e, Replace | PreparedReplace) for e in events[1:])  # no relist
    store, unreadable = reported(events, h.invalid)
    # The last good version of `web` stays in force.
    assert store.services[ServiceRef("default", "web")].cluster_ips == ("10.96.0.10",)
    assert ServiceRef("default", "db") in store.services
    assert unreadable == 1
    assert h.restarts.empty()  # the same watch delivered both
    assert len(watch_requests(api, "services")) == 1


def watch_requests(api: FakeAPIServer, plural: str) -> list[Any]:
    return [r for r in api.requests if r.verb == "watch" and r.resource == plural]


def test_unreadable_objects_are_logged_once_per_streak(api, harness, logs):
    api.put_raw("Service", "default", "bad-1", b"7")
    api.put_raw("Service", "default", "bad-2", b"[]")
    h = harness().start()
    h.replace(SVC)
    h.wait_watching("Service", 1)
    api.put_raw("Service", "default", "bad-3", b"8")  # a watch event, same streak
    api.add(objects.service("db", cluster_ip="10.96.0.11"))
    while not isinstance(h.next(SVC), Upsert):
        pass
    assert h.invalid.qsize() == 3
    lines = [r for r in logs.all() if r.getMessage() == "unreadable object skipped"]
    assert len(lines) == 1
    assert lines[0].levelno == logging.WARNING
    assert lines[0].fields["resource"] == "services"  # type: ignore[attr-defined]


def reflector(api: FakeAPIServer, emitted: list[SourceEvent], **kw: Any) -> Reflector:
    services = ListWatch(new_api_client(load_configuration(None, api.url, environ={})), SERVICES)
    return Reflector(
        kind=ObjectKind.SERVICE,
        resource="services",
        list_func=services,
        trim=kw.pop("trim", trim_service),
        emit=emitted.append,
        settings=FAST,
        **kw,
    )


def test_an_object_that_trimming_raises_on_is_skipped_not_the_list(api):
    """Validation reports the shapes it knows; any other error of one object costs that
    object, not the list."""
    api.add(objects.service("web", cluster_ip="10.96.0.10"))
    api.add(objects.service("boom", cluster_ip="10.96.0.11"))

    def trim(obj: Any) -> Any:
        if obj["metadata"]["name"] == "boom":
            raise KeyError("a shape nobody foresaw")
        return trim_service(obj)

    emitted: list[SourceEvent] = []
    invalid: list[str] = []
    r = reflector(api, emitted, trim=trim, on_invalid=invalid.append)
    halt = threading.Event()
    thread = threading.Thread(target=r.run, args=(halt,), daemon=True)
    thread.start()
    try:
        assert api.wait_for(lambda: bool(emitted), WAIT)
    finally:
        halt.set()
        r.interrupt()
        thread.join(WAIT)
    listed = emitted[0]
    assert isinstance(listed, Replace)
    assert sorted(o["metadata"]["name"] for o in listed.objects) == ["kubernetes", "web"]
    assert invalid == ["Service"]


@pytest.mark.parametrize(
    "event",
    [
        {"type": "DELETED", "object": {"metadata": {"name": ["web"], "resourceVersion": "9"}}},
        {"type": "DELETED", "object": {"metadata": {"name": "web", "namespace": 3}}},
        {"type": "DELETED", "object": {"metadata": "web"}},
        {"type": "DELETED", "object": None},
        {"type": "MODIFIED", "object": "web"},
    ],
)
def test_a_delete_or_update_without_a_readable_object_is_counted_not_emitted(api, event):
    emitted: list[SourceEvent] = []
    invalid: list[str] = []
    r = reflector(api, emitted, on_invalid=invalid.append)
    r.resource_version = "5"
    r._handle(event, 0.0)
    assert emitted == [] and invalid == ["Service"]
    assert r.resource_version in ("5", "9")


def test_a_resource_version_that_is_not_a_string_is_not_taken(api):
    emitted: list[SourceEvent] = []
    r = reflector(api, emitted)
    r.resource_version = "5"
    r._handle({"type": "DELETED", "object": {"metadata": {"name": "web", "resourceVersion": 6}}}, 0)
    assert emitted == [Delete(ObjectKind.SERVICE, "default", "web", 0)]
    assert r.resource_version == "5"  # an int would make every later watch request fail


# ---- a failing source --------------------------------------------------------------------

FAILING = dataclasses.replace(
    FAST, backoff_initial=0.01, backoff_max=0.05, degraded_after=3, healthy_watch_seconds=0.3
)


def health_until(h: Any, predicate: Any) -> tuple[str | None, float]:
    """The source's word on its health once `predicate` holds for it, and when it came."""
    deadline = time.monotonic() + WAIT
    while True:
        word = h.health.get(timeout=max(0.01, deadline - time.monotonic()))
        if predicate(word):
            return word, time.monotonic()


def test_lists_that_keep_failing_make_the_source_degraded_until_a_watch_works(api, harness):
    api.add(objects.service("web", cluster_ip="10.96.0.10"))
    api.fail_next("list", "Service", status=500, times=1000)
    h = harness(FAILING, Preparer()).start()
    word, _ = health_until(h, lambda w: w is not None)
    assert word is not None and word.startswith("services: 3 attempts failed in a row")
    assert "HTTP 500" in word
    assert h.empty(SVC)  # nothing to apply, nothing emptied: the table is kept

    api.clear_faults()
    listed = h.replace(SVC)
    word, cleared = health_until(h, lambda w: w is None)
    # Cleared once the watch after the list had held healthy_watch_seconds, not at the list.
    assert cleared - listed.received >= FAILING.healthy_watch_seconds


def test_one_failure_or_a_relist_says_nothing(api, harness):
    h = harness(FAILING, Preparer()).start()
    h.synced()
    # The 410 may come before the watch held its healthy time (then it counts as a failure):
    # with the 500 after it, still one short of degraded_after.
    api.fail_next("watch", "Service", status=500, times=FAILING.degraded_after - 2)
    api.expire_watches("Service")
    h.replace(SVC)  # relisted after the 410
    h.wait_watching("Service", 1)
    api.add(objects.service("db", cluster_ip="10.96.0.11"))
    while not isinstance(h.next(SVC), PreparedUpsert):
        pass
    assert h.health.empty()


def test_an_api_server_gone_is_degraded_while_the_table_is_kept(api, harness):
    h = harness(FAILING, Preparer()).start()
    h.synced()
    api.down()

    def both(w: str | None) -> bool:
        return w is not None and "services: " in w and "endpointslices: " in w

    word, _ = health_until(h, both)
    assert word is not None and "services: " in word and "Connection refused" in word
    assert h.empty(SVC)
    api.up()
    assert health_until(h, lambda w: w is None)[0] is None

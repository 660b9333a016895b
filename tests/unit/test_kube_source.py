"""KubeSource driven through the real `kubernetes` client against the fake API server."""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from devkit.fakeapi import FakeAPIServer, objects
from ipvsctl.kube.client import KubeSource
from ipvsctl.kube.permissions import PUBLIC_PATHS, REQUIRED_PERMISSIONS
from ipvsctl.kube.settings import KubeSettings
from ipvsctl.kube.trim import trim_service
from ipvsctl.model import ServiceRef
from ipvsctl.source.convert import TRIGGER_TIME_ANNOTATION
from ipvsctl.source.events import (
    Delete,
    ObjectKind,
    PreparedReplace,
    PreparedUpsert,
    Replace,
    SourceEvent,
    Upsert,
)
from ipvsctl.source.prepare import Prepared, Preparer
from ipvsctl.source.store import ObjectStore

SVC, EPS = ObjectKind.SERVICE, ObjectKind.ENDPOINT_SLICE
WAIT = 5.0  # generous upper bound for conditions; tests normally pass far sooner

FAST = KubeSettings(
    watch_timeout=60,
    connect_timeout=1.0,
    list_read_timeout=2.0,
    backoff_initial=0.01,
    backoff_max=0.08,
    healthy_watch_seconds=0.0,
    join_timeout=2.0,
)


def _with(settings: KubeSettings, **changes: Any) -> KubeSettings:
    return dataclasses.replace(settings, **changes)


def assert_permitted(api: FakeAPIServer) -> None:
    allowed = {(p.api_group, p.resource, v) for p in REQUIRED_PERMISSIONS for v in p.verbs}
    seen = {
        (r.group, r.resource, r.verb)
        for r in api.requests
        if not (r.resource is None and r.path in PUBLIC_PATHS and r.verb == "get")
    }
    assert seen <= allowed, f"calls outside REQUIRED_PERMISSIONS: {seen - allowed}"


@pytest.fixture
def api() -> Iterator[FakeAPIServer]:
    server = FakeAPIServer().start()
    try:
        yield server
    finally:
        server.stop()
    # Every test doubles as a least-privilege check.
    assert_permitted(server)


class LogQueue(logging.Handler):
    """Records of `ipvsctl.kube`, as a queue to wait on."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: queue.Queue[logging.LogRecord] = queue.Queue()
        self.seen: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.put(record)
        self.seen.append(record)

    def all(self) -> list[logging.LogRecord]:
        return list(self.seen)

    def next(self, message: str, **fields: Any) -> logging.LogRecord:
        deadline = time.monotonic() + WAIT
        while True:
            rec = self.records.get(timeout=max(0.01, deadline - time.monotonic()))
            got = getattr(rec, "fields", {})
            if rec.getMessage() == message and all(got.get(k) == v for k, v in fields.items()):
                return rec


@pytest.fixture
def logs() -> Iterator[LogQueue]:
    handler = LogQueue()
    logger = logging.getLogger("ipvsctl.kube")
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


class Harness:
    """Runs a KubeSource in a thread; events are sorted into one queue per kind."""

    def __init__(
        self, api: FakeAPIServer, settings: KubeSettings = FAST, prepare: Preparer | None = None
    ) -> None:
        self.api = api
        self.queues: dict[ObjectKind, queue.Queue[SourceEvent]] = {
            k: queue.Queue() for k in ObjectKind
        }
        self.restarts: queue.Queue[tuple[str, str]] = queue.Queue()
        self.invalid: queue.Queue[str] = queue.Queue()  # kinds of unreadable objects skipped
        self.health: queue.Queue[str | None] = queue.Queue()  # the `source` condition's word
        self.source = KubeSource.from_config(
            None,
            api.url,
            environ={},
            settings=settings,
            on_watch_restart=lambda resource, reason: self.restarts.put((resource, reason)),
            prepare=prepare,
            on_invalid_object=self.invalid.put,
            on_health=self.health.put,
        )
        self.stop = threading.Event()
        self.thread = threading.Thread(
            target=self.source.run, args=(self.sink, self.stop), daemon=True
        )

    def sink(self, event: SourceEvent) -> None:
        self.queues[event.kind].put(event)

    def start(self) -> Harness:
        self.thread.start()
        return self

    def next(self, kind: ObjectKind) -> SourceEvent:
        return self.queues[kind].get(timeout=WAIT)

    def replace(self, kind: ObjectKind) -> Replace | PreparedReplace:
        """A list's event: raw objects, or prepared (a source with a Preparer)."""
        event = self.next(kind)
        assert isinstance(event, Replace | PreparedReplace), event
        return event

    def synced(self) -> tuple[Replace | PreparedReplace, Replace | PreparedReplace]:
        """The first Replace of both kinds, once both watches are open."""
        services, slices = self.replace(SVC), self.replace(EPS)
        self.wait_watching()
        return services, slices

    def wait_watching(self, kind: str | None = None, n: int | None = None) -> None:
        want = n if n is not None else (1 if kind else 2)
        assert self.api.wait_for(lambda: self.api.open_watches(kind) == want, WAIT)

    def restart(self, resource: str) -> str:
        """The reason of the next restart of `resource` (others' are skipped)."""
        deadline = time.monotonic() + WAIT
        while True:
            res, reason = self.restarts.get(timeout=max(0.01, deadline - time.monotonic()))
            if res == resource:
                return reason

    def empty(self, kind: ObjectKind) -> bool:
        return self.queues[kind].empty()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(WAIT)
        assert not self.thread.is_alive()


@pytest.fixture
def harness(api: FakeAPIServer) -> Iterator[Any]:
    made: list[Harness] = []

    def make(settings: KubeSettings = FAST, prepare: Preparer | None = None) -> Harness:
        h = Harness(api, settings, prepare)
        made.append(h)
        return h

    try:
        yield make
    finally:
        for h in made:
            if h.thread.is_alive():
                h.close()


def names(event: Replace) -> list[str]:
    """Names of a Replace's objects (raw or prepared), without the fake server's
    `default/kubernetes`."""
    keys = [
        o.key
        if isinstance(o, Prepared)
        else (o["metadata"].get("namespace"), o["metadata"]["name"])
        for o in event.objects
    ]
    return sorted(
        name for namespace, name in keys if (namespace, name) != ("default", "kubernetes")
    )


def watch_requests(api: FakeAPIServer, kind: str) -> list[dict[str, str]]:
    plural = {"Service": "services", "EndpointSlice": "endpointslices"}[kind]
    return [dict(r.query) for r in api.requests if r.verb == "watch" and r.resource == plural]


# ---- list and watch ----------------------------------------------------------------------


def test_initial_list_is_one_replace_per_kind_with_trimmed_objects(api, harness) -> None:
    api.add(objects.service("web", cluster_ip="10.96.0.10"))
    api.add(objects.service("db", "prod", cluster_ip="10.96.0.11"))
    api.add(objects.endpoint_slice("web-1", "web", [objects.endpoint("10.244.1.5", pod="p1")]))
    h = harness().start()

    services, slices = h.synced()
    assert names(services) == ["db", "web"]
    assert names(slices) == ["web-1"]
    web = next(o for o in services.objects if o["metadata"]["name"] == "web")
    assert web["kind"] == "Service"
    assert "managedFields" not in web["metadata"]
    assert "resourceVersion" not in web["metadata"]
    assert web["spec"]["clusterIPs"] == ["10.96.0.10"]
    ep = slices.objects[0]["endpoints"][0]
    assert set(ep) == {"addresses", "conditions", "nodeName", "targetRef"}  # zone dropped
    assert h.empty(SVC) and h.empty(EPS)
    h.close()


@pytest.mark.parametrize("watch_list", [False, True])
def test_a_prepared_list_hands_the_store_parsed_objects(api, harness, watch_list) -> None:
    # Parsed where each item is decoded (no list of raw objects beside the store), with the
    # outcome of the raw list: valid, invalid, warned about and not proxied objects alike.
    api.add(objects.service("web", cluster_ip="10.96.0.10"))
    api.add(objects.service("bad", cluster_ip="10.96.0.300"))
    api.add(
        objects.service(
            "sched", cluster_ip="10.96.0.12", annotations={"ipvsctl.io/scheduler": "nope"}
        )
    )
    headless = objects.service("headless", cluster_ip="10.96.0.13")
    headless["metadata"]["labels"] = {"service.kubernetes.io/headless": ""}
    api.add(headless)
    api.add(objects.endpoint_slice("web-1", "web", [objects.endpoint("10.244.1.5", pod="p1")]))
    api.add(objects.endpoint_slice("bad-1", "bad", [objects.endpoint("10.244.1.300")]))
    settings = _with(FAST, watch_list=watch_list)
    preparer = Preparer(default_scheduler="wrr")
    lists = []
    for prepare in (preparer, None):
        h = harness(settings, prepare).start()
        lists.append(h.synced())
        h.close()
    prepared, raw = lists
    assert all(isinstance(o, Prepared) for r in prepared for o in r.objects)
    assert not any(isinstance(o, Prepared) for r in raw for o in r.objects)
    assert names(prepared[0]) == names(raw[0]) == ["bad", "headless", "sched", "web"]
    from_prepared, from_raw = ObjectStore("wrr"), ObjectStore("wrr")
    for p, r in zip(prepared, raw, strict=True):
        change = from_raw.apply(r)
        assert from_prepared.apply(p) == change
    assert change.problems and from_raw.services  # not a vacuous comparison
    assert from_prepared.services == from_raw.services
    assert from_prepared.slices == from_raw.slices
    # Watch events are prepared too (a backlog of updates waits parsed), a slice's with
    # its trigger-time annotation as sent, and give the store what their raw objects give.
    h = harness(settings, preparer).start()
    h.synced()
    api.add(objects.service("later", cluster_ip="10.96.0.20"))
    event = h.next(SVC)
    assert isinstance(event, PreparedUpsert)
    assert event.obj.key == ("default", "later") and event.obj.trigger is None
    sl = objects.endpoint_slice("later-1", "later", [objects.endpoint("10.244.1.9")])
    sl["metadata"]["annotations"] = {TRIGGER_TIME_ANNOTATION: "2026-11-27T01:00:00Z"}
    api.add(sl)
    sl_event = h.next(EPS)
    assert isinstance(sl_event, PreparedUpsert)
    assert sl_event.obj.trigger == "2026-11-27T01:00:00Z"
    h.close()
    raw_store = ObjectStore("wrr")
    later = trim_service(objects.service("later", cluster_ip="10.96.0.20"))
    assert from_prepared.apply(event) == raw_store.apply(Upsert(SVC, later, 0))
    ref = ServiceRef("default", "later")
    assert from_prepared.services[ref] == raw_store.services[ref]


def test_watch_events_arrive_in_order(api, harness) -> None:
    h = harness().start()
    h.synced()
    api.add(objects.service("web", cluster_ip="10.96.0.10"))
    api.update(objects.service("web", cluster_ip="10.96.0.10", externalIPs=["192.0.2.1"]))
    api.add(objects.endpoint_slice("web-1", "web", [objects.endpoint("10.244.1.5")]))
    api.delete("Service", "default", "web")

    added, modified, deleted = h.next(SVC), h.next(SVC), h.next(SVC)
    assert isinstance(added, Upsert) and "externalIPs" not in added.obj["spec"]
    assert isinstance(modified, Upsert) and modified.obj["spec"]["externalIPs"] == ["192.0.2.1"]
    assert deleted == Delete(SVC, "default", "web", deleted.received)
    assert added.received <= modified.received <= deleted.received
    slice_event = h.next(EPS)
    assert isinstance(slice_event, Upsert)
    assert "managedFields" not in slice_event.obj["metadata"]
    h.close()


def test_watch_starts_from_the_lists_resource_version(api, harness) -> None:
    # So changes made between the list and the watch are replayed, not lost.
    api.add(objects.service("web", cluster_ip="10.96.0.10"))
    listed_at = str(api.resource_version)
    h = harness().start()
    h.synced()
    assert watch_requests(api, "Service")[0]["resourceVersion"] == listed_at
    assert watch_requests(api, "EndpointSlice")[0]["resourceVersion"] == listed_at
    h.close()


def test_bookmark_advances_resource_version_and_rewatch_needs_no_relist(api, harness) -> None:
    h = harness().start()
    h.synced()
    lists_before = api.count("list", "Service")
    api.add(objects.pod("unrelated"))  # moves the cluster-wide resourceVersion
    rv = str(api.resource_version)
    assert api.bookmark("Service") == 1
    services = h.source.reflectors[0]
    assert api.wait_for(lambda: services.resource_version == rv, WAIT)

    api.close_watches("Service")  # as a server-side timeoutSeconds does
    assert h.restart("services") == "closed"
    # The old stream may still count as open for a moment: wait for the new request itself.
    assert api.wait_for(
        lambda: (
            len(watch_requests(api, "Service")) >= 2
            and watch_requests(api, "Service")[-1]["resourceVersion"] == rv
        ),
        WAIT,
    )
    assert api.count("list", "Service") == lists_before
    assert h.empty(SVC)
    h.close()


def test_server_timeouts_rewatch_from_the_bookmarked_version(api, harness) -> None:
    api.max_watch_seconds = 0.1  # every watch ends cleanly after 0.1 s
    api.bookmark_interval = 0.02
    h = harness().start()
    h.synced()
    api.add(objects.pod("unrelated"))  # only a bookmark can tell the watch about this
    rv = str(api.resource_version)
    assert api.wait_for(
        lambda: any(q["resourceVersion"] == rv for q in watch_requests(api, "Service")), WAIT
    )
    assert api.count("list", "Service") == 1 and api.count("list", "EndpointSlice") == 1
    assert h.restart("services") == "closed"
    assert h.empty(SVC)
    h.close()


def test_watch_parameters(api, harness) -> None:
    h = harness(KubeSettings(watch_timeout=300, read_slack=30)).start()
    h.synced()
    q = watch_requests(api, "Service")[0]
    assert q["allowWatchBookmarks"] == "true"
    assert q["watch"] == "true"
    assert 300 <= int(q["timeoutSeconds"]) < 600  # jittered
    h.close()


@pytest.mark.parametrize("form", ["event", "http"])
def test_410_relists_and_emits_replace(api, harness, form: str) -> None:
    api.add(objects.service("web", cluster_ip="10.96.0.10"))
    h = harness().start()
    h.synced()
    if form == "event":
        api.expire_watches("Service")  # ERROR event carrying a 410 Status
    else:
        api.fail_next("watch", "Service", status=410)  # HTTP 410 on the next watch
        api.close_watches("Service")
        assert h.restart("services") == "closed"
    assert h.restart("services") == "expired"
    again = h.replace(SVC)
    assert names(again) == ["web"]
    assert api.count("list", "Service") == 2
    assert h.empty(EPS)  # the other resource is not disturbed
    h.close()


def test_too_old_resource_version_after_compaction_relists(api, harness) -> None:
    h = harness().start()
    h.synced()
    api.add(objects.pod("unrelated"))  # the services watch has not seen this version
    api.compact()
    api.close_watches("Service")
    assert h.restart("services") == "closed"
    assert h.restart("services") == "expired"  # HTTP 410 on the re-watch
    assert isinstance(h.next(SVC), Replace)
    h.close()


def test_hung_stream_times_out_and_resumes_the_watch(api, harness, logs) -> None:
    h = harness(_with(FAST, watch_read_timeout=0.3, list_read_timeout=0.3)).start()
    h.synced()
    api.hang()  # the stream stays open but silent: a half-open connection
    assert h.restart("services") == "timeout"
    logs.next("watch restart", resource="services", reason="timeout", relist=False)
    api.add(objects.service("while-hung", cluster_ip="10.96.0.13"))
    api.unhang()
    # The watch resumes from the last resourceVersion: the missed change, no relist.
    event = h.next(SVC)
    assert isinstance(event, Upsert) and event.obj["metadata"]["name"] == "while-hung"
    assert api.count("list", "Service") == 1
    h.close()


def test_server_down_retries_with_growing_backoff_then_recovers(api, harness, logs) -> None:
    h = harness(_with(FAST, backoff_initial=0.02, backoff_max=0.16)).start()
    h.synced()
    api.down()
    delays = []
    for _ in range(5):
        rec = logs.next("watch restart", resource="services")
        assert rec.levelno == logging.WARNING
        # Unreachable: the watch is retried from the last resourceVersion, no relist.
        assert rec.fields["reason"] == "error" and rec.fields["relist"] is False
        delays.append(rec.fields["backoff"])
    assert delays[:4] == sorted(delays[:4]) and delays[0] < delays[3]
    assert all(d < 2 * 0.16 for d in delays)  # client-go's jitter: [step, 2 x step)
    api.add(objects.service("back", cluster_ip="10.96.0.14"))
    api.up()
    event = h.next(SVC)
    assert isinstance(event, Upsert) and event.obj["metadata"]["name"] == "back"
    assert api.count("list") == 2  # the two initial lists only
    h.close()


def test_server_down_past_its_watch_history_relists_once_as_a_diff(api, harness) -> None:
    h = harness(_with(FAST, backoff_initial=0.02, backoff_max=0.16)).start()
    h.synced()
    api.down()
    assert h.restart("services") == "error"
    api.add(objects.service("back", cluster_ip="10.96.0.14"))
    api.compact()  # the outage outlived the history: the resumed watch gets 410
    api.up()
    # Retries made while the server was down may still be queued: skip their "error"s.
    reason = h.restart("services")
    while reason == "error":
        reason = h.restart("services")
    assert reason == "expired"
    assert names(h.replace(SVC)) == ["back"]
    assert api.count("list", "Service") == 2
    h.close()


def test_one_log_line_and_one_callback_per_restart(api, harness, logs) -> None:
    h = harness().start()
    h.synced()
    api.fail_next("list", "Service", status=500, times=2)
    api.expire_watches("Service")
    reasons = [h.restart("services") for _ in range(3)]
    assert reasons == ["expired", "error", "error"]
    assert isinstance(h.next(SVC), Replace)
    h.close()
    lines = [r.fields for r in logs.all() if r.getMessage() == "watch restart"]
    assert [f["reason"] for f in lines if f["resource"] == "services"] == reasons
    assert "500" in lines[-1]["error"]


def test_pagination(api, harness) -> None:
    for i in range(7):
        api.add(objects.service(f"s{i}", cluster_ip=f"10.96.1.{i}"))
    h = harness(_with(FAST, page_size=3)).start()
    services, _ = h.synced()
    assert names(services) == [f"s{i}" for i in range(7)]
    lists = [r.query for r in api.requests if r.verb == "list" and r.resource == "services"]
    assert [q["limit"] for q in lists] == ["3", "3", "3"]
    assert "continue" not in lists[0] and all("continue" in q for q in lists[1:])
    h.close()


def test_stop_is_prompt_even_with_a_hung_stream(api, harness) -> None:
    h = harness(_with(FAST, watch_read_timeout=30.0)).start()
    h.synced()
    api.hang()
    started = time.monotonic()
    h.close()
    assert time.monotonic() - started < 2.0


def test_only_permitted_calls(api, harness) -> None:
    api.add(objects.service("web", cluster_ip="10.96.0.10"))
    api.add(
        objects.endpoint_slice(
            "web-1",
            "web",
            [
                objects.endpoint("10.244.1.5", pod="web-1"),
                objects.endpoint("10.244.1.6", pod="web-2", ready=False, terminating=True),
            ],
        )
    )
    api.add(objects.pod("web-1"))
    h = harness().start()
    h.synced()
    api.expire_watches()
    h.replace(SVC), h.replace(EPS)
    h.close()
    verbs = {(r.resource, r.verb) for r in api.requests}
    assert verbs == {
        ("services", "list"),
        ("services", "watch"),
        ("endpointslices", "list"),
        ("endpointslices", "watch"),
    }  # no pod, even with a terminating endpoint listed (CONTRACT.md "Draining")
    assert_permitted(api)


def test_list_ok_but_every_watch_failing_backs_off_instead_of_relisting_in_a_loop(
    api, harness, logs
) -> None:
    # Regression: the backoff was reset by every successful list, so this relisted the
    # whole resource every backoff_initial seconds.
    h = harness(
        _with(FAST, backoff_initial=0.01, backoff_max=0.64, healthy_watch_seconds=5.0)
    ).start()
    h.synced()
    api.fail_next("watch", "Service", status=500, times=6)
    api.close_watches("Service")
    delays = [logs.next("watch restart", resource="services").fields["backoff"] for _ in range(6)]
    assert delays[5] > 4 * delays[1], delays  # growing, not stuck at the initial value
    h.close()


def test_a_crashed_reflector_is_a_dead_thread_for_healthz(api, harness, monkeypatch) -> None:
    # Regression: the source's run() thread lived on, so /healthz never saw the dead reflector.
    from ipvsctl.kube import watch

    real_run = watch.Reflector.run

    def run(self: Any, halt: threading.Event) -> None:
        if self.resource == "endpointslices":
            raise RuntimeError("a bug")
        real_run(self, halt)

    monkeypatch.setattr(watch.Reflector, "run", run)
    h = harness().start()
    h.replace(SVC)
    assert api.wait_for(lambda: h.source.dead_threads() == ["ipvsctl-kube-endpointslices"], WAIT)
    h.close()
    assert h.source.dead_threads() == []  # stopped on purpose: nothing to report

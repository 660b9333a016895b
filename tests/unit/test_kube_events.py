"""The Events writer (`kube/events.py`) against the fake API server: the real `kubernetes`
client on the wire. A cut writes one Event on the pod, repeats become a series, the rate
limit holds, a 403 is logged once and counted, and a slow server never blocks `record`."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

import pytest

from devkit.fakeapi import FakeAPIServer
from ipvsctl.kube.config import load_configuration, new_api_client
from ipvsctl.kube.events import EventWriter
from ipvsctl.kube.permissions import REQUIRED_PERMISSIONS
from ipvsctl.model import ConnectionsCut, PodRef, Protocol, RealServerKey, ServiceKey, ServiceRef
from ipvsctl.obs.metrics import Metrics
from ipvsctl.plan.events import TokenBucket, table_restored

WAIT = 10.0
VS = ServiceKey(Protocol.TCP, "10.96.0.10", 80)
POD = PodRef("shop", "web-5", "0b6f-uid")


def cut(pod: PodRef = POD, n: int = 3, port: int = 80) -> ConnectionsCut:
    return ConnectionsCut(
        pod, ServiceRef("shop", "web"), VS, RealServerKey("10.244.1.5", port), n, 30.2
    )


@pytest.fixture
def api() -> Iterator[FakeAPIServer]:
    server = FakeAPIServer().start()
    try:
        yield server
    finally:
        server.stop()
    allowed = {(p.api_group, p.resource, v) for p in REQUIRED_PERMISSIONS for v in p.verbs}
    seen = {(r.group, r.resource, r.verb) for r in server.requests}
    assert seen <= allowed, f"calls outside REQUIRED_PERMISSIONS: {seen - allowed}"


class Running:
    def __init__(self, api: FakeAPIServer, **kw: object) -> None:
        self.metrics = Metrics()
        self.clock = kw.pop("clock", time.time)
        self.writer = EventWriter(
            new_api_client(load_configuration(None, api.url, environ={})),
            instance="ipvsctl-node-1",
            node="node-1",
            on_result=lambda reason, result: self.metrics.events.labels(reason, result).inc(),
            clock=self.clock,  # type: ignore[arg-type]
            retry_pause=0.01,
            **kw,  # type: ignore[arg-type]
        )
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.writer.run, args=(self.stop,), daemon=True)
        self.thread.start()

    def result(self, result: str, reason: str = "ConnectionsCut") -> float:
        return self.metrics.value("ipvsctl_events_total", {"reason": reason, "result": result})

    def close(self) -> None:
        self.stop.set()
        self.thread.join(WAIT)


@pytest.fixture
def running(api: FakeAPIServer) -> Iterator[Running]:
    r = Running(api)
    try:
        yield r
    finally:
        r.close()


def test_a_cut_writes_one_event_on_the_pod(api: FakeAPIServer, running: Running) -> None:
    assert running.writer.record(cut())
    assert running.writer.flush(WAIT)
    (ev,) = api.objects("Event")
    assert ev["metadata"]["namespace"] == "shop"
    assert ev["metadata"]["name"].startswith("web-5.")
    assert ev["regarding"] == {
        "kind": "Pod",
        "apiVersion": "v1",
        "namespace": "shop",
        "name": "web-5",
        "uid": "0b6f-uid",
    }
    assert (ev["reason"], ev["type"], ev["reportingInstance"]) == (
        "ConnectionsCut",
        "Warning",
        "ipvsctl-node-1",
    )
    assert ev["note"].startswith("3 established connections cut through node node-1 after 30s")
    assert "series" not in ev
    assert running.result("created") == 1
    assert api.count("create", "Event") == 1 and api.count("get") == 0


def test_cuts_of_one_pod_in_one_batch_are_one_event(api: FakeAPIServer) -> None:
    r = Running(api)
    try:
        r.stop.set()  # queue first, then let the thread take them as one batch
        r.thread.join(WAIT)
        for port in (80, 443):
            r.writer.record(cut(port=port))
        r.writer.write_batch([cut(), cut(port=443, n=4)], threading.Event())
    finally:
        r.close()
    (ev,) = api.objects("Event")
    assert ev["note"].startswith("7 established connections") and "and 1 other" in ev["note"]


def test_repeats_become_a_series_patched_as_client_go(api: FakeAPIServer) -> None:
    now = [1000.0]
    r = Running(api, clock=lambda: now[0])
    try:
        r.writer.record(cut())
        assert r.writer.flush(WAIT)
        now[0] += 10
        r.writer.record(cut(n=1))
        assert r.writer.flush(WAIT)
        (ev,) = api.objects("Event")
        assert ev["series"]["count"] == 2 and api.count("patch", "Event") == 1
        for _ in range(3):
            now[0] += 10
            r.writer.record(cut(n=1))
            assert r.writer.flush(WAIT)
        assert api.count("patch", "Event") == 1  # counted, written when the series ends
        assert r.result("aggregated") == 3
    finally:
        r.close()  # a running series' count is written at shutdown
    (ev,) = api.objects("Event")
    assert ev["series"]["count"] == 5 and api.count("create", "Event") == 1


def test_the_rate_limit_holds_and_every_cut_is_counted(api: FakeAPIServer) -> None:
    r = Running(api, limit=TokenBucket(5, 4 / 60.0, time.time()))
    try:
        for i in range(20):
            r.writer.record(cut(PodRef("shop", f"web-{i}", f"uid-{i}")))
        assert r.writer.flush(WAIT)
    finally:
        r.close()
    assert len(api.objects("Event")) == 5
    assert r.result("created") == 5 and r.result("rate_limited") == 15


def test_a_403_is_logged_once_and_counted(
    api: FakeAPIServer, running: Running, caplog: pytest.LogCaptureFixture
) -> None:
    api.fail_next("create", "Event", status=403, times=3)
    with caplog.at_level(logging.WARNING, logger="ipvsctl.kube"):
        for i in range(3):
            running.writer.record(cut(PodRef("shop", f"web-{i}", f"uid-{i}")))
            assert running.writer.flush(WAIT)
    forbidden = [r for r in caplog.records if "may not create Events" in r.getMessage()]
    assert len(forbidden) == 1
    assert running.result("forbidden") == 3 and api.objects("Event") == []
    assert api.count("create", "Event") == 3  # each tried once: a 403 is not retried
    running.writer.record(cut(PodRef("shop", "web-9", "uid-9")))  # granted since
    assert running.writer.flush(WAIT)
    assert len(api.objects("Event")) == 1


def test_a_pod_outside_its_slices_namespace_gets_no_event(
    api: FakeAPIServer, running: Running, caplog: pytest.LogCaptureFixture
) -> None:
    # A hand-written slice in shop whose targetRef names kube-system: the cut is counted,
    # logged once, and nothing is written there (nor anywhere).
    stranger = PodRef("kube-system", "coredns-5d7f", "uid-dns")
    with caplog.at_level(logging.WARNING, logger="ipvsctl.kube"):
        assert not running.writer.record(cut(stranger))
        assert not running.writer.record(cut(stranger, port=443))
        assert running.writer.flush(WAIT)
    lines = [r for r in caplog.records if "outside its slice's namespace" in r.getMessage()]
    assert len(lines) == 1
    assert running.result("other_namespace") == 2
    assert api.count("create", "Event") == 0 and api.objects("Event") == []
    assert running.writer.record(cut())  # the slice's own namespace: written as ever
    assert running.writer.flush(WAIT)
    (ev,) = api.objects("Event")
    assert ev["metadata"]["namespace"] == "shop"


def test_a_hung_server_never_blocks_record(api: FakeAPIServer) -> None:
    r = Running(api, queue_size=4, timeout=(0.5, 0.5))
    try:
        api.hang()
        t0 = time.monotonic()
        accepted = [r.writer.record(cut(PodRef("shop", f"w{i}", f"u{i}"))) for i in range(50)]
        assert time.monotonic() - t0 < 0.5
        assert accepted.count(False) >= 40  # the queue is bounded: the rest dropped
        assert r.result("dropped") == accepted.count(False)
    finally:
        api.unhang()
        r.close()


def test_server_errors_are_retried_then_given_up(api: FakeAPIServer, running: Running) -> None:
    api.fail_next("create", "Event", status=500, times=1)
    running.writer.record(cut())
    assert running.writer.flush(WAIT)
    assert len(api.objects("Event")) == 1 and api.count("create", "Event") == 2
    api.fail_next("create", "Event", status=503, times=10)
    running.writer.record(cut(PodRef("shop", "other", "u2")))
    assert running.writer.flush(WAIT)
    assert running.result("error") == 1 and len(api.objects("Event")) == 1


def test_a_restored_table_writes_a_warning_on_the_node(
    api: FakeAPIServer, running: Running
) -> None:
    assert running.writer.record(table_restored("node-1", "ipvs", 12, kube_proxy=True))
    assert running.writer.flush(WAIT)
    (ev,) = api.objects("Event")
    assert ev["metadata"]["namespace"] == "default"  # a Node's Events, as the kubelet's
    assert ev["regarding"] == {"kind": "Node", "apiVersion": "v1", "name": "node-1"}
    assert (ev["reason"], ev["type"]) == ("IPVSTableRestored", "Warning")
    assert "kube-proxy" in ev["note"] and "12 virtual servers" in ev["note"]
    assert running.result("created", "IPVSTableRestored") == 1

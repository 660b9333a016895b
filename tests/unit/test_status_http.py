"""/status rendered a few Services at a time, compressed, shared and streamed."""

from __future__ import annotations

import json
import threading
import time
import tracemalloc
from typing import Any

from bench.cluster import cluster
from ipvsctl.daemon.status_http import StatusDocument
from ipvsctl.daemon.status_json import engine_status
from ipvsctl.httpd import as_json
from ipvsctl.kernel.fake import FakeKernel
from ipvsctl.model import NodeContext
from ipvsctl.reconcile.engine import Engine, EngineConfig
from ipvsctl.reconcile.view import EngineView
from ipvsctl.source.events import ObjectKind, Replace


class CountingLock:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.acquisitions = 0

    def __enter__(self) -> None:
        self.lock.acquire()
        self.acquisitions += 1

    def __exit__(self, *exc: Any) -> None:
        self.lock.release()


def engine(n: int, e: int) -> EngineView:
    kernel = FakeKernel()
    kernel.ops = __import__("collections").deque(maxlen=0)
    eng = Engine(kernel, EngineConfig(NodeContext("node-a"), drain_timeout=3600.0))
    services, slices = cluster(n, e)
    now = time.monotonic()
    eng.handle(Replace(ObjectKind.SERVICE, services, now))
    eng.handle(Replace(ObjectKind.ENDPOINT_SLICE, slices, now))
    assert not eng.sync().failed
    return EngineView(eng)


def body(doc: StatusDocument) -> Any:
    code, ctype, chunks = doc.handler({})
    assert (code, ctype) == (200, "application/json")
    return json.loads(b"".join(chunks))


def test_streamed_document_is_the_engines_status_taken_in_batches() -> None:
    eng = engine(205, 3)
    lock = CountingLock()
    doc = StatusDocument(eng, lock, batch=20, pause=0, min_gap=0)
    got = body(doc)
    assert got == engine_status(eng)
    assert len(got["virtual_servers"]) == 205
    assert lock.acquisitions >= 205 // 20 + 2  # never the whole table under one hold


def test_concurrent_callers_share_one_rendering_until_it_ages() -> None:
    eng = engine(50, 2)
    now = [0.0]
    doc = StatusDocument(eng, threading.Lock(), min_age=1.0, min_gap=0, clock=lambda: now[0])
    results: list[Any] = []
    threads = [threading.Thread(target=lambda: results.append(body(doc))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(results) == 4 and all(r == results[0] for r in results)
    assert doc.renders == 1
    now[0] = 5.0
    body(doc)
    assert doc.renders == 2


def test_rendering_memory_is_a_fraction_of_the_whole_document() -> None:
    eng = engine(1000, 10)
    tracemalloc.start()
    try:
        as_json(200, engine_status(eng))  # what /status did: the whole document at once
        _, whole = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        base, _ = tracemalloc.get_traced_memory()
        doc = StatusDocument(eng, threading.Lock(), pause=0, min_gap=0)
        n = sum(len(c) for c in doc.handler({})[2])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert n > 1_000_000  # 10,000 real servers
    assert peak - base < whole / 5, (peak - base, whole)


def test_status_answers_only_peers_on_the_node(tmp_path: Any) -> None:
    from ipvsctl.kernel.fake import FakeKernel
    from tests.unit.test_daemon import make

    (tmp_path / "m").mkdir()
    d = make(tmp_path, FakeKernel())  # node IP 192.0.2.10
    try:
        assert d.is_local_peer("127.0.0.1") and d.is_local_peer("::1")
        assert d.is_local_peer("192.0.2.10")
        assert not d.is_local_peer("10.244.1.7")  # a pod
        assert d.http.local_only == {"/status", "/v1/node-quiesced", "/v1/handover"}
        assert set(d.http.actions) == {"/v1/handover"}  # POST: loopback only
    finally:
        d.http.stop()

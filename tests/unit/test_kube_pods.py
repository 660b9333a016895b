"""Pod deadline lookups at bounded cost (issue 17.3): jitter, a token bucket, a bounded
queue, cache reads, and no lookup when the Service's annotation decides the deadline."""

from __future__ import annotations

import threading
import time

from ipvsctl.kube.pods import PodFetcher
from ipvsctl.model import PodRef
from ipvsctl.source.events import SourceEvent


class Recorder:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.times: list[float] = []
        self.events: list[SourceEvent] = []
        self.results: list[str] = []

    def get(self, namespace: str, name: str) -> dict:
        with self.lock:
            self.times.append(time.monotonic())
        return {"kind": "Pod", "metadata": {"name": name, "namespace": namespace}}

    def emit(self, event: SourceEvent) -> None:
        with self.lock:
            self.events.append(event)

    def wait(self, n: int, timeout: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if len(self.events) >= n:
                    return True
            time.sleep(0.005)  # polling a condition with a timeout, not a synchronisation
        return False


def run(fetcher: PodFetcher, rec: Recorder, refs: list[PodRef], n: int) -> None:
    halt = threading.Event()
    for ref in refs:
        fetcher.request(ref)
    fetcher.start(rec.emit, halt)
    try:
        assert rec.wait(n)
    finally:
        halt.set()
        fetcher.wake()
        assert not fetcher.join(2.0)


def test_token_bucket_caps_the_get_rate() -> None:
    rec = Recorder()
    f = PodFetcher(rec.get, workers=4, rate=20.0, burst=2, jitter=0.0, on_lookup=rec.results.append)
    run(f, rec, [PodRef("default", f"p{i}") for i in range(8)], 8)
    assert f.gets == 8 and rec.results == ["ok"] * 8
    # 2 at once (the burst), then one per 1/20 s: the last no sooner than 6/20 s after.
    assert rec.times[-1] - rec.times[0] >= 6 / 20 * 0.9


def test_jitter_spreads_the_gets() -> None:
    rec = Recorder()
    f = PodFetcher(rec.get, workers=4, rate=0.0, jitter=0.3)
    started = time.monotonic()
    run(f, rec, [PodRef("default", f"p{i}") for i in range(20)], 20)
    # Twenty uniform draws in [0, 0.3): not all within the first 10 ms (p < 1e-20).
    assert max(rec.times) - started > 0.01


def test_a_full_queue_drops_lookups_with_one_log_line_and_a_count(caplog) -> None:
    rec = Recorder()
    f = PodFetcher(rec.get, workers=1, rate=0.0, jitter=0.0, max_pending=2,
                   on_lookup=rec.results.append)
    with caplog.at_level("WARNING", logger="ipvsctl.kube"):
        run(f, rec, [PodRef("default", f"p{i}") for i in range(5)], 2)
    assert f.dropped == 3 and rec.results.count("dropped") == 3
    assert [r.getMessage() for r in caplog.records].count("pod lookups dropped, queue full") == 1


def test_no_pod_lookup_when_the_annotation_decides_the_deadline() -> None:
    from devkit.builders import endpoint, endpoint_slice, service, terminating
    from devkit.harness import Harness

    a, b = "10.244.1.5", "10.244.1.6"
    for notes, wanted in (({"ipvsctl.io/drain-timeout": "600"}, []),
                                (None, [PodRef("default", "web-1")])):
        h = Harness()
        h.start([service("web", annotations=notes)],
                [endpoint_slice("web", [endpoint(a, pod="web-1"), endpoint(b, pod="web-2")])])
        h.upsert(endpoint_slice("web", [terminating(a, pod="web-1"), endpoint(b, pod="web-2")]))
        assert h.pods_requested == wanted

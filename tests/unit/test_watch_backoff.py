"""Watch backoff as client-go means it, against the fake API server (the real
wire protocol, the real `kubernetes` client) in virtual time: the reflector waits through an
injected `wait` that moves a fake clock, so ten minutes of retries take a second, no sleeps.

The hostile shapes: a watch that delivers a BOOKMARK (or an object) and then a 410 relisted
with no delay at all (30,851 lists in 3 s; ADDED then 410: 20,991); one event then garbled
JSON relisted every initial backoff for ever. Lists are counted per virtual minute."""

from __future__ import annotations

import itertools
import random
import threading
from collections.abc import Iterator

import pytest

from devkit.fakeapi import FakeAPIServer
from ipvsctl.kube.backoff import BackoffManager
from ipvsctl.kube.config import load_configuration, new_api_client
from ipvsctl.kube.listwatch import SERVICES, ListWatch
from ipvsctl.kube.settings import KubeSettings
from ipvsctl.kube.trim import trim_service
from ipvsctl.kube.watch import Reflector
from ipvsctl.source.events import ObjectKind, Replace, SourceEvent

SETTINGS = KubeSettings(probe_interval=0.0, connect_timeout=2.0, list_read_timeout=5.0)
MINUTES = 10


class VirtualTime:
    """The reflector's clock and its waits: a wait moves the clock, and the run ends at
    `end` (the wait then says "halted")."""

    def __init__(self, end: float) -> None:
        self.t = 0.0
        self.end = end

    def now(self) -> float:
        return self.t

    def wait(self, halt: threading.Event, seconds: float) -> bool:
        self.t += max(0.0, seconds)
        if self.t >= self.end:
            halt.set()
        return halt.is_set()


@pytest.fixture
def api() -> Iterator[FakeAPIServer]:
    server = FakeAPIServer().start()
    try:
        yield server
    finally:
        server.stop()


def run_reflector(api: FakeAPIServer, minutes: int = MINUTES) -> tuple[list[float], VirtualTime]:
    """Runs a Service reflector for `minutes` of virtual time; the virtual times of its
    completed lists."""
    vt = VirtualTime(minutes * 60.0)
    services = ListWatch(new_api_client(load_configuration(None, api.url, environ={})), SERVICES)
    lists: list[float] = []

    def emit(event: SourceEvent) -> None:
        if isinstance(event, Replace):
            lists.append(vt.now())

    halt = threading.Event()
    reflector = Reflector(
        kind=ObjectKind.SERVICE,
        resource="services",
        list_func=services,
        trim=trim_service,
        emit=emit,
        settings=SETTINGS,
        clock=vt.now,
        rng=random.Random(25),
        wait=vt.wait,
    )
    thread = threading.Thread(target=reflector.run, args=(halt,), daemon=True)
    thread.start()
    thread.join(60)  # real seconds: a bound for a broken run, not a synchronisation
    if thread.is_alive():
        halt.set()
        reflector.interrupt()
        thread.join(10)
        pytest.fail(f"the reflector did not reach {minutes} virtual minutes")
    return lists, vt


def per_minute(times: list[float], minutes: int = MINUTES) -> list[int]:
    counts = [0] * minutes
    for t in times:
        counts[min(int(t // 60), minutes - 1)] += 1
    return counts


HOSTILE = {
    "bookmark-then-410": {"status": 410, "as_event": True, "before": ("BOOKMARK",)},
    "added-then-410": {"status": 410, "as_event": True, "before": ("ADDED",)},
    "added-then-garbled": {"status": 200, "before": ("ADDED",), "garbled": True},
    "410-at-once": {"status": 410, "as_event": True},
}


@pytest.mark.parametrize("shape", HOSTILE, ids=list(HOSTILE))
def test_a_watch_that_delivers_then_fails_backs_off(api: FakeAPIServer, shape: str) -> None:
    """client-go's pace: delays of [0.8, 1.6), [1.6, 3.2) ... up to [30, 60) s, so at most
    8 lists in the first minute and 2 in each later one, never two within 0.8 s."""
    api.fail_next("watch", "Service", times=1_000_000, **HOSTILE[shape])
    lists, _ = run_reflector(api)
    counts = per_minute(lists)
    assert counts[0] <= 8, counts
    assert all(c <= 2 for c in counts[2:]), counts
    assert sum(counts) <= 8 + 3 + 2 * (MINUTES - 2), counts
    gaps = [b - a for a, b in itertools.pairwise(lists)]
    assert min(gaps) >= SETTINGS.backoff_initial, gaps
    # ... and it keeps trying: a failing server is retried, never given up on
    assert all(c >= 1 for c in counts), counts


@pytest.mark.parametrize("as_event", [False, True], ids=["header", "status-details"])
@pytest.mark.parametrize("status", [429, 503])
def test_retry_after_is_honoured(api: FakeAPIServer, status: int, as_event: bool) -> None:
    """API Priority and Fairness answers 429 with Retry-After: the watch waits at least
    that long (the backoff alone would retry 6 times in the first 20 s)."""
    api.fail_next(
        "watch", "Service", status=status, as_event=as_event, retry_after=20, times=1_000_000
    )
    run_reflector(api, minutes=2)
    watches = api.count("watch", "Service")
    assert watches <= 2 * 60 // 20 + 1, watches
    assert api.count("list", "Service") == 1  # a 429/503 resumes the watch: no relist


def test_retry_after_on_a_list(api: FakeAPIServer) -> None:
    api.fail_next("list", "Service", status=429, retry_after=20, times=1_000_000)
    run_reflector(api, minutes=2)
    assert api.count("list", "Service") <= 2 * 60 // 20 + 1


def test_a_retry_after_beyond_the_backoff_cap_waits_the_cap() -> None:
    """A server cannot park us for hours: Retry-After counts up to backoff_max."""
    api = FakeAPIServer().start()
    try:
        api.fail_next("list", "Service", status=503, retry_after=86_400, times=1_000_000)
        run_reflector(api, minutes=3)
        assert api.count("list", "Service") >= 3  # about one per 30-60 s
    finally:
        api.stop()


# ---- the backoff itself: client-go's NewExponentialBackoffManager(800ms, 30s, 2m, 2, 1) ----


def test_backoff_steps_and_jitter_are_client_gos() -> None:
    t = [0.0]
    b = BackoffManager(0.8, 30.0, 120.0, clock=lambda: t[0], rng=random.Random(1))
    steps = [0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30.0, 30.0]
    for step in steps:
        d = b.next()
        assert step <= d < 2 * step, (step, d)
        t[0] += d


def test_only_a_healthy_period_resets_the_backoff() -> None:
    t = [0.0]
    b = BackoffManager(0.8, 30.0, 120.0, clock=lambda: t[0], rng=random.Random(2))
    for _ in range(6):
        t[0] += b.next() + 5.0  # failures 5 s apart: still failing, the delay grows
    assert b.next() >= 30.0
    t[0] += 119.0
    assert b.next() >= 30.0  # 119 s without a retry is not yet healthy
    t[0] += 121.0
    assert 0.8 <= b.next() < 1.6  # 2 minutes without one: back to the start

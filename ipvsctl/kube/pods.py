"""On-demand pod lookups (`request_pod`): one GET per pod, never a list or watch of pods.

A terminating endpoint's pod carries the drain deadline (`metadata.deletionTimestamp`). When a
Deployment scales down, many endpoints of the same pods turn terminating across several slices
and Services at once: requests for a pod already queued or in flight are coalesced, and an
answer is reused for `cache_seconds`, so such a burst costs one GET per pod.

Every node sends these, so their cost is multiplied by the cluster's size (docs/benchmarks.md,
"Control-plane cost", says why GETs and not a pod watch). Bounds, per node:
- each GET waits a random 0..`jitter` s first, so the nodes of a cluster do not all ask for a
  pod in the same second after one EndpointSlice update;
- a token bucket (`rate` per second, `burst`) caps the request rate whatever the churn;
- at most `max_pending` lookups wait; beyond that a request is dropped (counted, logged once
  per streak) and the drain keeps the next deadline rule (`--drain-timeout`);
- the engine asks only when the Service has no `ipvsctl.io/drain-timeout` (which decides the
  deadline without the pod), and the client reads with `resourceVersion=0` (the API server's
  watch cache, not etcd).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import random
import threading
import time
from collections.abc import Callable

from ipvsctl.kube.backoff import Backoff
from ipvsctl.kube.logs import describe, log
from ipvsctl.kube.trim import trim_pod
from ipvsctl.model import PodRef
from ipvsctl.source.events import Delete, ObjectKind, RawObject, SourceEvent, Upsert

# (namespace, name) -> the pod's JSON, or None when it does not exist (404); raises otherwise.
GetPod = Callable[[str, str], RawObject | None]
# Called once per lookup outcome: "ok", "not_found", "error" (gave up), "dropped" (queue full).
LookupCallback = Callable[[str], None]


class PodFetcher:
    def __init__(
        self,
        get_pod: GetPod,
        *,
        workers: int = 2,
        cache_seconds: float = 2.0,
        attempts: int = 4,
        backoff_initial: float = 0.5,
        backoff_max: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        rate: float = 5.0,
        burst: int = 20,
        jitter: float = 2.0,
        max_pending: int = 2000,
        on_lookup: LookupCallback | None = None,
    ) -> None:
        self._get_pod = get_pod
        self._rng = rng or random.Random()
        self._rate = rate
        self._burst = max(1, burst)
        self._tokens = float(self._burst)
        self._refilled: float | None = None
        self._jitter = max(0.0, jitter)
        self._max_pending = max(1, max_pending)
        self._on_lookup = on_lookup
        self._dropping = False
        self._workers = max(1, workers)
        self._cache_seconds = cache_seconds
        self._attempts = max(1, attempts)
        self._backoff = Backoff(backoff_initial, backoff_max, rng=self._rng)
        self._clock = clock
        self._cond = threading.Condition()
        self._queue: list[tuple[float, int, PodRef, int]] = []  # (due, seq, ref, failures)
        self._seq = itertools.count()
        self._pending: set[PodRef] = set()  # queued, waiting for a retry, or in flight
        self._cache: dict[PodRef, tuple[float, SourceEvent]] = {}
        self._emit: Callable[[SourceEvent], None] | None = None
        self._halt: threading.Event | None = None
        self._threads: list[threading.Thread] = []
        self.gets = 0  # GETs sent
        self.coalesced = 0  # requests absorbed by one already pending
        self.dropped = 0  # requests refused because max_pending were waiting

    def request(self, ref: PodRef) -> None:
        """Queue a lookup; returns at once. Safe before `start` (served once started)."""
        with self._cond:
            if ref in self._pending:
                self.coalesced += 1
                return
            if len(self._pending) >= self._max_pending:
                self.dropped += 1
                first = not self._dropping
                self._dropping = True
            else:
                first = False
                if self._dropping and len(self._pending) < self._max_pending // 2:
                    self._dropping = False
                self._pending.add(ref)
                due = self._clock() + self._jitter * self._rng.random()
                heapq.heappush(self._queue, (due, next(self._seq), ref, 0))
                self._cond.notify()
                return
        if first:
            log(logging.WARNING, "pod lookups dropped, queue full", pod=str(ref),
                pending=self._max_pending)
        self._report("dropped")

    def _report(self, result: str) -> None:
        if self._on_lookup is not None:
            try:
                self._on_lookup(result)
            except Exception as exc:  # a metrics hook must never stop the lookups
                log(logging.ERROR, "pod lookup callback failed", error=describe(exc))

    def _take_token(self, now: float) -> float:
        """0 when a GET may go now (a token is taken), else the seconds until one may.
        Called with the lock held."""
        if self._rate <= 0:
            return 0.0
        if self._refilled is not None:
            self._tokens = min(float(self._burst),
                               self._tokens + (now - self._refilled) * self._rate)
        self._refilled = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return 0.0
        return (1.0 - self._tokens) / self._rate

    def start(self, emit: Callable[[SourceEvent], None], halt: threading.Event) -> None:
        self._emit = emit
        self._halt = halt
        for i in range(self._workers):
            t = threading.Thread(target=self._work, name=f"ipvsctl-kube-pods-{i}", daemon=True)
            t.start()
            self._threads.append(t)

    def wake(self) -> None:
        """Make idle workers notice `halt`."""
        with self._cond:
            self._cond.notify_all()

    def join(self, timeout: float) -> list[threading.Thread]:
        """Join the workers; returns those still alive after `timeout`."""
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return [t for t in self._threads if t.is_alive()]

    def _next(self) -> tuple[PodRef, int] | None:
        assert self._halt is not None
        with self._cond:
            while not self._halt.is_set():
                if self._queue:
                    due, _, ref, failures = self._queue[0]
                    now = self._clock()
                    wait = due - now
                    if wait <= 0:
                        wait = self._take_token(now)
                    if wait <= 0:
                        heapq.heappop(self._queue)
                        return ref, failures
                    self._cond.wait(wait)
                else:
                    self._cond.wait()
            return None

    def _cached(self, ref: PodRef, now: float) -> SourceEvent | None:
        with self._cond:
            hit = self._cache.get(ref)
        if hit is not None and now - hit[0] < self._cache_seconds:
            return hit[1]
        return None

    def _store(self, ref: PodRef, now: float, event: SourceEvent) -> None:
        with self._cond:
            self._cache[ref] = (now, event)
            if len(self._cache) > 1024:  # drop stale answers now and then
                for key in [
                    k for k, (t, _) in self._cache.items() if now - t >= self._cache_seconds
                ]:
                    del self._cache[key]

    def _work(self) -> None:
        assert self._emit is not None and self._halt is not None
        while (item := self._next()) is not None:
            ref, failures = item
            try:
                self._serve(ref, failures)
            except Exception as exc:  # a failing sink: drop this answer, keep serving
                log(logging.ERROR, "pod answer not delivered", pod=str(ref), error=str(exc))
                with self._cond:
                    self._pending.discard(ref)

    def _serve(self, ref: PodRef, failures: int) -> None:
        assert self._emit is not None and self._halt is not None
        now = self._clock()
        event = self._cached(ref, now)
        if event is None:
            try:
                with self._cond:
                    self.gets += 1
                obj = self._get_pod(ref.namespace, ref.name)
            except Exception as exc:
                self._failed(ref, failures, exc)
                return
            received = self._clock()
            if obj is None:
                event = Delete(ObjectKind.POD, ref.namespace, ref.name, received)
            else:
                event = Upsert(ObjectKind.POD, trim_pod(obj), received)
            self._report("ok" if obj is not None else "not_found")
            self._store(ref, received, event)
        if not self._halt.is_set():
            self._emit(event)
        # Only now: requests that came while this one was in flight were answered by it.
        with self._cond:
            self._pending.discard(ref)

    def _failed(self, ref: PodRef, failures: int, exc: Exception) -> None:
        failures += 1
        if failures >= self._attempts or (self._halt is not None and self._halt.is_set()):
            with self._cond:
                self._pending.discard(ref)  # before logging: a new request must be served
            self._report("error")
            log(
                logging.WARNING,
                "pod lookup failed",
                pod=str(ref),
                attempts=failures,
                error=describe(exc),
            )
            return
        delay = self._backoff.delay(failures - 1)
        log(
            logging.DEBUG,
            "pod lookup retry",
            pod=str(ref),
            attempt=failures,
            backoff=round(delay, 3),
            error=describe(exc),
        )
        with self._cond:
            heapq.heappush(self._queue, (self._clock() + delay, next(self._seq), ref, failures))
            self._cond.notify()

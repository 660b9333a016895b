"""Drive a shutdown barrier: the probes do the I/O, an injected clock and sleep keep time.

`Runner` runs one barrier to its end in the calling thread (unit tests drive it on a manual
clock whose `sleep` just moves the time). `SharedBarrier` is what the HTTP server uses: the
first caller starts one barrier in a thread, and every caller, however many and whenever
they come, waits for that barrier's one result, and never past its deadline: a caller
whose wait reaches the deadline while a probe hangs (a DNS lookup, a half-open socket) ends
the barrier itself with a timeout result.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from ipvsctl.obs.logging import fields
from ipvsctl.shutdown.barrier import (
    Action,
    Barrier,
    BarrierConfig,
    BarrierResult,
    CountConnections,
    DaemonAnswer,
    Discover,
    Failure,
    Finish,
    Note,
    Query,
    Wait,
)

log = logging.getLogger("ipvsctl.shutdown")

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING}

Clock = Callable[[], float]
Sleep = Callable[[float], Any]


class Probes(Protocol):
    def discover(self) -> Sequence[str] | Failure: ...

    def query(self, daemons: Sequence[str], timeout: float) -> Mapping[str, DaemonAnswer]: ...

    def count_connections(self) -> int | Failure: ...


class Runner:
    """Feeds one barrier with probe results until it finishes. Every barrier call is made
    under `lock` (shared with whoever may `expire` the barrier from another thread); probes
    and sleeps are not."""

    def __init__(self, barrier: Barrier, probes: Probes, clock: Clock = time.monotonic,
                 sleep: Sleep = time.sleep, lock: threading.Lock | None = None) -> None:
        self.barrier = barrier
        self.probes = probes
        self.clock = clock
        self.sleep = sleep
        self.lock = lock or threading.Lock()

    def run(self) -> BarrierResult:
        return self.drive(self.start())

    def start(self) -> Action:
        return self._call(lambda b: b.start(self.clock()))

    def drive(self, action: Action) -> BarrierResult:
        while not isinstance(action, Finish):
            if isinstance(action, Wait):
                delay = action.until - self.clock()
                if delay > 0:
                    self.sleep(delay)
                action = self._call(lambda b: b.on_timer(self.clock()))
            elif isinstance(action, Discover):
                found = self.probes.discover()
                action = self._call(lambda b, f=found: b.on_daemons(self.clock(), f))
            elif isinstance(action, Query):
                answers = self.probes.query(action.daemons, action.timeout)
                action = self._call(lambda b, a=answers: b.on_answers(self.clock(), a))
            elif isinstance(action, CountConnections):
                count = self.probes.count_connections()
                action = self._call(lambda b, c=count: b.on_connections(self.clock(), c))
            else:  # pragma: no cover - the Action union is closed
                raise TypeError(f"unknown action {action!r}")
        return action.result

    # Notes are logged under the lock: whoever sees the barrier finished (a caller that
    # expires it from another thread) must find its log lines already written.
    def _call(self, fn: Callable[[Barrier], Action]) -> Action:
        with self.lock:
            action = fn(self.barrier)
            emit(self.barrier.take_notes())
        return action

    def expire(self) -> BarrierResult:
        with self.lock:
            finish = self.barrier.expire(self.clock())
            emit(self.barrier.take_notes())
        return finish.result


def emit(notes: Sequence[Note]) -> None:
    for note in notes:
        log.log(_LEVELS.get(note.level, logging.INFO), note.message,
                extra=fields(**note.fields))


class SharedBarrier:
    """One barrier for all callers of `wait()`; see the module docstring."""

    def __init__(self, config: BarrierConfig, pod_ips: Sequence[str], probes: Probes,
                 clock: Clock = time.monotonic, sleep: Sleep = time.sleep) -> None:
        self.config = config
        self.pod_ips = tuple(pod_ips)
        self.probes = probes
        self.clock = clock
        self.sleep = sleep
        self._lock = threading.Lock()  # start/finish bookkeeping
        self._changed = threading.Condition(self._lock)  # waiters came or went
        self._done = threading.Event()
        self._runner: Runner | None = None
        self._result: BarrierResult | None = None
        self.waiters = 0
        self.calls = 0

    @property
    def started(self) -> bool:
        return self._runner is not None

    @property
    def done(self) -> bool:
        return self._done.is_set()

    @property
    def result(self) -> BarrierResult | None:
        return self._result

    def start(self) -> float:
        """Start the barrier unless it is running or done; its deadline (monotonic)."""
        with self._lock:
            if self._runner is None:
                runner = Runner(Barrier(self.config, self.pod_ips), self.probes,
                                self.clock, self.sleep)
                first = runner.start()
                self._runner = runner
                threading.Thread(target=self._run, args=(runner, first),
                                 name="shutdown-barrier", daemon=True).start()
            return self._runner.barrier.deadline

    def wait(self) -> BarrierResult:
        """Start (or join) the barrier and wait for its result, never past its deadline."""
        with self._lock:
            self.calls += 1
            self.waiters += 1
            self._changed.notify_all()
        try:
            deadline = self.start()
            self._done.wait(max(0.0, deadline - self.clock()))
            if not self._done.is_set():
                assert self._runner is not None
                self._set(self._runner.expire())  # a probe is stuck past the deadline
            assert self._result is not None
            return self._result
        finally:
            with self._lock:
                self.waiters -= 1
                self._changed.notify_all()

    def wait_done(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)

    def wait_for_waiters(self, n: int, timeout: float | None = None) -> bool:
        """Block until at least `n` callers are inside `wait()` (tests, /status)."""
        with self._changed:
            return self._changed.wait_for(lambda: self.waiters >= n, timeout)

    def _run(self, runner: Runner, first: Action) -> None:
        try:
            result = runner.drive(first)
        except Exception:  # a bug must not leave callers waiting until the deadline
            log.exception("shutdown barrier failed")
            result = runner.expire()
        self._set(result)

    def _set(self, result: BarrierResult) -> None:
        with self._lock:
            if self._result is None:
                self._result = result
            self._done.set()

    def status(self) -> dict[str, Any]:
        """What /status shows: idle, running (stage, elapsed) or done (the result)."""
        with self._lock:
            runner, result = self._runner, self._result
        if runner is None:
            return {"state": "idle", "pod_ips": list(self.pod_ips)}
        if result is not None:
            return {"state": "done", "result": result.to_json()}
        with runner.lock:
            b = runner.barrier
            assert b.started_at is not None
            return {
                "state": "running", "stage": b.stage.value, "pod_ips": list(self.pod_ips),
                "elapsed_seconds": round(self.clock() - b.started_at, 3),
                "timeout_seconds": self.config.timeout,
                "daemons": {"total": len(b.daemons), "quiesced": len(b.quiesced),
                            "not_quiesced": {d: b.problems.get(d, "no answer yet")
                                             for d in b.daemons if d not in b.quiesced},
                            "discovery_error": b.discovery_error},
                "connections": {"established": b.connections,
                                "min_open_connections": self.config.min_open_connections,
                                "error": b.connections_error},
                "waiters": self.waiters,
            }

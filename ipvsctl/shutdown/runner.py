"""Drive a shutdown barrier: the probes do the I/O, an injected clock and sleep keep time.

`Runner` runs one barrier to its end in the calling thread (unit tests drive it on a manual
clock whose `sleep` just moves the time). `SharedBarrier` is what the HTTP server uses: a
caller starts a barrier in a thread when none is running, or joins the running one (which
then checks again from the caller's arrival and runs until the latest caller's deadline);
each caller waits for an answer made after it came, never past its own deadline; a
finished barrier's result is never handed to a later caller. A caller whose wait reaches
the barrier's deadline while a probe hangs (a DNS lookup, a half-open socket) ends the
barrier itself with a timeout result.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Concatenate, ParamSpec, Protocol

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

P = ParamSpec("P")

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

    def __init__(
        self,
        barrier: Barrier,
        probes: Probes,
        clock: Clock = time.monotonic,
        sleep: Sleep = time.sleep,
        lock: threading.Lock | None = None,
    ) -> None:
        self.barrier = barrier
        self.probes = probes
        self.clock = clock
        self.sleep = sleep
        self.lock = lock or threading.Lock()

    def run(self) -> BarrierResult:
        return self.drive(self.start())

    def start(self) -> Action:
        return self._call(Barrier.start)

    def drive(self, action: Action) -> BarrierResult:
        while not isinstance(action, Finish):
            if isinstance(action, Wait):
                delay = action.until - self.clock()
                if delay > 0:
                    self.sleep(delay)
                action = self._call(Barrier.on_timer)
            elif isinstance(action, Discover):
                found = self.probes.discover()
                action = self._call(Barrier.on_daemons, found)
            elif isinstance(action, Query):
                answers = self.probes.query(action.daemons, action.timeout)
                action = self._call(Barrier.on_answers, answers, action.generation)
            elif isinstance(action, CountConnections):
                count = self.probes.count_connections()
                action = self._call(Barrier.on_connections, count, action.generation)
            else:  # pragma: no cover - the Action union is closed
                raise TypeError(f"unknown action {action!r}")
        return action.result

    # Notes are logged under the lock: whoever sees the barrier finished (a caller that
    # expires it from another thread) must find its log lines already written.
    def _call(
        self,
        method: Callable[Concatenate[Barrier, float, P], Action],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> Action:
        """A barrier method with the time now, under the lock (the clock read there too)."""
        with self.lock:
            action = method(self.barrier, self.clock(), *args, **kwargs)
            emit(self.barrier.take_notes())
        return action

    def expire(self) -> BarrierResult:
        with self.lock:
            finish = self.barrier.expire(self.clock())
            emit(self.barrier.take_notes())
        return finish.result


def emit(notes: Sequence[Note]) -> None:
    for note in notes:
        log.log(_LEVELS.get(note.level, logging.INFO), note.message, extra=fields(**note.fields))


class _Run:
    """One barrier run and the callers waiting on it."""

    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self.done = threading.Event()
        self.result: BarrierResult | None = None


class Ticket:
    """One caller of the shared barrier, answered without a thread of its own: `poll()`
    gives its result once there is one (the HTTP server parks the request and polls;
    `SharedBarrier.wait()` blocks on it). Its result is made after it came, and comes by
    its own deadline (arrival + timeout)."""

    def __init__(self, shared: SharedBarrier, run: _Run, arrived: float) -> None:
        self.shared = shared
        self.run = run
        self.arrived = arrived
        self.deadline = arrived + shared.config.timeout  # on the barrier's clock
        self.result: BarrierResult | None = None
        self._closed = False

    def poll(self, now: float, force: bool = False) -> BarrierResult | None:
        """The result, or None while it is not there; `force`: this caller's deadline has
        come whatever `now` says."""
        if self.result is not None or self._closed:
            return self.result
        run = self.run
        if run.done.is_set():
            assert run.result is not None
            return self._finish(run.result)
        if not force and now < self.deadline:
            return None
        with run.runner.lock:
            still_running = run.runner.barrier.result is None
            later = run.runner.barrier.deadline > self.shared.clock()
            if still_running and later:  # it goes on for a later caller
                result = run.runner.barrier.result_now(self.shared.clock())
                log.warning(
                    "shutdown caller timed out, barrier goes on for a later caller",
                    extra=fields(summary=result.message),
                )
                return self._finish(result)
        # Our deadline is the barrier's: a probe is stuck past it.
        self.shared._set(run, run.runner.expire())
        assert run.result is not None
        return self._finish(run.result)

    def cancel(self) -> None:
        """The caller went away before its answer."""
        self._finish(None)

    def _finish(self, result: BarrierResult | None) -> BarrierResult | None:
        with self.shared._lock:
            if not self._closed:
                self._closed = True
                self.result = result
                self.shared.waiters -= 1
                self.shared._changed.notify_all()
        return self.result


class SharedBarrier:
    """The barrier for all callers of `wait()` or `call()`; see the module docstring."""

    def __init__(
        self,
        config: BarrierConfig,
        pod_ips: Sequence[str],
        probes: Probes,
        clock: Clock = time.monotonic,
        sleep: Sleep = time.sleep,
    ) -> None:
        self.config = config
        self.pod_ips = tuple(pod_ips)
        self.probes = probes
        self.clock = clock
        self.sleep = sleep
        self._lock = threading.Lock()  # start/finish bookkeeping
        self._changed = threading.Condition(self._lock)  # waiters came or went
        self._run: _Run | None = None  # the current or last run
        # Called (from the barrier's thread) when a run finishes: parked callers' answers
        # are ready (the HTTP server's wake).
        self.listeners: list[Callable[[], None]] = []
        self.waiters = 0
        self.calls = 0
        self.runs = 0

    @property
    def started(self) -> bool:
        return self._run is not None

    @property
    def done(self) -> bool:
        return self._run is not None and self._run.done.is_set()

    @property
    def result(self) -> BarrierResult | None:
        return self._run.result if self._run is not None else None

    def _start_or_join(self, now: float) -> _Run:
        with self._lock:
            run = self._run
            if run is None or run.done.is_set():
                # Never a result from before this caller came: a new barrier.
                runner = Runner(
                    Barrier(self.config, self.pod_ips), self.probes, self.clock, self.sleep
                )
                first = runner.start()
                run = self._run = _Run(runner)
                self.runs += 1
                threading.Thread(
                    target=self._drive, args=(run, first), name="shutdown-barrier", daemon=True
                ).start()
                return run
        with run.runner.lock:
            if run.runner.barrier.result is None:
                run.runner.barrier.join(now)
                emit(run.runner.barrier.take_notes())
                return run
        run.done.wait()  # finished just now: that result predates this caller
        return self._start_or_join(now)

    def call(self) -> Ticket:
        """Start (or join) the barrier for a caller that is answered later (`Ticket.poll`):
        no thread waits for it."""
        arrived = self.clock()
        with self._lock:
            self.calls += 1
            self.waiters += 1
            self._changed.notify_all()
        try:
            run = self._start_or_join(arrived)
        except BaseException:
            with self._lock:
                self.waiters -= 1
                self._changed.notify_all()
            raise
        return Ticket(self, run, arrived)

    def wait(self) -> BarrierResult:
        """Start (or join) the barrier and wait for an answer made after this call began,
        never past this caller's own deadline (arrival + timeout)."""
        ticket = self.call()
        try:
            ticket.run.done.wait(max(0.0, ticket.deadline - self.clock()))
            result = ticket.poll(self.clock(), force=True)
            assert result is not None
            return result
        finally:
            ticket.cancel()  # a no-op once answered

    def settle(self) -> BarrierResult | None:
        """On SIGTERM: see the current run (if any) to its end, never past its deadline;
        starts nothing and joins nothing."""
        run = self._run
        if run is None:
            return None
        with run.runner.lock:
            deadline = run.runner.barrier.deadline
        run.done.wait(max(0.0, deadline - self.clock()))
        if not run.done.is_set():
            self._set(run, run.runner.expire())
        return run.result

    def wait_done(self, timeout: float | None = None) -> bool:
        run = self._run
        return run is not None and run.done.wait(timeout)

    def wait_for_waiters(self, n: int, timeout: float | None = None) -> bool:
        """Block until at least `n` callers are inside `wait()` (tests, /status)."""
        with self._changed:
            return self._changed.wait_for(lambda: self.waiters >= n, timeout)

    def _drive(self, run: _Run, first: Action) -> None:
        try:
            result = run.runner.drive(first)
        except Exception:  # a bug must not leave callers waiting until the deadline
            log.exception("shutdown barrier failed")
            result = run.runner.expire()
        self._set(run, result)

    def _set(self, run: _Run, result: BarrierResult) -> None:
        with self._lock:
            if run.result is None:
                run.result = result
            run.done.set()
        for listener in self.listeners:
            try:
                listener()
            except Exception:  # a waker must not stop the barrier
                log.exception("shutdown barrier listener failed")

    def status(self) -> dict[str, Any]:
        """What /status shows: idle, running (stage, elapsed) or done (the last result)."""
        with self._lock:
            run = self._run
        if run is None:
            return {"state": "idle", "pod_ips": list(self.pod_ips)}
        if run.result is not None:
            return {"state": "done", "result": run.result.to_json(), "runs": self.runs}
        with run.runner.lock:
            b = run.runner.barrier
            assert b.started_at is not None
            return {
                "state": "running",
                "stage": b.stage.value,
                "pod_ips": list(self.pod_ips),
                "elapsed_seconds": round(self.clock() - b.started_at, 3),
                "timeout_seconds": self.config.timeout,
                "deadline_in_seconds": round(b.deadline - self.clock(), 3),
                "daemons": {
                    "total": len(b.daemons),
                    "quiesced": len(b.quiesced),
                    "not_quiesced": {
                        d: b.problems.get(d, "no answer yet")
                        for d in b.daemons
                        if d not in b.quiesced
                    },
                    "discovery_error": b.discovery_error,
                },
                "connections": {
                    "established": b.connections,
                    "min_open_connections": self.config.min_open_connections,
                    "error": b.connections_error,
                },
                "waiters": self.waiters,
                "joins": b.joins,
                "runs": self.runs,
            }

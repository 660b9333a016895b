"""Background reads of the kernel, off the loop's lock: one protocol, one paced runner.

The drain check, the drift audit and the conntrack sweep each read much of the kernel
(a table file, a dump, a conntrack table) and act on a little of it. Done by the loop, an
event would wait behind every read; so each is three parts, the lock held only at the ends:

    snapshot()     under the lock: what to read, O(what it needs); None: nothing to do now
    read(plan)     off the lock: the kernel's part (reads, and the sweep's deletes)
    apply(reading) under the lock: act on what was read, if it still holds

`PacedRunner` runs one of them on its own thread (a drain check must never wait behind a
full dump of the audit), paced by one rule (`paced`): at least `every` from start to start,
and at least `duty` times the read's own duration after it, so a slow kernel makes it read
less often rather than all the time; with the loop's `EventsFirst` the read runs at the
short switch interval (`events_first.py`). Tests run one pass in their own thread
(`run_once`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from ipvsctl.obs.logging import fields
from ipvsctl.reconcile.clock import Clock, SystemClock, paced
from ipvsctl.reconcile.events_first import EventsFirst

log = logging.getLogger("ipvsctl.loop")

PlanT = TypeVar("PlanT")
ReadingT = TypeVar("ReadingT")
ResultT_co = TypeVar("ResultT_co", covariant=True)


class BackgroundRead(Protocol[PlanT, ReadingT, ResultT_co]):
    def snapshot(self) -> PlanT | None: ...

    def read(self, plan: PlanT) -> ReadingT: ...

    def apply(self, reading: ReadingT) -> ResultT_co: ...


@dataclass(frozen=True, slots=True)
class Pace:
    every: float  # seconds from start to start, at least
    duty: float = 0.0  # and at least duty x the read's duration after it ended
    rest: float = 0.0  # and at least this after it ended
    first: float = 0.0  # the first pass this long after the thread starts
    poll: float | None = None  # a pass that found nothing to do: again after this (every)


def run_once(
    task: BackgroundRead[PlanT, ReadingT, ResultT_co],
    lock: AbstractContextManager[Any] | None = None,
) -> ResultT_co | None:
    """One pass in the caller's thread (tests, and anything that wants one now): None
    when the task had nothing to do."""
    guard = lock if lock is not None else nullcontext()
    with guard:
        plan = task.snapshot()
    if plan is None:
        return None
    reading = task.read(plan)
    with guard:
        return task.apply(reading)


class PacedRunner:
    """Runs one background read, paced, on the thread that calls `run`. `wake` (a task's
    own event, say the sweep's request) makes it look again at once, within its pace."""

    def __init__(
        self,
        name: str,
        task: BackgroundRead[Any, Any, Any],
        lock: AbstractContextManager[Any],
        pace: Pace,
        *,
        clock: Clock | None = None,
        wake: threading.Event | None = None,
        survive: bool = False,
        on_health: Callable[[BaseException | None], None] | None = None,
        events_first: EventsFirst | None = None,
    ) -> None:
        self.name = name
        self.events_first = events_first
        self.survive = survive
        # With `survive`: told the error of each pass that raised, None after a good one.
        self.on_health = on_health
        self.task = task
        self.lock = lock
        self.pace = pace
        self.clock = clock or SystemClock()
        self.wake = wake or threading.Event()
        self.not_before = self.clock.monotonic() + pace.first
        self._poll_at = self.not_before

    def step(self) -> bool:
        """One pass if due: False when it is not, or the task had nothing to do."""
        started = self.clock.monotonic()
        if started < self.not_before:
            return False
        with self.lock:
            plan = self.task.snapshot()
        if plan is None:
            poll = self.pace.every if self.pace.poll is None else self.pace.poll
            self.not_before = max(self.not_before, started + self.pace.every)
            self._poll_at = max(self.not_before, started + poll)
            return False
        t0 = self.clock.monotonic()
        took: float | None = None
        try:
            with self.events_first.reading() if self.events_first else nullcontext():
                reading = self.task.read(plan)
            took = self.clock.monotonic() - t0
            with self.lock:
                self.task.apply(reading)
        finally:
            # The pace's measure is the read's own time, not a wait for the lock (say
            # behind a 5 s initial sync).
            ended = self.clock.monotonic()
            if took is None:
                took = ended - t0
            self.not_before = self._poll_at = max(
                started + self.pace.every,
                paced(ended - took, ended, duty=self.pace.duty, rest=self.pace.rest),
            )
        return True

    def timeout(self) -> float:
        """How long the thread may sleep before the next pass is due."""
        return max(0.0, max(self.not_before, self._poll_at) - self.clock.monotonic())

    def run(self, stop: threading.Event) -> None:
        """Until `stop` (set `wake` too, to end the wait at once). An exception ends the
        thread (the daemon's /healthz then fails), unless the runner was made with
        `survive` (the audit: a safety net whose failure must not end the daemon)."""
        while not stop.is_set():
            self.wake.clear()
            try:
                self.step()
            except Exception as exc:
                if not self.survive:
                    raise
                log.exception("background read failed", extra=fields(read=self.name))
                if self.on_health is not None:
                    self.on_health(exc)
            else:
                if self.on_health is not None:
                    self.on_health(None)
            self.wake.wait(self.timeout())

"""Events before background reads: a reader busy in Python steps aside for the loop.

One thread runs Python at a time (CPython's GIL). A thread that wants it while another
runs Python gets it when that one blocks in a system call, or else only after the switch
interval (1 ms in the daemon, `daemon/wiring.py`), when the holder is asked to drop it. A
change takes the GIL three times on its way to the kernel: when the loop wakes from the
event queue, and after the send and after the receive of its netlink request (each
releases it). Behind a reader busy in Python (an audit round comparing every virtual
server, a drain check judging its reading) each of the three could wait that interval:
on the host, p99 2.8-4.3 ms during back-to-back audits against 0.5-0.6 ms idle.

Two measures, both here:

- `give_way()`: the readers call it in their loops, every few items. While an event is
  queued or being applied, the reader waits for the loop's step to end, so the loop runs
  alone and none of its handoffs waits. At most once per step and for at most `max_wait`
  (a long sync must not stop the drain checks for its whole length).
- `reading()`: while the audit reads (its runner is given this object), the switch
  interval is `READING_SWITCH_INTERVAL`, so a loop that wakes while it parses and sorts a
  dump (no give-way point there) waits for the GIL that long, not 1 ms. Only while the
  loop waits: from `took_events` to `step_done` the loop's own interval is back, so its step
  is not cut into 50 us turns with the reader's Python (each a GIL handoff; under emulation
  that made the loop's steps during an audit several times slower). Not for the drain
  check: a short interval also cuts the loop's own work into 50 us turns with a reader
  that has no give-way point (its table scan), and in the one VM run with it (a loaded
  host) the draining phase's p99 was 2.8x idle against 1.7x before.
"""

from __future__ import annotations

import queue
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

READING_SWITCH_INTERVAL = 0.00005  # seconds: 50 us while a background read runs
MAX_WAIT = 0.05  # seconds a reader waits for one step of the loop, at most


class EventsFirst:
    """Shared by the loop (`took_events`, `step_done`) and the background readers
    (`give_way`, `reading`)."""

    def __init__(self, events: queue.Queue[Any], *, max_wait: float = MAX_WAIT) -> None:
        self._events = events
        self.max_wait = max_wait
        self._cond = threading.Condition(threading.Lock())
        self._applying = False  # the loop took events and its step has not ended
        self.steps = 0  # the loop's steps ended so far
        self.parked = 0  # readers waiting in give_way now
        self.gave_way = 0  # times a reader waited, ever (tests, the benchmark)
        self._last = threading.local()  # per reader: the step it last waited for
        self._reading_lock = threading.Lock()
        self._reading = 0
        self._interval = 0.0  # the switch interval to restore when no reader reads

    # --- the loop -----------------------------------------------------------------------
    def took_events(self) -> None:
        self._applying = True
        with self._reading_lock:
            if self._reading:  # the loop's own work is not cut into short turns
                sys.setswitchinterval(self._interval)

    def step_done(self) -> None:
        with self._reading_lock:
            if self._reading:
                sys.setswitchinterval(min(self._interval, READING_SWITCH_INTERVAL))
        with self._cond:
            self._applying = False
            self.steps += 1
            self._cond.notify_all()

    # --- the readers --------------------------------------------------------------------
    def give_way(self) -> None:
        """Wait for the loop's step while an event is queued or being applied; returns at
        once otherwise (two attribute reads and the queue's size)."""
        if not self._applying and not self._events.qsize():
            return
        step = self.steps
        if getattr(self._last, "step", None) == step:
            return  # already waited for this step (max_wait ran out): read on
        self._last.step = step
        with self._cond:
            self.parked += 1
            self.gave_way += 1
            self._cond.notify_all()  # (tests wait for a reader to park)
            try:
                self._cond.wait_for(lambda: self.steps != step, self.max_wait)
            finally:
                self.parked -= 1

    def wait_parked(self, readers: int, timeout: float) -> bool:
        """True once `readers` readers wait in give_way (tests and the benchmark)."""
        with self._cond:
            return self._cond.wait_for(lambda: self.parked >= readers, timeout)

    @contextmanager
    def reading(self) -> Iterator[None]:
        """Around a background read: the short switch interval while any such read runs."""
        with self._reading_lock:
            self._reading += 1
            if self._reading == 1:
                self._interval = sys.getswitchinterval()
                if not self._applying:
                    sys.setswitchinterval(min(self._interval, READING_SWITCH_INTERVAL))
        try:
            yield
        finally:
            with self._reading_lock:
                self._reading -= 1
                if self._reading == 0:
                    sys.setswitchinterval(self._interval)

"""The drain queue's writes, off the loop thread.

A whole-queue write costs ~10 ms of fsyncs and ~20 ms per 1,000 entries of JSON (200 ms at
10,000, measured on the dev VM's disk): done by the loop, every step that starts a drain
would hold up the next events. The loop hands over a view of the queue (`submit`, O(1):
the loop's `QueueView` copies the entries only when this thread reads it to write) and this
thread writes the newest one; views that arrive during a write replace each other, so a
burst costs one write (and one copy) more than its duration needs, never a queue.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

from ipvsctl.model import DrainEntry
from ipvsctl.obs.logging import FailureStreaks

log = logging.getLogger("ipvsctl.loop")


class StateWriter:
    def __init__(
        self,
        save: Callable[[Sequence[DrainEntry]], None],
        on_error: Callable[[], None] | None = None,
        retry_interval: float = 0.5,
        on_health: Callable[[BaseException | None], None] | None = None,
    ) -> None:
        self.save = save
        self.on_error = on_error
        # Told the error of each failed write and None after a good one (a degraded
        # condition: the daemon works on, but a restart would lose the deadlines).
        self.on_health = on_health
        self.retry_interval = retry_interval
        self._cond = threading.Condition()
        self._pending: Sequence[DrainEntry] | None = None
        self._writing = False
        self._failing = FailureStreaks(log)

    def submit(self, entries: Sequence[DrainEntry]) -> None:
        """The newest queue to write; returns at once (the loop's `save_queue`)."""
        with self._cond:
            self._pending = entries
            self._cond.notify_all()

    def run(self, stop: threading.Event) -> None:
        """Write what is submitted until `stop`; then write what is still pending."""
        while True:
            with self._cond:
                while self._pending is None and not stop.is_set():
                    self._cond.wait(0.5)
                entries, self._pending = self._pending, None
                self._writing = entries is not None
            ok = True
            if entries is not None:
                ok = self._write(entries, stop)
                with self._cond:
                    self._writing = False
                    self._cond.notify_all()
            if stop.is_set() and (self._pending is None or not ok):
                return  # a failing disk is not retried at exit (shutdown tries once more)

    def _write(self, entries: Sequence[DrainEntry], stop: threading.Event) -> bool:
        try:
            self.save(entries)
        except OSError as exc:
            if self.on_error is not None:
                self.on_error()
            if self.on_health is not None:
                self.on_health(exc)
            self._failing.failed(logging.ERROR, "drain state write failed", error=exc)
            with self._cond:  # retried later unless a newer queue arrives first
                if self._pending is None:
                    self._pending = entries
                if not stop.is_set():
                    self._cond.wait(self.retry_interval)
            return False
        self._failing.recovered("drain state writable again")
        if self.on_health is not None:
            self.on_health(None)
        return True

    def wait_idle(self, timeout: float) -> bool:
        """True once nothing is pending or being written (for tests and shutdown)."""
        with self._cond:
            return self._cond.wait_for(lambda: self._pending is None and not self._writing, timeout)

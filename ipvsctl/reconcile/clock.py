"""Time, injected: wall clock for deadlines that survive restarts, monotonic for latencies,
the thread's CPU time for what a kernel read costs."""

from __future__ import annotations

import time
from typing import Protocol


def paced(
    started: float, ended: float, *, duty: float, every: float = 0.0, rest: float = 0.0
) -> float:
    """When a paced background read that ran from `started` to `ended` may run next: at
    least `every` after it started, `rest` after it ended, and `duty` times its duration
    after it ended, so it reads at most 1 / (1 + duty) of the time however slow the kernel
    is (the audit, the drain check's connection-table pass, the conntrack sweep)."""
    return max(started + every, ended + rest, ended + duty * (ended - started))


class Clock(Protocol):
    def wall(self) -> float: ...

    def monotonic(self) -> float: ...

    def thread_time(self) -> float: ...


class SystemClock:
    def wall(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def thread_time(self) -> float:
        """The calling thread's CPU time (user and system): what a read itself cost,
        without the time it waited while other threads held the interpreter."""
        return time.thread_time()


class ManualClock:
    """A clock tests move by hand."""

    def __init__(self, wall: float = 1_700_000_000.0, monotonic: float = 1000.0) -> None:
        self._wall = wall
        self._mono = monotonic

    def wall(self) -> float:
        return self._wall

    def monotonic(self) -> float:
        return self._mono

    def thread_time(self) -> float:
        return self._mono  # moved by hand: what a test advances is the work done

    def advance(self, seconds: float) -> None:
        self._wall += seconds
        self._mono += seconds

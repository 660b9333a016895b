"""Time, injected: wall clock for deadlines that survive restarts, monotonic for latencies."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def wall(self) -> float: ...

    def monotonic(self) -> float: ...


class SystemClock:
    def wall(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock tests move by hand."""

    def __init__(self, wall: float = 1_700_000_000.0, monotonic: float = 1000.0) -> None:
        self._wall = wall
        self._mono = monotonic

    def wall(self) -> float:
        return self._wall

    def monotonic(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> None:
        self._wall += seconds
        self._mono += seconds

"""Capped, jittered exponential backoff (no I/O: callers sleep with `Event.wait`)."""

from __future__ import annotations

import random


class Backoff:
    """`initial` doubling up to `maximum`. Each delay is scaled by a random factor in
    [1 - jitter, 1], so nodes retrying after one API server outage spread out, while
    consecutive delays still grow (with jitter < 0.5)."""

    def __init__(
        self,
        initial: float = 0.5,
        maximum: float = 30.0,
        *,
        jitter: float = 0.2,
        rng: random.Random | None = None,
    ) -> None:
        if initial <= 0 or maximum < initial or not 0 <= jitter < 1:
            raise ValueError("need 0 < initial <= maximum and 0 <= jitter < 1")
        self.initial = initial
        self.maximum = maximum
        self.jitter = jitter
        self._rng = rng or random.Random()
        self.failures = 0

    def delay(self, failures: int) -> float:
        """The delay after `failures` consecutive failures (0: the first retry)."""
        base = min(self.maximum, self.initial * (2.0 ** min(failures, 62)))
        return base * (1.0 - self.jitter * self._rng.random())

    def next(self) -> float:
        """The delay before the next attempt; counts one more failure."""
        d = self.delay(self.failures)
        self.failures += 1
        return d

    def reset(self) -> None:
        self.failures = 0

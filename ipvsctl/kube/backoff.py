"""Capped, jittered exponential backoff (no I/O: callers sleep with `Event.wait`)."""

from __future__ import annotations

import random
from collections.abc import Callable


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


class BackoffManager:
    """client-go's `NewExponentialBackoffManager(initial, maximum, reset_after, 2.0, 1.0)`,
    the reflector's: each delay is the current step times a random factor in [1, 1 + jitter)
    (with jitter 1.0: [d, 2d)), and the step doubles up to `maximum`. Nothing resets it but
    time: a delay asked for more than `reset_after` seconds after the previous one starts
    again from `initial`. So a watch that delivers something and then fails within seconds,
    over and over, keeps backing off: only a healthy period (no retry for 2 minutes) brings
    the delay back down."""

    def __init__(
        self,
        initial: float = 0.8,
        maximum: float = 30.0,
        reset_after: float = 120.0,
        *,
        factor: float = 2.0,
        jitter: float = 1.0,
        clock: Callable[[], float],
        rng: random.Random | None = None,
    ) -> None:
        if initial <= 0 or maximum < initial or factor < 1 or jitter < 0:
            raise ValueError("need 0 < initial <= maximum, factor >= 1 and jitter >= 0")
        self.initial = initial
        self.maximum = maximum
        self.reset_after = reset_after
        self.factor = factor
        self.jitter = jitter
        self._clock = clock
        self._rng = rng or random.Random()
        self._step = initial
        self._last: float | None = None  # when the previous delay was asked for

    def recent(self) -> bool:
        """A delay was asked for within `reset_after` (the server has been failing)."""
        return self._last is not None and self._clock() - self._last <= self.reset_after

    def next(self) -> float:
        """The delay before the next attempt (its start counts as the last backoff)."""
        if not self.recent():
            self._step = self.initial
        self._last = self._clock()
        step = self._step
        self._step = min(self.maximum, self._step * self.factor)
        return step * (1.0 + self.jitter * self._rng.random())

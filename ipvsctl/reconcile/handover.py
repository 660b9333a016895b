"""The handover, the running part (the rule: plan/handover.py): this node handed over to
another proxy once the last connection through ipvsctl's virtual servers ended.

- `ask()` (an HTTP thread, under the loop's lock): the engine holds what it has
  (`Engine.hold`: nothing new from now on; it still restores what it holds) and the readings
  begin. Asked again, it is the same handover. Before the first full sync there is no table
  to hand over: refused, to be asked again.
- the reading is a background read (`paced.py`) on its own thread, never on the event path,
  every `interval` while handing over: one pass over /proc/net/ip_vs for ipvsctl's virtual
  servers, and over /proc/net/ip_vs_conn for the real servers with inactive connections
  (which may be closing ones still carrying data);
- `apply`: a reading begun after the request that found nothing open releases everything
  (`Engine.release_all`: virtual servers, their addresses; the features hear it on the
  feed and remove theirs, the nftables table among them) and the daemon is idle;
- `state()`: the answer, from plain attributes (no lock): `/v1/handover`.
"""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from ipvsctl.kernel.port import IPVSKernel, KernelError
from ipvsctl.model import ServiceKey
from ipvsctl.obs.logging import FailureStreaks, fields
from ipvsctl.obs.metrics import Metrics
from ipvsctl.plan.handover import (
    HandoverState,
    OpenConnections,
    Phase,
    due,
    held_of,
    inactive_pairs,
    open_connections,
)
from ipvsctl.reconcile.clock import Clock
from ipvsctl.reconcile.engine import Engine

log = logging.getLogger("ipvsctl.handover")


@dataclass(frozen=True, slots=True)
class HandoverPlan:
    started: float  # monotonic
    keys: list[ServiceKey]


@dataclass(frozen=True, slots=True)
class HandoverReading:
    plan: HandoverPlan
    open: OpenConnections | None  # None: could not be told this time


class Handover:
    def __init__(
        self,
        engine: Engine,
        kernel: IPVSKernel,
        metrics: Metrics,
        clock: Clock,
        lock: AbstractContextManager[Any],
        *,
        interval: float = 1.0,
    ) -> None:
        self.engine = engine
        self.kernel = kernel
        self.metrics = metrics
        self.clock = clock
        self.lock = lock
        self.interval = interval
        # Plain attributes, replaced whole: the HTTP threads read them without the lock.
        self.phase = Phase.SERVING
        self.asked_at: float | None = None  # monotonic
        self.open: OpenConnections | None = None  # the last reading begun after the request
        self._next_read = 0.0
        self._failing = FailureStreaks(log)
        metrics.handover_phase.set_function(
            lambda: {Phase.SERVING: 0, Phase.HANDING_OVER: 1, Phase.HANDED_OVER: 2}[self.phase]
        )

    # --- the request (an HTTP thread) ------------------------------------------------------
    def ask(self) -> tuple[int, HandoverState]:
        """(HTTP status, state): 202 handing over (asked now or before), 200 handed over,
        503 not ready yet (no first full sync: nothing to hand over)."""
        with self.lock:
            if self.phase is Phase.HANDED_OVER:
                return 200, self.state()
            if self.phase is Phase.SERVING:
                if not self.engine.started:
                    return 503, self.state()
                self.engine.hold(held_of(self.engine.state.by_service))
                self.asked_at = self.clock.monotonic()
                self._next_read = self.asked_at
                self.phase = Phase.HANDING_OVER
                log.warning(
                    "handover asked: adding nothing new, waiting for the last connection",
                    extra=fields(virtual_servers=self.engine.state.n_vs),
                )
            return 202, self.state()

    # --- the background read ----------------------------------------------------------------
    def snapshot(self) -> HandoverPlan | None:
        now = self.clock.monotonic()
        if self.phase is not Phase.HANDING_OVER or now < self._next_read:
            return None
        self._next_read = now + self.interval
        return HandoverPlan(now, list(self.engine.state.owner))

    def read(self, plan: HandoverPlan) -> HandoverReading:
        if not plan.keys:
            return HandoverReading(plan, OpenConnections(0, 0))
        try:
            table = self.kernel.read_real_servers(plan.keys)
            pairs = inactive_pairs(table)
            scan = self.kernel.read_connections(pairs) if pairs else None
        except KernelError as exc:
            self.metrics.netlink_errors.labels(exc.operation or "read_real_servers").inc()
            self._failing.failed(logging.WARNING, "handover cannot count connections", error=exc)
            return HandoverReading(plan, None)
        self._failing.recovered("handover counts connections again")
        if len(table) < len(plan.keys):  # some could not be read: no answer this time
            return HandoverReading(plan, None)

        return HandoverReading(plan, open_connections(table, scan))

    def apply(self, reading: HandoverReading) -> None:
        if self.phase is not Phase.HANDING_OVER or reading.open is None:
            return
        self.open = reading.open
        self.metrics.handover_open_connections.set(reading.open.total)
        if not due(self.phase, self.asked_at, reading.plan.started, reading.open.total):
            return
        gone, failed = self.engine.release_all()
        if failed:
            log.error(
                "handover: virtual servers could not be deleted, trying again",
                extra=fields(deleted=gone, failed=failed),
            )
            return
        self.phase = Phase.HANDED_OVER
        log.warning(
            "handed over: ipvsctl's virtual servers, addresses and nftables table removed; "
            "idle until restarted",
            extra=fields(
                virtual_servers=gone,
                after=round(self.clock.monotonic() - (self.asked_at or 0.0), 3),
            ),
        )

    # --- the answer (any thread, no lock) ------------------------------------------------
    def state(self) -> HandoverState:
        asked_for = 0.0 if self.asked_at is None else self.clock.monotonic() - self.asked_at
        return HandoverState(self.phase, asked_for, self.open, self.engine.state.n_vs)

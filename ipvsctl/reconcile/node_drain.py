"""Node drain, the running part: since when this node is leaving, and how many connections
are established through its NodePort, load-balancer and external-IP virtual servers (the
rule: `plan/node_drain.py`).

- `on_node` (an engine node listener, on the loop's thread): the Node changed; a node that
  begins leaving is stamped with the event's arrival, one line, and reads go to the drain
  pace at once;
- `on_service` (an engine service listener): keeps the set of those virtual servers, O(the
  Service). A virtual server that leaves the wanted set stays in it while the kernel table
  still holds it (a draining virtual server's connections still come through this node);
- the reading is a background read (`paced.py`) on its own thread, never on the event path:
  one pass over /proc/net/ip_vs (`read_real_servers`, the drain check's table read) for
  those virtual servers, summing their real servers' ActiveConn. While the node drains it
  reads every `interval` (`--drain-check-interval`); otherwise every `idle_interval` (the
  gauge for dashboards); either way at least 9x its own CPU time apart, so a huge table
  is read less often rather than all the time (CPU time, not wall time: on a busy node a
  small table's read that waited for the CPU must not push the next one out by seconds);
- `state()`: the answer, from plain attributes (no lock): `/v1/node-quiesced` and the
  health server's `nodeEligible` read it.

A daemon that restarts while its node drains starts the grace again (the stamp is this
process's): the hook then waits longer, never less.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from ipvsctl.kernel.port import IPVSKernel, KernelError
from ipvsctl.model import DesiredService, ServiceKey, ServiceRef
from ipvsctl.obs.logging import FailureStreaks, fields
from ipvsctl.obs.metrics import Metrics
from ipvsctl.plan.node_drain import (
    NodeDrainState,
    entered_from_outside,
    established,
    node_drain_state,
)
from ipvsctl.reconcile.clock import Clock, paced
from ipvsctl.source.node import NodeInfo, leaving_reasons

log = logging.getLogger("ipvsctl.node_drain")

DUTY = 9.0  # a reading waits at least DUTY x its own duration before the next
IDLE_INTERVAL = 10.0  # seconds between readings while the node is not draining


@dataclass(frozen=True, slots=True)
class NodeReadPlan:
    started: float  # monotonic
    keys: list[ServiceKey]


@dataclass(slots=True)
class NodeReading:
    plan: NodeReadPlan
    established: int | None = None  # None: the table could not be read
    absent: set[ServiceKey] = field(default_factory=set)  # not in the kernel
    ended: float = 0.0
    cpu: float = 0.0  # the reading thread's CPU time for it (seconds)


class NodeDrain:
    def __init__(
        self,
        kernel: IPVSKernel,
        metrics: Metrics,
        clock: Clock,
        *,
        draining_taints: Collection[str],
        lb_grace: float,
        interval: float = 1.0,
        idle_interval: float = IDLE_INTERVAL,
        ready: Callable[[], bool] = lambda: True,
        cpu_clock: Callable[[], float] = time.thread_time,
    ) -> None:
        self.kernel = kernel
        self.cpu_clock = cpu_clock
        self.metrics = metrics
        self.clock = clock
        self.draining_taints = frozenset(draining_taints)
        self.lb_grace = lb_grace
        self.interval = interval
        self.idle_interval = idle_interval
        self.ready = ready  # the first sync is done: the table is ours
        # Virtual servers entered from outside -> how many Services want them (0: none
        # does any more; kept until a reading finds the kernel without it).
        self.keys: dict[ServiceKey, int] = {}
        # Plain attributes, replaced whole: the HTTP threads read them without the lock.
        self.reasons: tuple[str, ...] = ()
        self.since: float | None = None  # monotonic: began draining
        self.established: int | None = None
        self.read_at: float | None = None  # monotonic: the last good reading began
        self._next_read = 0.0
        self._failing = FailureStreaks(log)
        metrics.node_draining.set_function(lambda: 1 if self.reasons else 0)
        metrics.node_draining_seconds.set_function(lambda: self.state().draining_for)

    # --- engine listeners (the loop's thread, under its lock) ----------------------------
    def on_node(self, node: NodeInfo | None, at: float) -> None:
        reasons = leaving_reasons(node, self.draining_taints)
        if reasons == self.reasons:
            return
        was = self.reasons
        if reasons and not was:
            self.since = at
            # read at the drain pace from now, and once right after the grace ends
            self._next_read = min(self._next_read, at)
            log.warning(
                "node draining: health answers 503, load balancers move away",
                extra=fields(reasons=",".join(reasons), lb_grace=self.lb_grace),
            )
        elif not reasons:
            self.since = None
            log.info("node no longer draining: health answers 200", extra=fields(was=",".join(was)))
        else:
            log.info("node still draining", extra=fields(reasons=",".join(reasons)))
        self.reasons = reasons

    def on_service(
        self, ref: ServiceRef, old: DesiredService | None, new: DesiredService | None
    ) -> None:
        before = _outside_keys(old)
        after = _outside_keys(new)
        for key in after - before:
            self.keys[key] = self.keys.get(key, 0) + 1
        for key in before - after:
            n = self.keys.get(key)
            if n:  # to 0: kept while the kernel still holds it (a draining virtual server)
                self.keys[key] = n - 1

    # --- the background read ---------------------------------------------------------------
    def snapshot(self) -> NodeReadPlan | None:
        now = self.clock.monotonic()
        if not self.ready() or now < self._next_read:
            return None
        return NodeReadPlan(now, list(self.keys))

    def read(self, plan: NodeReadPlan) -> NodeReading:
        cpu0 = self.cpu_clock()
        reading = self._read(plan)
        reading.cpu = max(0.0, self.cpu_clock() - cpu0)
        return reading

    def _read(self, plan: NodeReadPlan) -> NodeReading:
        reading = NodeReading(plan)
        if plan.keys:
            try:
                table = self.kernel.read_real_servers(plan.keys)
            except KernelError as exc:
                self.metrics.netlink_errors.labels(exc.operation or "read_real_servers").inc()
                self._failing.failed(
                    logging.WARNING,
                    "ipvs table file unreadable: node drain cannot count connections",
                    error=exc,
                )
                reading.ended = self.clock.monotonic()
                return reading
            self._failing.recovered("ipvs table file readable again")
            if len(table) < len(plan.keys):  # some could not be read: no answer this time
                reading.ended = self.clock.monotonic()
                return reading
            reading.established = sum(established(rs) for rs in table.values() if rs)
            reading.absent = {k for k, rs in table.items() if rs is None}
        else:
            reading.established = 0
        reading.ended = self.clock.monotonic()
        return reading

    def apply(self, reading: NodeReading) -> None:
        started = reading.plan.started
        pace = self.interval if self.reasons else self.idle_interval
        self._next_read = paced(reading.ended - reading.cpu, reading.ended, duty=DUTY, every=pace)
        self._next_read = max(self._next_read, started + pace)
        if self.since is not None and started < self.since + self.lb_grace:
            # the one reading that decides must begin after the grace: not later than that
            self._next_read = min(self._next_read, max(started, self.since + self.lb_grace))
        for key in reading.absent:
            if self.keys.get(key) == 0:
                del self.keys[key]
        if reading.established is None:
            return
        self.established = reading.established
        self.read_at = started
        self.metrics.node_established_connections.set(reading.established)

    # --- the answer (any thread, no lock) ------------------------------------------------
    def state(self) -> NodeDrainState:
        return node_drain_state(
            self.reasons,
            self.since,
            self.clock.monotonic(),
            self.lb_grace,
            self.established,
            self.read_at,
        )


def _outside_keys(desired: DesiredService | None) -> set[ServiceKey]:
    if desired is None:
        return set()
    return {k for k, v in desired.virtual_servers.items() if entered_from_outside(v.kind)}

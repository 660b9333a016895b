"""When to sweep stale UDP/SCTP conntrack entries (plan/conntrack.py says which).

Besides the per-real-server flush (engine), a sweep compares the whole conntrack table of
the swept protocols with the Services: kube-proxy's CleanStaleEntries. It is a background
read (`paced.py`), on its own thread, off the loop's lock except for two short snapshots
(a list of the desired Services, O(Services)), and runs only:
- once the first sync is done (entries a previous daemon, or no daemon, left behind);
- after a Service's UDP/SCTP virtual server got serving endpoints it did not have (its
  clients may be stuck on an entry made meanwhile: kube-proxy's main trigger), as a
  service listener sees it;
- after the node's addresses changed (entries to a new address made before its NodePort
  virtual servers existed);
- every `interval` otherwise (drift repair, as the audit does for IPVS).
Requests coalesce (`wake` ends the runner's wait); sweeps are at least `min_interval` apart
and at least `duty` times the last sweep's duration (the runner's `Pace`, `pace()`), so a
node with a huge table sweeps less often rather than always.

Cost: one dump per (protocol, family) that has a swept frontend, filtered by protocol in
the kernel, and one delete per stale entry.
"""

from __future__ import annotations

import logging
import threading
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from ipvsctl.kernel.port import ConntrackTable, KernelError
from ipvsctl.model import DesiredService, ServiceRef
from ipvsctl.model.conntrack import ConntrackEntry
from ipvsctl.obs.logging import FailureStreaks, fields
from ipvsctl.obs.metrics import Metrics
from ipvsctl.plan.conntrack import newly_served, stale_entries, sweep_table
from ipvsctl.reconcile.clock import Clock, SystemClock
from ipvsctl.reconcile.paced import Pace
from ipvsctl.reconcile.view import EngineView

log = logging.getLogger("ipvsctl.conntrack")

POLL = 1.0  # seconds: the thread looks for the first sync and node address changes


@dataclass(frozen=True, slots=True)
class SweepConfig:
    interval: float = 60.0  # a full sweep at least this often
    min_interval: float = 1.0  # requested sweeps: at most one per this
    duty: float = 9.0  # and at least this many times the last sweep's duration apart


@dataclass(frozen=True, slots=True)
class SweepPlan:
    reason: str
    services: list[DesiredService]  # as they were when the sweep began
    started: float  # monotonic


@dataclass(frozen=True, slots=True)
class SweepResult:
    reason: str
    examined: int
    deleted: int
    seconds: float


@dataclass(frozen=True, slots=True)
class SweepFailure:
    reason: str
    error: KernelError


class ConntrackSweeper:
    def __init__(
        self,
        view: EngineView,
        table: ConntrackTable,
        lock: AbstractContextManager[Any],
        metrics: Metrics,
        *,
        clock: Clock | None = None,
        config: SweepConfig | None = None,
    ) -> None:
        self.view = view
        self.table = table
        self.lock = lock  # for the second look at the Services, after the dumps
        self.metrics = metrics
        self.clock = clock or SystemClock()
        self.config = config or SweepConfig()
        self.wake = threading.Event()
        self._requested: str | None = "start-up"  # why the next sweep is due (None: not)
        self._next_periodic: float | None = None
        self._node_ips: tuple[str, ...] | None = None
        self._failing = FailureStreaks(log)
        self.last: SweepResult | None = None

    def pace(self) -> Pace:
        return Pace(every=0.0, duty=self.config.duty, rest=self.config.min_interval, poll=POLL)

    # --- triggers (under the loop's lock) ------------------------------------------
    def on_service(
        self, ref: ServiceRef, old: DesiredService | None, new: DesiredService | None
    ) -> None:
        """A service listener: O(the Service)."""
        if newly_served(old, new):
            self.request("endpoints")

    def request(self, reason: str) -> None:
        if self._requested is None:
            self._requested = reason
        self.wake.set()

    # --- the background read --------------------------------------------------------
    def snapshot(self) -> SweepPlan | None:
        """Under the lock: why a sweep is due now and the Services to dump for; None when
        none is."""
        if not self.view.started:
            return None
        now = self.clock.monotonic()
        node_ips = self.view.node.node_ips
        if self._node_ips is not None and set(node_ips) != set(self._node_ips):
            self.request("node addresses")
        self._node_ips = node_ips
        reason = self._requested
        if reason is None and self._next_periodic is not None and now >= self._next_periodic:
            reason = "periodic"
        if reason is None:
            return None
        self._requested = None
        return SweepPlan(reason, self.view.desired_services(), now)

    def read(self, plan: SweepPlan) -> SweepResult | SweepFailure:
        """Off the lock: the dumps, then the stale entries' deletion."""
        try:
            entries: list[ConntrackEntry] = []
            for protocol, ipv6 in sweep_table(plan.services).dumps():
                entries += self.table.list_conntrack(protocol, ipv6)
            # Match against the Services as they are after the dump: an endpoint added
            # while dumping must not make its fresh entries look stale.
            with self.lock:
                services = self.view.desired_services()
            stale = stale_entries(entries, sweep_table(services))
            deleted = self.table.delete_conntrack(stale) if stale else 0
        except KernelError as exc:
            return SweepFailure(plan.reason, exc)
        result = SweepResult(
            plan.reason, len(entries), deleted, round(self.clock.monotonic() - plan.started, 3)
        )
        if deleted:
            log.info(
                "stale conntrack entries deleted",
                extra=fields(
                    deleted=deleted,
                    examined=len(entries),
                    reason=plan.reason,
                    elapsed=result.seconds,
                    first=str(stale[0]),
                ),
            )
        else:
            log.debug(
                "conntrack sweep",
                extra=fields(examined=len(entries), reason=plan.reason, elapsed=result.seconds),
            )
        return result

    def apply(self, outcome: SweepResult | SweepFailure) -> SweepResult | None:
        self._next_periodic = self.clock.monotonic() + self.config.interval
        if isinstance(outcome, SweepFailure):
            self.metrics.conntrack_sweeps.labels("error").inc()
            self._failed(outcome.error)
            return None
        self.metrics.conntrack_sweeps.labels("ok").inc()
        if outcome.deleted:
            self.metrics.conntrack_stale_deleted.inc(outcome.deleted)
        self.last = outcome
        self._failing.recovered("conntrack sweep works again")
        return outcome

    def _failed(self, exc: KernelError) -> None:
        self.metrics.netlink_errors.labels(exc.operation or "conntrack_sweep").inc()
        self._failing.failed(
            logging.WARNING,
            "conntrack sweep failed; stale UDP entries are not removed",
            error=exc,
            retry_in=self.config.interval,
        )

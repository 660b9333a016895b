"""When to sweep stale UDP/SCTP conntrack entries (plan/conntrack.py says which).

Besides the per-real-server flush (engine), a sweep compares the whole conntrack table of
the swept protocols with the Services: kube-proxy's CleanStaleEntries. It runs on its own
thread, off the loop's lock except for two short snapshots (a list of the desired
Services, O(Services)), and only:
- once the first sync is done (entries a previous daemon, or no daemon, left behind);
- after a Service's UDP/SCTP virtual server got serving endpoints it did not have (its
  clients may be stuck on an entry made meanwhile: kube-proxy's main trigger), as a
  service listener sees it;
- after the node's addresses changed (entries to a new address made before its NodePort
  virtual servers existed);
- every `interval` otherwise (drift repair, as the audit does for IPVS).
Requests coalesce; sweeps are at least `min_interval` apart and at least `duty` times the
last sweep's duration, so a node with a huge table sweeps less often rather than always.

Cost: one dump per (protocol, family) that has a swept frontend, filtered by protocol in
the kernel, and one delete per stale entry.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from ipvsctl.kernel.port import ConntrackTable, KernelError
from ipvsctl.model import DesiredService, ServiceRef
from ipvsctl.model.conntrack import ConntrackEntry
from ipvsctl.obs.logging import fields
from ipvsctl.obs.metrics import Metrics
from ipvsctl.plan.conntrack import newly_served, stale_entries, sweep_table
from ipvsctl.reconcile.clock import Clock, SystemClock, paced
from ipvsctl.reconcile.engine import Engine

log = logging.getLogger("ipvsctl.conntrack")


@dataclass(frozen=True, slots=True)
class SweepConfig:
    interval: float = 60.0  # a full sweep at least this often
    min_interval: float = 1.0  # requested sweeps: at most one per this
    duty: float = 9.0  # and at least this many times the last sweep's duration apart


@dataclass(frozen=True, slots=True)
class SweepResult:
    reason: str
    examined: int
    deleted: int
    seconds: float


class ConntrackSweeper:
    def __init__(self, engine: Engine, table: ConntrackTable, lock: threading.Lock,
                 metrics: Metrics, *, clock: Clock | None = None,
                 config: SweepConfig | None = None) -> None:
        self.engine = engine
        self.table = table
        self.lock = lock
        self.metrics = metrics
        self.clock = clock or SystemClock()
        self.config = config or SweepConfig()
        self.wake = threading.Event()
        self._requested: str | None = "start-up"  # why the next sweep is due (None: not)
        self._next_periodic: float | None = None
        self._not_before = 0.0
        self._node_ips: tuple[str, ...] | None = None
        self._failing = False
        self.last: SweepResult | None = None

    # --- triggers (under the loop's lock) ------------------------------------------
    def on_service(self, ref: ServiceRef, old: DesiredService | None,
                   new: DesiredService | None) -> None:
        """A service listener: O(the Service)."""
        if newly_served(old, new):
            self.request("endpoints")

    def request(self, reason: str) -> None:
        if self._requested is None:
            self._requested = reason
        self.wake.set()

    # --- the thread -----------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self.wake.clear()
            self.step()
            self.wake.wait(self._timeout())

    def _timeout(self) -> float:
        """How long the thread may wait: at most 1 s (it polls for the first sync and for
        the node addresses, which change without a service event)."""
        now = self.clock.monotonic()
        wake = now + 1.0
        if self._requested is not None and self.engine.started:
            wake = min(wake, max(self._not_before, now))
        elif self._next_periodic is not None:
            wake = min(wake, self._next_periodic)
        return max(0.0, wake - now)

    def step(self) -> SweepResult | None:
        """Sweep if one is due; the result, None when none was (or it failed)."""
        now = self.clock.monotonic()
        with self.lock:
            reason = self._due(now)
            if reason is None:
                return None
            services = list(self.engine.desired.values())
        try:
            result = self._sweep(reason, services, now)
        except KernelError as exc:
            self.metrics.conntrack_sweeps.labels("error").inc()
            self._failed(exc)
            return None
        else:
            self.metrics.conntrack_sweeps.labels("ok").inc()
            return result
        finally:
            end = self.clock.monotonic()
            self._not_before = paced(now, end, duty=self.config.duty,
                                     rest=self.config.min_interval)
            self._next_periodic = end + self.config.interval

    def _due(self, now: float) -> str | None:
        e = self.engine
        if not e.started:
            return None
        node_ips = e.config.node.node_ips
        if self._node_ips is not None and set(node_ips) != set(self._node_ips):
            self.request("node addresses")
        self._node_ips = node_ips
        reason = self._requested
        if reason is None and self._next_periodic is not None and now >= self._next_periodic:
            reason = "periodic"
        if reason is None or now < self._not_before:
            return None
        self._requested = None
        return reason

    def _sweep(self, reason: str, services: list[DesiredService], t0: float) -> SweepResult:
        wanted = sweep_table(services)
        entries: list[ConntrackEntry] = []
        for protocol, ipv6 in wanted.dumps():
            entries += self.table.list_conntrack(protocol, ipv6)
        # Match against the Services as they are after the dump: an endpoint added while
        # dumping must not make its fresh entries look stale.
        with self.lock:
            services = list(self.engine.desired.values())
        stale = stale_entries(entries, sweep_table(services))
        deleted = self.table.delete_conntrack(stale) if stale else 0
        if deleted:
            self.metrics.conntrack_stale_deleted.inc(deleted)
        result = SweepResult(reason, len(entries), deleted,
                             round(self.clock.monotonic() - t0, 3))
        self.last = result
        if self._failing:
            self._failing = False
            log.info("conntrack sweep works again")
        if deleted:
            log.info("stale conntrack entries deleted", extra=fields(
                deleted=deleted, examined=len(entries), reason=reason,
                elapsed=result.seconds, first=str(stale[0])))
        else:
            log.debug("conntrack sweep", extra=fields(
                examined=len(entries), reason=reason, elapsed=result.seconds))
        return result

    def _failed(self, exc: KernelError) -> None:
        self.metrics.netlink_errors.labels(exc.operation or "conntrack_sweep").inc()
        if not self._failing:  # one line per failing streak
            self._failing = True
            log.warning("conntrack sweep failed; stale UDP entries are not removed",
                        extra=fields(error=exc, retry_in=self.config.interval))

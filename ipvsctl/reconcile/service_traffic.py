"""Per-Service traffic metrics (`--service-metrics`): the kernel's IPVS counters, summed per
Service port, read at scrape time (CONTRACT.md "Metrics").

Nothing here runs on the event path but `on_service`, a service listener that keeps which
Services are opted in: O(1) per changed Service, no allocation beyond the dict slot (it
keeps the engine's own DesiredService), under its own small lock, never the loop's. A
scrape (`read`, from the metrics collector on an HTTP worker) copies that index under the
small lock (one C-level copy, microseconds at thousands of Services), then, holding no lock
the loop waits on: the cap (plan/traffic.py), one service dump with the counters (no
per-Service call), the sums. Scrapes are serialized by a lock of their own (the sums carry
state from one scrape to the next).

Counters stay monotonic per series (plan/traffic.py's MonotonicSums), so a virtual server
deleted and re-created, or one of a Service's addresses going away, never shows as a drop;
a daemon restart does (its offsets are in memory), which Prometheus's `rate()` and
`increase()` read as a counter reset, as for any restarted process.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from enum import StrEnum

from ipvsctl.kernel.port import KernelError, ServiceStatsReader
from ipvsctl.model import DesiredService, ServiceRef, ServiceStats
from ipvsctl.obs.logging import FailureStreaks
from ipvsctl.plan.traffic import Labels, MonotonicSums, admit, group

log = logging.getLogger("ipvsctl.metrics")

DEFAULT_MAX_SERIES = 10000


class ServiceMetricsMode(StrEnum):
    """--service-metrics: which Services get per-Service traffic series."""

    NONE = "none"
    ANNOTATED = "annotated"  # those with ipvsctl.io/metrics: "true"
    ALL = "all"


class ServiceTraffic:
    def __init__(
        self,
        kernel: ServiceStatsReader,
        mode: ServiceMetricsMode,
        max_series: int = DEFAULT_MAX_SERIES,
        on_error: Callable[[KernelError], None] = lambda exc: None,
    ) -> None:
        if max_series < 0:
            raise ValueError(f"--service-metrics-max-series must be >= 0, not {max_series}")
        self.kernel = kernel
        self.mode = mode
        self.max_series = max_series
        self.on_error = on_error
        self._opted: dict[ServiceRef, DesiredService] = {}
        self._index_lock = threading.Lock()
        self._read_lock = threading.Lock()
        self._sums = MonotonicSums()
        self._failures = FailureStreaks(log)
        self.reads = 0  # kernel reads made (tests, the benchmark)

    def wants(self, desired: DesiredService | None) -> bool:
        if desired is None or not desired.virtual_servers:
            return False
        if self.mode is ServiceMetricsMode.ALL:
            return True
        return self.mode is ServiceMetricsMode.ANNOTATED and desired.traffic_metrics

    def on_service(
        self, ref: ServiceRef, old: DesiredService | None, new: DesiredService | None
    ) -> None:
        """A service listener (the engine's change feed), under the loop's lock: O(1)."""
        wanted = self.wants(new)
        with self._index_lock:
            if wanted:
                assert new is not None
                self._opted[ref] = new
            else:
                self._opted.pop(ref, None)

    def read(self) -> tuple[list[tuple[Labels, ServiceStats]], int]:
        """The series (label set, summed counters) and how many Services the cap left out.
        A failed kernel read gives no series this time (a gap, not a wrong value), one log
        line per streak of failures and a count in ipvsctl_netlink_errors_total."""
        with self._read_lock:
            with self._index_lock:
                opted = list(self._opted.values())
            labels, dropped = admit(opted, self.max_series)
            if not labels:
                self._sums.update({})
                return [], dropped
            try:
                counters = self.kernel.read_service_stats()
            except KernelError as exc:
                self.on_error(exc)
                self._failures.failed(
                    logging.WARNING, "per-Service traffic counters unreadable", error=exc
                )
                return [], dropped
            self.reads += 1
            self._failures.recovered("per-Service traffic counters readable again")
            sums = self._sums.update(group(labels, counters))
            return sorted(sums.items()), dropped

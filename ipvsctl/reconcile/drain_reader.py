"""The drain check's kernel reads, done without the loop's lock.

A check is three steps (`drain_check.py`): a snapshot of the queue (under the lock, one
shallow copy), the reads (here, no lock: the draining real servers' counts, by one read of
/proc/net/ip_vs or one netlink dump per draining virtual server, whichever is measured cheaper
(dumps first: the table is tried only once dumps would take a second and a quarter of the
node's virtual servers drain), and at most one
streamed pass over /proc/net/ip_vs_conn for the TCP
ones whose connections are all inactive), then the check applies the reading under the lock,
only to entries that are still the very ones snapshotted (`DrainCheck.apply`): a count read
before an endpoint came back never deletes it.

The connection table walks every connection of the node: its pass is paced so that it takes
at most ~10% of the time (an interval of at least 9x its last duration), so a node with
a million connections checks less often rather than spending every check reading.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

from ipvsctl.kernel.port import IPVSKernel, KernelError, KernelUnavailable
from ipvsctl.model import (
    ConnCounts,
    ConnScan,
    DrainEntry,
    RealServerKey,
    RealServerStatus,
    ServiceKey,
)
from ipvsctl.model.keys import service_order
from ipvsctl.obs.logging import FailureStreaks, fields
from ipvsctl.obs.metrics import Metrics
from ipvsctl.plan.drain import wants_conn_states
from ipvsctl.reconcile.clock import Clock, paced

log = logging.getLogger("ipvsctl.drain")

DUTY = 9.0  # the conn-table pass waits at least DUTY x its last duration before the next
PROBE_DUMPS = 8  # virtual servers read by dumps to measure a dump's cost
DUMP_BATCH = 16  # virtual servers per batch of dumps; the loop may go first between batches
RETRY_TABLE = 60  # checks by dumps before the table read is measured again,
RETRY_SHARE = 2.0  # if the dumps cost at least 1/RETRY_SHARE of its last measure
# The table is first read (and its cost learnt) only once the dumps are estimated to take
# this long: below it a check is quick either way, and beside a big table the one read
# that learns its cost is slow (44,000 Services under emulation: 20-54 s, against 0.5-2.4 s
# of dumps for 1,000 draining), delaying every drain that ends meanwhile.
TABLE_WORTH_TRYING = 1.0  # seconds
# ... and only while at least 1/TABLE_SHARE of the node's virtual servers drain: reading
# the table was measured at about as much as dumping a quarter of them (6-40% at 10,000
# Services under emulation, 20-200% at 44,000: its cost grows with the square of the table).
TABLE_SHARE = 4


def _ewma(old: float | None, new: float) -> float:
    return new if old is None else 0.7 * old + 0.3 * new


@dataclass(frozen=True, slots=True)
class DrainSnapshot:
    """The queue's entries per virtual server, as they were when the check began."""

    entries: dict[ServiceKey, Mapping[RealServerKey, DrainEntry]]  # never changed in place


@dataclass(slots=True)
class DrainReading:
    snapshot: DrainSnapshot
    # Per virtual server: its real servers, None when it is gone; absent when not read.
    observed: dict[ServiceKey, list[RealServerStatus] | None] = field(default_factory=dict)
    # Connection states of the TCP real servers that needed them; absent: not read.
    conns: dict[tuple[ServiceKey, RealServerKey], ConnCounts] = field(default_factory=dict)


class DrainReader:
    """Reads for drain checks. Used by one thread at a time (the drain check's runner)."""

    def __init__(
        self,
        kernel: IPVSKernel,
        metrics: Metrics,
        clock: Clock,
        give_way: Callable[[], None] = lambda: None,
        virtual_servers: Callable[[], int] = lambda: 0,
    ) -> None:
        self.kernel = kernel
        # How many virtual servers the node's table holds (the applied state's count; 0:
        # unknown): a table read's cost, before it is measured, is estimated from it.
        self.virtual_servers = virtual_servers
        self.give_way = give_way  # between batches of dumps and while judging: events first
        self.metrics = metrics
        self.clock = clock
        self._next_conn_scan = 0.0
        # Measured costs (seconds): one table read, one dump; None until first measured.
        self._table_cost: float | None = None
        self._dump_cost: float | None = None
        self._dump_checks = 0  # checks by dumps since the table's last measure
        self._table_checks = 0  # checks by the table since a dump's last measure
        self._dumps_opened = False
        # The table read is not tried again for a while after a failure (dumps instead): its
        # streak is logged once for good.
        self._table_failing = FailureStreaks(log)
        self._conns_failing = FailureStreaks(log)
        self.last_scan: ConnScan | None = None  # the last one's work counters (tests read them)

    def read(self, snapshot: DrainSnapshot) -> DrainReading:
        reading = DrainReading(snapshot)
        keys = sorted(snapshot.entries, key=service_order)
        if not keys:
            return reading
        reading.observed = self._read_counts(keys, snapshot.entries)
        wanted = [
            (key, s.key)
            for key in keys
            for s in reading.observed.get(key) or ()
            if (e := snapshot.entries[key].get(s.key)) is not None and wants_conn_states(e, s)
        ]
        if wanted:
            reading.conns = self._read_conns(wanted)
        return reading

    def _read_counts(
        self, keys: list[ServiceKey], only: Mapping[ServiceKey, Collection[RealServerKey]]
    ) -> dict[ServiceKey, list[RealServerStatus] | None]:
        """The cheaper of one table read (its cost grows with the whole table) and one
        netlink dump per draining virtual server (grows with the drains), by the costs
        measured here so far (`read_choice`); dumps also when the table file cannot be read
        (the counts are what the drain rule needs, so they must come from somewhere). Only
        the draining real servers are read either way: the rule needs no others (at 1,000
        draining of 10,000 virtual servers, parsing the other 9,000 was most of a read)."""
        observed: dict[ServiceKey, list[RealServerStatus] | None] = {}
        choice = self.read_choice(len(keys))
        if choice == "table":
            self._table_checks += 1
        else:
            self._dump_checks += 1
        # a dump's cost not known (or not lately): measured on the first few; at most twice,
        # as the first dumps of this thread also open its netlink socket (not measured)
        for _ in range(2):
            if choice != "probe" or len(keys) <= PROBE_DUMPS:
                break
            observed.update(self._dumps(keys[:PROBE_DUMPS], only, probe=True))
            keys = keys[PROBE_DUMPS:]
            choice = self.read_choice(len(keys))
        if choice == "table":
            table = self._table(keys, only)
            if table is not None:
                observed.update(table)
                return observed
        observed.update(self._dumps(keys, only))
        return observed

    def _table(
        self, keys: list[ServiceKey], only: Mapping[ServiceKey, Collection[RealServerKey]]
    ) -> dict[ServiceKey, list[RealServerStatus] | None] | None:
        t0 = self.clock.thread_time()
        try:
            observed = self.kernel.read_real_servers(keys, only)
        except KernelError as exc:
            self.metrics.netlink_errors.labels(exc.operation or "read_real_servers").inc()
            self._table_cost = float("inf")  # dumps from now on
            self._table_failing.failed(
                logging.WARNING,
                "ipvs table file unreadable, reading per virtual server",
                error=exc,
            )
            return None
        self._table_cost = _ewma(self._table_cost, self.clock.thread_time() - t0)
        return observed

    def _dumps(
        self,
        keys: list[ServiceKey],
        only: Mapping[ServiceKey, Collection[RealServerKey]],
        probe: bool = False,
    ) -> dict[ServiceKey, list[RealServerStatus] | None]:
        if not keys:
            return {}
        observed: dict[ServiceKey, list[RealServerStatus] | None] = {}
        t0 = self.clock.thread_time()
        waited = 0.0  # in give_way: the loop's time, not the dumps'
        for start in range(0, len(keys), DUMP_BATCH):
            w0 = self.clock.thread_time()
            self.give_way()  # between batches: a waiting change goes first
            waited += self.clock.thread_time() - w0
            try:
                found = self.kernel.dump_real_servers(keys[start : start + DUMP_BATCH], only)
            except KernelError as exc:  # no reading at all (the socket): asked again next check
                self.metrics.netlink_errors.labels(exc.operation or "list_real_servers").inc()
                return observed
            for key, got in found.items():
                if isinstance(got, KernelError):  # left out: read again at the next check
                    self.metrics.netlink_errors.labels(got.operation or "list_real_servers").inc()
                else:
                    observed[key] = got
        if self._dumps_opened:
            # Without the waits: a probe's 8 dumps are one batch, and a wait of up to 50 ms
            # for a busy loop counted in is ~6 ms a dump, enough to make 1,000 dumps look
            # dearer than a table read of a few seconds (a big table under emulation).
            cost = (self.clock.thread_time() - t0 - waited) / len(keys)
            # a probe replaces a measure taken long ago (or none); checks by dumps average
            self._dump_cost = cost if probe else _ewma(self._dump_cost, cost)
        else:  # the first on this thread opened its socket (in the namespace: seconds under
            self._dumps_opened = True  # emulation): no measure of a dump
        return observed

    def read_choice(self, n: int) -> str:
        """ "table", "dumps" or "probe" (dumps for the first few to learn their cost, then
        the cheaper for the rest) for n draining virtual servers. Dumps first, their cost
        learnt on the first few; the table is read (and its cost learnt) only when the
        dumps are estimated at `TABLE_WORTH_TRYING` or more and at least a `TABLE_SHARE`th
        of the node's virtual servers drain; then whichever is estimated cheaper. Dumps
        are probed again every 60 checks by the table. The table is re-tried every 60
        checks by dumps, as its cost changes with the node's table, but only while it
        could plausibly win (the dumps cost at least half its last measure): at 10,000
        Services under emulation one table read costs ~2 s against ~0.5 s of dumps, and a
        needless re-read delays every drain that ends during it."""
        if self._table_cost is None:
            if self._dump_cost is None:
                return "dumps" if n <= PROBE_DUMPS else "probe"
            worth = n * self._dump_cost >= TABLE_WORTH_TRYING
            share = n * TABLE_SHARE >= self.virtual_servers()
            return "table" if worth and share else "dumps"
        if self._dump_cost is None:
            return "dumps" if n <= PROBE_DUMPS or self._table_cost == float("inf") else "probe"
        dumps = n * self._dump_cost
        if self._dump_checks >= RETRY_TABLE and dumps * RETRY_SHARE >= self._table_cost:
            self._dump_checks = 0
            return "table"
        if dumps < self._table_cost:
            return "dumps"
        if self._table_checks >= RETRY_TABLE and n > PROBE_DUMPS:
            self._table_checks = 0
            return "probe"
        return "table"

    def _read_conns(
        self, wanted: list[tuple[ServiceKey, RealServerKey]]
    ) -> dict[tuple[ServiceKey, RealServerKey], ConnCounts]:
        now = self.clock.monotonic()
        if now < self._next_conn_scan:
            self.metrics.conn_table_reads.labels("deferred").inc()
            return {}
        try:
            scan = self.kernel.read_connections(wanted)
        except KernelError as exc:
            # Without states the counts rule holds them (never an early delete).
            result = "unavailable" if isinstance(exc, KernelUnavailable) else "error"
            self.metrics.conn_table_reads.labels(result).inc()
            self._next_conn_scan = self.clock.monotonic() + 10.0
            self._conns_failing.failed(
                logging.WARNING,
                "ipvs connection table unreadable, draining by counts only",
                error=exc,
            )
            return {}
        self._next_conn_scan = paced(now, self.clock.monotonic(), duty=DUTY)
        self.last_scan = scan
        self.metrics.conn_table_reads.labels("ok").inc()
        self.metrics.conn_table_lines.inc(scan.lines)
        self._conns_failing.recovered("ipvs connection table readable again")
        if not scan.trustworthy:
            log.debug("connection table lines unreadable", extra=fields(lines=scan.unattributed))
            return {}
        return scan.counts

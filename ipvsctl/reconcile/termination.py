"""Terminating real servers: the drain queue and what the drain checks last saw of it.

A drain check is observations in, actions out: `snapshot()` (under the loop's lock) says
what to read, the reader (`drain_reader.py`, off the lock) reads the kernel, and `judge()`
(under the lock again) turns the reading into ops through the pure rule (`plan/drain.py`),
for entries that are still the very ones snapshotted. The ops are applied by the caller
like any other; their application removes entries here (`remove`).
"""

from __future__ import annotations

from ipvsctl.model import ConnCounts, DrainEntry, DrainQueue, RealServerKey, ServiceKey
from ipvsctl.model.keys import by_service
from ipvsctl.plan.drain import check_drains
from ipvsctl.plan.ops import Op
from ipvsctl.reconcile.drain_reader import DrainReading, DrainSnapshot

RsKey = tuple[ServiceKey, RealServerKey]


class Terminations:
    def __init__(self) -> None:
        self.queue = DrainQueue()
        # Connection counts of draining real servers as the last drain check read them.
        self._counts: dict[RsKey, tuple[int, int]] = {}
        # Their connections by state, when the connection table was read for them.
        self._conns: dict[RsKey, ConnCounts] = {}

    def __len__(self) -> int:
        return len(self.queue)

    def add(self, entry: DrainEntry) -> None:
        self.queue.add(entry)

    def remove(self, vs: ServiceKey, rs: RealServerKey) -> DrainEntry | None:
        """The real server is back, deleted or gone: out of the queue, its counts forgotten."""
        self._counts.pop((vs, rs), None)
        self._conns.pop((vs, rs), None)
        return self.queue.remove(vs, rs)

    def remove_vs(self, key: ServiceKey) -> None:
        for entry in self.queue.remove_vs(key):
            self._counts.pop(entry.key, None)
            self._conns.pop(entry.key, None)

    def counts(self, vs: ServiceKey, rs: RealServerKey) -> tuple[int, int] | None:
        """(active, inactive) as the last drain check read them; None: not read."""
        return self._counts.get((vs, rs))

    def conns(self, vs: ServiceKey, rs: RealServerKey) -> ConnCounts | None:
        return self._conns.get((vs, rs))

    def next_deadline(self) -> float | None:
        """The earliest deadline in the queue (wall clock), for the loop's timer."""
        return min((e.deadline for e in self.queue.entries()), default=None)

    def snapshot(self) -> DrainSnapshot:
        """The queue as it is now, O(queue), unsorted (the reader sorts, off the lock)."""
        return DrainSnapshot({key: dict(d) for key, d in self.queue.per_vs()})

    def judge(self, reading: DrainReading, now: float) -> list[tuple[ServiceKey, list[Op]]]:
        """The deletions (and forgettings) the reading calls for, per virtual server. Only
        entries still queued as the very same entry are judged: an endpoint that came back,
        or drained anew, since the snapshot is left alone."""
        out: list[tuple[ServiceKey, list[Op]]] = []
        for key, snapped in sorted(reading.snapshot.entries.items(), key=by_service):
            if key not in reading.observed:
                continue  # not read this time
            queued = self.queue.for_vs(key)
            current = {rs: e for rs, e in snapped.items() if queued.get(rs) is e}
            if not current:
                continue
            observed = reading.observed[key]
            conns = {rs: c for rs in current
                     if (c := reading.conns.get((key, rs))) is not None}
            for status in observed or ():
                if status.key in current:
                    k = (key, status.key)
                    self._counts[k] = (status.active_conns, status.inactive_conns)
                    if status.key in conns:
                        self._conns[k] = conns[status.key]
                    else:
                        self._conns.pop(k, None)
            ops = check_drains(current, observed, now, conns)
            if ops:
                out.append((key, ops))
        return out

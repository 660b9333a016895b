"""Terminating real servers: the drain queue and what the drain checks last saw of it.

A drain check is observations in, actions out, with the loop's lock held only at the ends:
`snapshot()` (under the lock, one shallow copy of the queue's map) says what to read; the reader
(`drain_reader.py`) reads the kernel and `judge()` turns the reading into ops through the
pure rule (`plan/drain.py`), both off the lock; `accept()` (under the lock again) keeps the
ops whose entries are still the very ones snapshotted, O(the ops), so a check of 1,000
draining real servers holds up no event. The ops are applied by the caller like any other;
their application removes entries here (`remove`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from ipvsctl.model import (
    ConnCounts,
    DrainEntry,
    DrainQueue,
    RealServerKey,
    ServiceKey,
    ServiceRef,
)
from ipvsctl.model.keys import by_service
from ipvsctl.plan.drain import check_drains
from ipvsctl.plan.ops import DeleteRealServer, DeletionReason, ForgetDrain, Op
from ipvsctl.reconcile.drain_reader import DrainReading, DrainSnapshot

RsKey = tuple[ServiceKey, RealServerKey]
DrainOp = DeleteRealServer | ForgetDrain  # what plan/drain.py's check gives
VS_PER_GIVE_WAY = 16  # virtual servers judged between two give-way points (events_first.py)


@dataclass(frozen=True, slots=True)
class Seen:
    """What a drain check read of one queued entry: its counts and, when the connection
    table was read for it, its connections by state. Valid only while `entry` is the one
    queued (an endpoint that came back and drained anew is a new entry)."""

    entry: DrainEntry
    active: int
    inactive: int
    conns: ConnCounts | None


@dataclass(frozen=True, slots=True)
class DrainVerdict:
    """A judged reading: the ops it calls for, each with the entry it was judged on, and
    what was seen of every entry (replaces the previous record whole when accepted)."""

    ops: list[tuple[ServiceKey, list[tuple[DrainEntry, Op]]]]
    seen: dict[RsKey, Seen]
    now: float = 0.0  # when it was judged (wall)


class Terminations:
    def __init__(self) -> None:
        self.queue = DrainQueue()
        # What the last accepted drain check read. Replaced whole, never changed in place:
        # the reader thread reads it off the lock while judging.
        self._seen: dict[RsKey, Seen] = {}
        # Virtual servers that left the wanted set and drain (CONTRACT.md "Draining"): the
        # Service each was of. Each goes with its last real server; a Service that claims
        # its key meanwhile takes it over (`take_over`). Rebuilt at start-up from the
        # queue's entries (`DrainEntry.vs_draining`), which is what the state file keeps.
        self.draining_virtual_servers: dict[ServiceKey, ServiceRef] = {}
        # No `pod_gone` deletion before this wall time (plan/drain.py `deadline_passed`):
        # infinite while the EndpointSlices are not watched, and a grace after their watch
        # is open again (`slices_watched`). Written by the source's thread, read by the
        # drain check's and the loop's: one float, replaced whole.
        self.pod_gone_after = -math.inf

    def slices_watched(self, watching: bool, now: float, grace: float) -> None:
        """The EndpointSlice watch opened (`watching`) or broke at `now`. While it is not
        open, an endpoint that left every slice may be on its way back in an event not yet
        delivered (a slice re-pack's second half): its grace counts from when the watch is
        open again (and whatever it missed delivered at once: a resumed watch replays it, a
        relist's Replace holds it)."""
        self.pod_gone_after = now + grace if watching else math.inf

    def __len__(self) -> int:
        return len(self.queue)

    def add(self, entry: DrainEntry) -> None:
        self.queue.add(entry)
        self._note_vs(entry)

    def drain_virtual_server(self, key: ServiceKey, service: ServiceRef) -> None:
        self.draining_virtual_servers[key] = service

    def take_over(self, key: ServiceKey) -> ServiceRef | None:
        """A Service claims a draining virtual server: it is live again, its real servers
        drain on as any others (their bounds kept). Returns the Service it was of."""
        service = self.draining_virtual_servers.pop(key, None)
        for entry in list(self.queue.for_vs(key).values()):
            if entry.vs_draining:
                self.queue.replace(replace(entry, vs_draining=False))
        return service

    def _note_vs(self, entry: DrainEntry) -> None:
        if entry.vs_draining and entry.service is not None:
            self.draining_virtual_servers.setdefault(entry.vs, entry.service)

    def remove(self, vs: ServiceKey, rs: RealServerKey) -> DrainEntry | None:
        """The real server is back, deleted or gone: out of the queue (what was seen of it
        no longer counts: `Seen` holds the entry it was read for)."""
        entry = self.queue.remove(vs, rs)
        self._forget_if_empty()
        return entry

    def replace(self, entry: DrainEntry) -> bool:
        """A queued entry takes a new bound (what was seen of the old one no longer
        counts, as for any new entry)."""
        if not self.queue.replace(entry):
            return False
        self._note_vs(entry)
        return True

    def remove_vs(self, key: ServiceKey) -> None:
        """The virtual server is gone: its entries, and its drain if it drained."""
        self.queue.remove_vs(key)
        self.draining_virtual_servers.pop(key, None)
        self._forget_if_empty()

    def _forget_if_empty(self) -> None:
        if not len(self.queue):  # no check will replace the record: let it go now
            self._seen = {}

    def _seen_now(self, vs: ServiceKey, rs: RealServerKey) -> Seen | None:
        seen = self._seen.get((vs, rs))
        return seen if seen is not None and self.queue.get(vs, rs) is seen.entry else None

    def counts(self, vs: ServiceKey, rs: RealServerKey) -> tuple[int, int] | None:
        """(active, inactive) as the last drain check read them; None: not read."""
        seen = self._seen_now(vs, rs)
        return (seen.active, seen.inactive) if seen else None

    def conns(self, vs: ServiceKey, rs: RealServerKey) -> ConnCounts | None:
        seen = self._seen_now(vs, rs)
        return seen.conns if seen else None

    def snapshot(self) -> DrainSnapshot:
        """The queue as it is now, unsorted (the reader sorts, off the lock): one shallow
        copy of its map (`DrainQueue.snapshot`)."""
        return DrainSnapshot(self.queue.snapshot())

    def judge(
        self, reading: DrainReading, now: float, give_way: Callable[[], None] = lambda: None
    ) -> DrainVerdict:
        """Off the lock: the deletions (and forgettings) the reading calls for, per virtual
        server, judged on the snapshot's entries; touches no state of this object.
        `give_way` is called every few virtual servers (the loop's events first)."""
        previous = self._seen  # replaced whole by accept(), never changed: safe to read
        pod_gone_after = self.pod_gone_after
        seen: dict[RsKey, Seen] = {}
        out: list[tuple[ServiceKey, list[tuple[DrainEntry, Op]]]] = []
        entries = sorted(reading.snapshot.entries.items(), key=by_service)
        for n, (key, snapped) in enumerate(entries):
            if not n % VS_PER_GIVE_WAY:
                give_way()
            if key not in reading.observed:  # not read this time: what was seen stays
                for rs, entry in snapped.items():
                    old = previous.get((key, rs))
                    if old is not None and old.entry is entry:
                        seen[key, rs] = old
                continue
            observed = reading.observed[key]
            for status in observed or ():
                queued = snapped.get(status.key)
                if queued is not None:
                    seen[key, status.key] = Seen(
                        queued,
                        status.active_conns,
                        status.inactive_conns,
                        reading.conns.get((key, status.key)),
                    )
            conns = {rs: c for rs in snapped if (c := reading.conns.get((key, rs))) is not None}
            ops: list[DrainOp] = check_drains(snapped, observed, now, conns, pod_gone_after)
            if ops:
                out.append((key, [(snapped[op.rs], op) for op in ops]))
        return DrainVerdict(out, seen, now)

    def accept(self, verdict: DrainVerdict) -> list[tuple[ServiceKey, list[Op]]]:
        """Under the lock: the verdict's ops whose entries are still queued as the very same
        entries (an endpoint that came back, or drained anew, since the snapshot is left
        alone), and what was seen becomes the record. O(the ops). A `pod_gone` deletion
        judged before the EndpointSlice watch broke (or came back: its grace restarted)
        is left for a later check."""
        self._seen = verdict.seen
        held = verdict.now < self.pod_gone_after
        out: list[tuple[ServiceKey, list[Op]]] = []
        for key, judged in verdict.ops:
            queued = self.queue.for_vs(key)
            ops = [
                op
                for entry, op in judged
                if queued.get(entry.rs) is entry and not (held and _pod_gone(op))
            ]
            if ops:
                out.append((key, ops))
        return out


def _pod_gone(op: Op) -> bool:
    return isinstance(op, DeleteRealServer) and op.reason is DeletionReason.POD_GONE

"""The drain queue: entries indexed by (VS, RS) and by VS, so every lookup the
engine makes costs O(the entries involved), never O(queue).

A virtual server's map of entries is never changed in place: a change replaces it with a
new one (copy-on-write; a virtual server has a few entries). So `snapshot()` is one
shallow copy of the outer map, and the drain reader may walk it off the loop's lock while
the loop changes the queue: 1,000 inner copies under the lock were a drain check's cost to
every event waiting for it."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from ipvsctl.model.drain import DrainEntry
from ipvsctl.model.keys import RealServerKey, ServiceKey, service_order


def _rs_order(rs: RealServerKey) -> tuple[str, int]:
    return (rs.address, rs.port)


class DrainQueue:
    def __init__(self, entries: list[DrainEntry] | None = None) -> None:
        self._by_vs: dict[ServiceKey, dict[RealServerKey, DrainEntry]] = {}
        self.version = 0  # bumped on every change: tells the state file it must be written
        self.added = 0  # bumped on every add: a new drain is written at once, not coalesced
        self._count = 0
        # Whole-queue copies made (a sorted iteration or `entries()`): what a loop step must
        # not do per change (the cost tests read it).
        self.copies = 0
        for e in entries or ():
            self.add(e)

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[DrainEntry]:
        self.copies += 1
        for vs in sorted(self._by_vs, key=service_order):
            d = self._by_vs[vs]
            for rs in sorted(d, key=_rs_order):
                yield d[rs]

    def entries(self) -> list[DrainEntry]:
        """Every entry, in no particular order: a copy without the sort of `__iter__` (the
        state file needs no order)."""
        self.copies += 1
        return [e for d in self._by_vs.values() for e in d.values()]

    def __contains__(self, key: tuple[ServiceKey, RealServerKey]) -> bool:
        return key[1] in self._by_vs.get(key[0], {})

    def get(self, vs: ServiceKey, rs: RealServerKey) -> DrainEntry | None:
        return self._by_vs.get(vs, {}).get(rs)

    def for_vs(self, vs: ServiceKey) -> Mapping[RealServerKey, DrainEntry]:
        return self._by_vs.get(vs, {})

    def virtual_servers(self) -> list[ServiceKey]:
        return sorted(self._by_vs, key=service_order)

    def snapshot(self) -> dict[ServiceKey, Mapping[RealServerKey, DrainEntry]]:
        """Every virtual server's entries as they are now, safe to read off the lock (the
        inner maps are replaced on change, never changed): one shallow copy."""
        return dict(self._by_vs)

    def add(self, entry: DrainEntry) -> None:
        self.remove(entry.vs, entry.rs)
        d = dict(self._by_vs.get(entry.vs, ()))
        d[entry.rs] = entry
        self._by_vs[entry.vs] = d
        self._count += 1
        self.version += 1
        self.added += 1

    def remove(self, vs: ServiceKey, rs: RealServerKey) -> DrainEntry | None:
        old = self._by_vs.get(vs)
        if old is None or rs not in old:
            return None
        entry = old[rs]
        if len(old) == 1:
            del self._by_vs[vs]
        else:
            self._by_vs[vs] = {k: e for k, e in old.items() if k != rs}
        self._forget(entry)
        return entry

    def remove_vs(self, vs: ServiceKey) -> list[DrainEntry]:
        """All of a virtual server's entries, its map dropped whole (not copied once per
        entry removed)."""
        entries = list(self._by_vs.pop(vs, {}).values())
        for entry in entries:
            self._forget(entry)
        return entries

    def _forget(self, entry: DrainEntry) -> None:
        """The count and the version, for an entry just taken out."""
        self._count -= 1
        self.version += 1

    def replace(self, entry: DrainEntry) -> bool:
        """A queued entry's bound changed (`RetimeDrain`): it takes the new one in place;
        `since` stays, it is not a new drain (no immediate state write). False when the
        entry is no longer queued."""
        old = self._by_vs.get(entry.vs)
        if old is None or entry.rs not in old:
            return False
        self._by_vs[entry.vs] = {**old, entry.rs: entry}
        self.version += 1
        return True

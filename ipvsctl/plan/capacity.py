"""How much of the node's IPVS table the Services may have (CONTRACT.md "Node safety"). Pure.

`--max-virtual-servers-per-service` bounds one Service; nothing bounded many: 40 Services
of 1,024 ports x 20 pods each were 819,200 real servers and a 15 s sync under the loop
lock, and twice as many would be twice that. The node's table has a size, in entries: a
Service takes one per virtual server and one per real server of each (what the kernel
holds for it, what the daemon keeps per entry, what a sync writes). The rule:

1. Services take their places oldest first (`metadata.creationTimestamp`, then
   namespace/name, as plan/conflicts.py ranks them; a Service without a creation time
   after every Service with one);
2. each Service that fits in what the older admitted ones leave of `--max-table-entries`
   is admitted whole; one that does not is refused whole, and the newer ones are still
   tried (one huge Service does not shut the small ones after it out).

A new Service is the newest, so it can only take what is free: a tenant's new Services
never displace the cluster's established ones, and a refused one takes nothing (not even
the keys it would win by the conflict rule: the engine lets it claim none). The admitted
set is a function of the Services' ranks and sizes alone, whatever order they arrive in,
so a restart admits what the running daemon did. What the rule cannot tell apart: an old
Service that grows (scaled up) is still old, and past the limit it is the newest Services
that give way.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Mapping
from dataclasses import dataclass, field

from ipvsctl.model import DesiredService, ServiceRef

# (creation time or +inf, namespace, name): lower is older, admitted first
Rank = tuple[float, str, str]


def rank(created: float | None, ref: ServiceRef) -> Rank:
    return (math.inf if created is None else created, ref.namespace, ref.name)


def entries(desired: DesiredService) -> int:
    """The table entries the Service asks for: its virtual servers and their real
    servers (claims it may lose to another Service included: the count is the Service's
    own, whatever the others do). O(its virtual servers)."""
    return sum(1 + len(dvs.real_servers) for dvs in desired.virtual_servers.values())


def admit(sizes: Mapping[ServiceRef, tuple[Rank, int]], limit: int) -> frozenset[ServiceRef]:
    """The Services refused, for a whole set at once (`ipvsctl plan`, the tests' yardstick)."""
    used = 0
    refused: set[ServiceRef] = set()
    for _, size, ref in sorted((r, size, ref) for ref, (r, size) in sizes.items()):
        if used + size <= limit:
            used += size
        else:
            refused.add(ref)
    return frozenset(refused)


def refusal(limit: int) -> str:
    """Why a Service is refused: fixed per limit, so the daemon logs it once, not at every
    change of the Service's size."""
    return (
        f"does not fit in what older Services leave of the node's IPVS table "
        f"(--max-table-entries {limit}): refused whole"
    )


@dataclass(slots=True)
class Capacity:
    """The rule kept incrementally across changes. The Services in rank order split in
    two: the longest run of oldest ones that fit together (the prefix: all admitted), and
    the rest, walked one by one. A change moves the prefix's end by the Services it
    crosses and re-walks the rest: O(what the change moves + the Services past the
    prefix). While everything fits there is no rest; when a tenant's new Services overflow
    the table, the rest is theirs and whatever is newer. Never a rebuild: what an update
    returns is the other Services whose admission changed, and only those need one."""

    limit: int
    # parallel, in rank order: only Services that ask for entries
    _ranks: list[Rank] = field(default_factory=list)
    _refs: list[ServiceRef] = field(default_factory=list)
    _sizes: list[int] = field(default_factory=list)
    _rank_of: dict[ServiceRef, Rank] = field(default_factory=dict)
    _first: int = 0  # the prefix: _sizes[:_first], whose sum is _prefix <= limit
    _prefix: int = 0
    used: int = 0  # held by the admitted ones
    refused: frozenset[ServiceRef] = frozenset()

    def size(self, ref: ServiceRef) -> int:
        r = self._rank_of.get(ref)
        return 0 if r is None else self._sizes[bisect_left(self._ranks, r)]

    def refuses(self, ref: ServiceRef) -> bool:
        return ref in self.refused

    def update(
        self, ref: ServiceRef, r: Rank | None, size: int, *, settle: bool = True
    ) -> set[ServiceRef]:
        """The Service now asks for `size` entries at rank `r` (None or 0: nothing, it is
        gone). Returns the other Services now admitted or refused that were not before.
        `settle=False` only records (a whole list at start-up: then one `settle()`)."""
        old = self._rank_of.get(ref)
        if old is not None:
            i = bisect_left(self._ranks, old)
            if old == r and size > 0:  # the usual change: in place
                if self._sizes[i] == size:
                    return set()
                if i < self._first:
                    self._prefix += size - self._sizes[i]
                self._sizes[i] = size
                return self._settled(ref, settle)
            if i < self._first:
                self._prefix -= self._sizes[i]
                self._first -= 1
            del self._ranks[i], self._refs[i], self._sizes[i]
            del self._rank_of[ref]
        elif r is None or size <= 0:
            return set()
        if r is not None and size > 0:
            i = bisect_right(self._ranks, r)
            self._ranks.insert(i, r)
            self._refs.insert(i, ref)
            self._sizes.insert(i, size)
            self._rank_of[ref] = r
            if i < self._first:  # inside the prefix: counted in it until settled
                self._prefix += size
                self._first += 1
        return self._settled(ref, settle)

    def _settled(self, ref: ServiceRef, settle: bool) -> set[ServiceRef]:
        return self.settle() - {ref} if settle else set()

    def settle(self) -> set[ServiceRef]:
        """Apply the rule to what is recorded; returns the Services whose admission
        changed."""
        sizes, limit = self._sizes, self.limit
        first, prefix = self._first, self._prefix
        while first > 0 and prefix > limit:  # the prefix grew past the limit: shorten it
            first -= 1
            prefix -= sizes[first]
        while first < len(sizes) and prefix + sizes[first] <= limit:  # room: lengthen it
            prefix += sizes[first]
            first += 1
        self._first, self._prefix = first, prefix
        before = self.refused
        used = prefix
        refused = []
        for i in range(first, len(sizes)):
            if used + sizes[i] <= limit:
                used += sizes[i]
            else:
                refused.append(self._refs[i])
        self.used = used
        if refused or before:
            self.refused = frozenset(refused)
        return set(before ^ self.refused)

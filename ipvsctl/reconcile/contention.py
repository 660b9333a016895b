"""Two Services wanting one virtual server: who has claimed what, who waits for whom.

The rule (who wins) is pure and lives in `plan/conflicts.py`; this keeps its state across
syncs: every Service's claims, the keys each Service currently loses (warned about once),
and the Services waiting for a key another one still holds (rebuilt when it is released).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping

from ipvsctl.model import DesiredService, ServiceKey, ServiceRef
from ipvsctl.obs.logging import fields
from ipvsctl.obs.metrics import Metrics
from ipvsctl.plan.conflicts import Claims, claims_of, split_won

log = logging.getLogger("ipvsctl.engine")


class Contention:
    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self.claims = Claims()
        self._losing: dict[ServiceRef, frozenset[ServiceKey]] = {}
        self._waiting: dict[ServiceKey, set[ServiceRef]] = {}

    def claim(
        self, ref: ServiceRef, desired: DesiredService | None, created: float | None
    ) -> set[ServiceRef]:
        """Record all the Service's claims (None: it is gone). Returns the other Services
        that won or lost a key by this change: they must be rebuilt."""
        affected = self.claims.update(ref, {} if desired is None else claims_of(desired, created))
        if desired is None:
            self._losing.pop(ref, None)
        self.metrics.virtual_server_conflict_losers.set(self.claims.conflicts())
        return affected

    def resolve(
        self, desired: DesiredService, owner: Mapping[ServiceKey, ServiceRef]
    ) -> DesiredService:
        """The Service with only the virtual servers it may program now: the winner of a
        key gets it once the other Service has released it."""
        ref = desired.ref
        kept, lost, taken = split_won(desired, self.claims, owner)
        for key in sorted(lost - self._losing.get(ref, frozenset())):
            self.metrics.virtual_server_conflicts.inc()
            log.warning(
                "virtual server claimed by another service",
                extra=fields(service=ref, vs=key, winner=self.claims.winner(key)),
            )
        if lost:
            self._losing[ref] = lost
        else:
            self._losing.pop(ref, None)
        for key in taken:
            self._waiting.setdefault(key, set()).add(ref)
        return kept

    def released(self, key: ServiceKey) -> set[ServiceRef]:
        """A virtual server was deleted: the Services that were waiting for it."""
        return self._waiting.pop(key, set())


class LiveOwners(Mapping[ServiceKey, ServiceRef]):
    """Who holds each virtual server as a live claim: the applied owners but for the
    virtual servers that drain (CONTRACT.md "Draining": a Service that claims one takes it
    over). A view, O(1) per lookup, no copy."""

    def __init__(
        self, owner: Mapping[ServiceKey, ServiceRef], draining: Mapping[ServiceKey, object]
    ) -> None:
        self._owner = owner
        self._draining = draining

    def __getitem__(self, key: ServiceKey) -> ServiceRef:
        if key in self._draining:
            raise KeyError(key)
        return self._owner[key]

    def __iter__(self) -> Iterator[ServiceKey]:
        return (k for k in self._owner if k not in self._draining)

    def __len__(self) -> int:
        return sum(1 for _ in self)

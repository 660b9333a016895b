"""Who gets a virtual server two Services claim (CONTRACT "What becomes a virtual server"). Pure.

Every address is one a Service merely *names* (`spec.externalIPs` is free text to anyone who
may create a Service; CVE-2020-8554), so arrival order must not decide: a tenant's
`externalIPs: [<kube-dns ClusterIP>]` would take UDP :53 whenever it happens to come first
(at every daemon restart, when the list is read in namespace/name order). The rule:

1. a cluster IP claim beats an external, load-balancer or node-port claim (cluster IPs are
   allocated by the API server, the others are asserted by the Service's author);
2. else the older Service (`metadata.creationTimestamp`) wins: the one that had it first;
3. else (same second, or no timestamp: manifests) namespace/name order.

A Service without a creation time ranks after every Service with one. The ranking is a
total order over (claim, Service), so the winner of a key is the minimum of its claims
whatever order they were added in; `Claims` keeps the claims per key and says, on each
change, which other Services won or lost something by it (they must be rebuilt).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ipvsctl.model import DesiredService, ServiceKey, ServiceRef, VirtualServerKind

# (0 for a cluster IP else 1, creation time or +inf, namespace, name)
Rank = tuple[int, float, str, str]


def rank(kind: VirtualServerKind, created: float | None, ref: ServiceRef) -> Rank:
    """Lower wins."""
    return (
        0 if kind is VirtualServerKind.CLUSTER_IP else 1,
        math.inf if created is None else created,
        ref.namespace,
        ref.name,
    )


@dataclass(slots=True)
class Claims:
    """Every Service's claims on virtual servers, by key. O(the Service's keys x the
    claimants of each) per update: conflicts are rare, so a key's claimants are few."""

    by_key: dict[ServiceKey, dict[ServiceRef, Rank]] = field(default_factory=dict)
    # a tuple: a quarter of a frozenset's size, and only iterated (10,000 Services)
    by_ref: dict[ServiceRef, tuple[ServiceKey, ...]] = field(default_factory=dict)
    _losing: int = 0  # sum over keys of (claimants - 1), kept as claims come and go

    def winner(self, key: ServiceKey) -> ServiceRef | None:
        claims = self.by_key.get(key)
        if not claims:
            return None
        return min(claims.items(), key=lambda kv: kv[1])[0]

    def losers(self, key: ServiceKey) -> list[ServiceRef]:
        claims = self.by_key.get(key, {})
        win = self.winner(key)
        return sorted(r for r in claims if r != win)

    def update(self, ref: ServiceRef, claims: Mapping[ServiceKey, Rank]) -> set[ServiceRef]:
        """Replace `ref`'s claims (empty: the Service is gone). Returns the other Services
        whose winning or losing of some key changed by it."""
        new_keys = tuple(claims)
        affected: set[ServiceRef] = set()
        for key in {*self.by_ref.get(ref, ()), *new_keys}:
            before = self.winner(key)
            entry = self.by_key.setdefault(key, {})
            self._losing -= max(0, len(entry) - 1)
            if key in claims:
                entry[ref] = claims[key]
            else:
                entry.pop(ref, None)
            self._losing += max(0, len(entry) - 1)
            if not entry:
                del self.by_key[key]
            after = self.winner(key)
            if before != after:
                affected.update(r for r in (before, after) if r is not None and r != ref)
        if new_keys:
            self.by_ref[ref] = new_keys
        else:
            self.by_ref.pop(ref, None)
        return affected

    def conflicts(self) -> int:
        """Claims currently losing (one per Service and key); O(1)."""
        return self._losing


def claims_of(desired: DesiredService, created: float | None) -> dict[ServiceKey, Rank]:
    """Every virtual server a Service asks for, ranked."""
    ref = desired.ref
    return {k: rank(dvs.kind, created, ref) for k, dvs in desired.virtual_servers.items()}


def split_won(
    desired: DesiredService,
    claims: Claims,
    owner: Mapping[ServiceKey, ServiceRef],
) -> tuple[DesiredService, frozenset[ServiceKey], frozenset[ServiceKey]]:
    """What a Service may program now: the keys it wins and no other Service still holds
    (the loser releases a key before the winner takes it). Returns (the Service with only
    those, the keys it loses, the keys it must wait for: lost or still held)."""
    ref = desired.ref
    lost = frozenset(k for k in desired.virtual_servers if claims.winner(k) != ref)
    taken = frozenset(k for k in desired.virtual_servers if k in lost or owner.get(k, ref) != ref)
    if not taken:
        return desired, lost, taken
    kept = {k: v for k, v in desired.virtual_servers.items() if k not in taken}
    return dataclasses.replace(desired, virtual_servers=kept), lost, taken


def resolve(claims: Iterable[tuple[ServiceRef, ServiceKey, Rank]]) -> dict[ServiceKey, ServiceRef]:
    """The winner of every key, for a whole set of claims at once (`ipvsctl plan`)."""
    best: dict[ServiceKey, tuple[Rank, ServiceRef]] = {}
    for ref, key, r in claims:
        if key not in best or r < best[key][0]:
            best[key] = (r, ref)
    return {key: ref for key, (_, ref) in best.items()}

"""What ipvsctl has applied to the kernel, per Service: the bottom of the engine.

Plain in-memory bookkeeping, no kernel calls: every other part of the engine (op
application, start-up adoption, the drift audit, status) reads and updates it here, so the
counts and indexes below can never disagree with the table they summarize:

- `by_service`: per Service, each virtual server as programmed (or found) and the weight of
  each of its real servers; `owner`: which Service each virtual server is held by;
- `desired`: the desired state last applied per Service (status, listeners, the diff's
  previous endpoints);
- `n_vs`/`n_rs`: the gauges' counts, O(1);
- the by-IP index behind `/v1/quiesced`: how many real servers with weight > 0 each pod IP
  has, and since when an IP has none (remembered `QUIESCED_MEMORY` seconds);
- `mutations`: bumped by every change, so a kernel reading taken meanwhile is recognized.
"""

from __future__ import annotations

import heapq
from collections.abc import Collection
from dataclasses import dataclass

from ipvsctl.model import (
    AppliedVirtualServer,
    DesiredService,
    RealServerKey,
    ServiceKey,
    ServiceRef,
    VirtualServer,
)
from ipvsctl.reconcile.clock import Clock

QUIESCED_MEMORY = 3600.0  # seconds an IP's "weight 0 since" is remembered


@dataclass(frozen=True, slots=True)
class Quiesced:
    """One pod IP as this node sends it traffic (rendered by the daemon as /v1/quiesced)."""

    address: str
    live: int  # real servers with weight > 0
    since: float | None  # wall time it last reached zero (None: not remembered)


class AppliedState:
    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.by_service: dict[ServiceRef, dict[ServiceKey, AppliedVirtualServer]] = {}
        self.desired: dict[ServiceRef, DesiredService] = {}
        self.owner: dict[ServiceKey, ServiceRef] = {}
        self.n_vs = 0
        self.n_rs = 0
        self.mutations = 0
        self._live_by_ip: dict[str, int] = {}
        self._quiesced_since: dict[str, float] = {}
        self._quiesced_expiry: list[tuple[float, str]] = []

    def get(self, ref: ServiceRef | None, key: ServiceKey) -> AppliedVirtualServer | None:
        """The virtual server as `ref` (default: its owner) applied it."""
        if ref is None:
            ref = self.owner.get(key)
        return self.by_service.get(ref, {}).get(key) if ref is not None else None

    def add(
        self,
        ref: ServiceRef,
        vs: VirtualServer,
        bind_address: bool,
        weights: dict[RealServerKey, int] | None = None,
    ) -> AppliedVirtualServer:
        """A virtual server `ref` now holds (programmed, or found in the kernel)."""
        state = AppliedVirtualServer(vs, bind_address)
        self.by_service.setdefault(ref, {})[vs.key] = state
        self.n_vs += 1
        for rs, w in (weights or {}).items():
            self.set_weight(state, rs, w)
        self.owner[vs.key] = ref
        return state

    def forget(
        self, ref: ServiceRef | None, key: ServiceKey, *, keep_owner: bool = False
    ) -> ServiceRef | None:
        """The virtual server is gone (deleted, or found missing: then `keep_owner`, so no
        other Service takes the key before its own Service re-adds it). Returns its owner."""
        owner = ref if ref is not None else self.owner.get(key)
        state = self.by_service.get(owner, {}).pop(key, None) if owner is not None else None
        if state is not None:
            self.n_vs -= 1
            for rs in list(state.weights):
                self.set_weight(state, rs, None)
        if not keep_owner and self.owner.get(key) == owner:
            self.owner.pop(key, None)
        if owner is not None and not self.by_service.get(owner, True) and owner not in self.desired:
            del self.by_service[owner]  # a deleted Service's last draining virtual server
        return owner

    def forget_service(self, ref: ServiceRef, keep: Collection[ServiceKey] = ()) -> None:
        """The Service is gone and its virtual servers with it, but for those in `keep`
        (draining: each goes with its last real server)."""
        self.desired.pop(ref, None)
        states = self.by_service.pop(ref, None)
        kept = {k: v for k, v in states.items() if k in keep} if states and keep else {}
        if kept:
            self.by_service[ref] = kept

    def move(self, key: ServiceKey, to: ServiceRef) -> ServiceRef | None:
        """Another Service takes the virtual server over in place, weights and all.
        Returns the Service it was of."""
        old = self.owner.get(key)
        if old is None or old == to:
            return old
        state = self.by_service.get(old, {}).pop(key, None)
        if state is None:
            return old
        if not self.by_service[old] and old not in self.desired:
            del self.by_service[old]
        self.by_service.setdefault(to, {})[key] = state
        self.owner[key] = to
        return old

    def set_weight(
        self, state: AppliedVirtualServer | None, rs: RealServerKey, weight: int | None
    ) -> None:
        """A real server's weight as applied (None: gone); keeps the counts and the by-IP
        index in step."""
        if state is None:
            return
        before = state.weights.get(rs)
        if weight is None:
            state.weights.pop(rs, None)
        else:
            state.weights[rs] = weight
        self.n_rs += (weight is not None) - (before is not None)
        was_live, live = (before or 0) > 0, (weight or 0) > 0
        if was_live != live:
            self._track_live(rs.address, 1 if live else -1)

    def _track_live(self, address: str, delta: int) -> None:
        n = self._live_by_ip.get(address, 0) + delta
        if n > 0:
            self._live_by_ip[address] = n
            self._quiesced_since.pop(address, None)
        else:
            now = self.clock.wall()
            self._live_by_ip.pop(address, None)
            self._quiesced_since[address] = now
            heapq.heappush(self._quiesced_expiry, (now + QUIESCED_MEMORY, address))

    def quiesced(self, address: str) -> Quiesced:
        """Whether this node still sends new connections to `address`, and since when not:
        a pod's shutdown barrier asks every node (`/v1/quiesced`)."""
        now = self.clock.wall()
        while self._quiesced_expiry and self._quiesced_expiry[0][0] <= now:
            _, ip = heapq.heappop(self._quiesced_expiry)
            since = self._quiesced_since.get(ip)
            if since is not None and since + QUIESCED_MEMORY <= now:
                del self._quiesced_since[ip]
        return Quiesced(
            address, self._live_by_ip.get(address, 0), self._quiesced_since.get(address)
        )

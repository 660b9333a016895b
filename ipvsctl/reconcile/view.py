"""The engine's state, read-only: what `/status`, `/v1/quiesced`, the daemon's health
answers and the conntrack sweep read of it, without reaching into its parts.

Read under the loop's lock, unless a name says otherwise. Nothing here changes the engine;
the mappings handed out are its own (a copy per call would cost O(table) on every /status
batch), so a caller reads them and lets go before the lock does.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping

from ipvsctl.model import (
    AppliedVirtualServer,
    ConnCounts,
    DesiredService,
    DrainEntry,
    NodeContext,
    RealServerKey,
    ServiceKey,
    ServiceRef,
)
from ipvsctl.reconcile.applied import AppliedState, Quiesced
from ipvsctl.reconcile.engine import Engine
from ipvsctl.source.node import NodeInfo


class EngineView:
    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    # --- plain attributes: safe to read without the lock --------------------------------
    @property
    def started(self) -> bool:
        """The first full list is in the kernel (/readyz)."""
        return self._engine.started

    @property
    def node(self) -> NodeContext:
        return self._engine.config.node

    @property
    def node_object(self) -> NodeInfo | None:
        """This node's Node as last read (None: never seen)."""
        return self._engine.intake.store.node

    @property
    def node_ips_known(self) -> frozenset[str]:
        """The current node IPs and those removed while running: NodePort virtual servers
        on either are ipvsctl's (ownership for adoption and the audit)."""
        return self._engine.intake.node_ips_known

    @property
    def pending_since(self) -> float | None:
        """Monotonic arrival of the oldest event not yet in the kernel (None: all in)."""
        return self._engine.pending_since

    @property
    def last_updated(self) -> float | None:
        """Wall time of the last complete sync (None: none yet)."""
        return self._engine.last_updated

    def wall(self) -> float:
        return self._engine.clock.wall()

    # --- under the lock -----------------------------------------------------------------
    def services(self) -> list[ServiceRef]:
        """The Services with applied virtual servers, unsorted."""
        return list(self._engine.state.by_service)

    def applied(self, ref: ServiceRef) -> Mapping[ServiceKey, AppliedVirtualServer]:
        return self._engine.state.by_service.get(ref, {})

    @property
    def applied_state(self) -> AppliedState:
        """The whole applied state, to read under the lock (the table guard puts the kernel
        back to it; nothing here writes it)."""
        return self._engine.state

    def desired(self, ref: ServiceRef) -> DesiredService | None:
        return self._engine.state.desired.get(ref)

    def desired_services(self) -> list[DesiredService]:
        return list(self._engine.state.desired.values())

    def draining(self, vs: ServiceKey, rs: RealServerKey) -> DrainEntry | None:
        return self._engine.drains.queue.get(vs, rs)

    def draining_virtual_server(self, vs: ServiceKey) -> ServiceRef | None:
        """The Service a virtual server drains for (it left that Service's wanted set);
        None: it is live."""
        return self._engine.drains.draining_virtual_servers.get(vs)

    def drain_queue(self) -> list[DrainEntry]:
        """Every queued drain, sorted by virtual server and real server (a copy)."""
        return list(self._engine.drains.queue)

    def drain_counts(self, vs: ServiceKey, rs: RealServerKey) -> tuple[int, int] | None:
        """(active, inactive) as the last drain check read them; None: not read."""
        return self._engine.drains.counts(vs, rs)

    def drain_conns(self, vs: ServiceKey, rs: RealServerKey) -> ConnCounts | None:
        return self._engine.drains.conns(vs, rs)

    def table(self) -> tuple[int, int]:
        """(entries the admitted Services ask for, --max-table-entries)."""
        capacity = self._engine.capacity
        return capacity.used, capacity.limit

    def skipped(self, most: int = 1000) -> tuple[list[tuple[ServiceRef, str]], int]:
        """The first `most` Services refused whole, with why, sorted, and how many there
        are (a tenant can make thousands: the list is bounded, the count is not)."""
        skipped = self._engine.intake.skipped
        return heapq.nsmallest(most, skipped.items()), len(skipped)

    def quiesced(self, address: str) -> Quiesced:
        return self._engine.state.quiesced(address)

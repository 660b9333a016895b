"""What the engine tells the rest of the daemon, typed: the change feed.

The engine and its applier are given one `ChangeFeed` when they are built and publish on it;
a feature (daemon/features/) says what it hears as a `Subscriptions` record, and the wiring
subscribes it before the daemon starts. Seven kinds of change, each called under the loop's
lock (on its thread, or a background read's at its apply), in the order of subscription,
O(the change) for every listener:

    service_changed(ref, old, new)   a Service's changes reached the kernel (its desired
                                     state before and after; None: it had none, or has none)
    vs_drain(key, event)             a virtual server that left the wanted set began to drain,
                                     was taken over, or went
    node_changed(node, at)           this node's Node changed (as now read; the event's
                                     arrival, monotonic)
    connections_cut(cut)             a drain's deadline cut established connections of a pod
    handed_over()                    the node is handed over to another proxy: every virtual
                                     server is gone (each Service heard with None first);
                                     remove what is yours and stay idle
    table_restored(done)             the table guard put back what another program removed
                                     (found by its own pass or by the audit)
    restores_recurring(recurring)    restores keep happening (True), or are quiet again
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ipvsctl.model import (
    ConnectionsCut,
    DesiredService,
    Restored,
    ServiceKey,
    ServiceRef,
    VirtualServerDrainEvent,
)
from ipvsctl.source.node import NodeInfo

ServiceListener = Callable[[ServiceRef, DesiredService | None, DesiredService | None], None]
VirtualServerDrainListener = Callable[[ServiceKey, VirtualServerDrainEvent], None]
NodeListener = Callable[[NodeInfo | None, float], None]
CutListener = Callable[[ConnectionsCut], object]  # never blocks: a writer queues it
HandedOverListener = Callable[[], None]
RestoredListener = Callable[[Restored], None]
RecurringListener = Callable[[bool], None]


@dataclass(frozen=True, slots=True)
class Subscriptions:
    """What one part hears on the feed (None: not that kind)."""

    service: ServiceListener | None = None
    vs_drain: VirtualServerDrainListener | None = None
    node: NodeListener | None = None
    cut: CutListener | None = None
    handed_over: HandedOverListener | None = None
    table_restored: RestoredListener | None = None
    restores_recurring: RecurringListener | None = None


class ChangeFeed:
    __slots__ = (
        "_cuts",
        "_handed_over",
        "_nodes",
        "_recurring",
        "_restored",
        "_services",
        "_vs_drains",
    )

    def __init__(self, *subscriptions: Subscriptions) -> None:
        self._services: list[ServiceListener] = []
        self._vs_drains: list[VirtualServerDrainListener] = []
        self._nodes: list[NodeListener] = []
        self._cuts: list[CutListener] = []
        self._handed_over: list[HandedOverListener] = []
        self._restored: list[RestoredListener] = []
        self._recurring: list[RecurringListener] = []
        for s in subscriptions:
            self.subscribe(s)

    def subscribe(self, s: Subscriptions) -> None:
        if s.service is not None:
            self._services.append(s.service)
        if s.vs_drain is not None:
            self._vs_drains.append(s.vs_drain)
        if s.node is not None:
            self._nodes.append(s.node)
        if s.cut is not None:
            self._cuts.append(s.cut)
        if s.handed_over is not None:
            self._handed_over.append(s.handed_over)
        if s.table_restored is not None:
            self._restored.append(s.table_restored)
        if s.restores_recurring is not None:
            self._recurring.append(s.restores_recurring)

    def unsubscribe(self, s: Subscriptions) -> None:
        """A part that stopped (nftables found unusable at start-up) hears nothing more."""
        if s.service is not None:
            self._services.remove(s.service)
        if s.vs_drain is not None:
            self._vs_drains.remove(s.vs_drain)
        if s.node is not None:
            self._nodes.remove(s.node)
        if s.cut is not None:
            self._cuts.remove(s.cut)
        if s.handed_over is not None:
            self._handed_over.remove(s.handed_over)
        if s.table_restored is not None:
            self._restored.remove(s.table_restored)
        if s.restores_recurring is not None:
            self._recurring.remove(s.restores_recurring)

    # --- publishing (the engine and its applier) -------------------------------------------
    def service_changed(
        self, ref: ServiceRef, old: DesiredService | None, new: DesiredService | None
    ) -> None:
        for listener in self._services:
            listener(ref, old, new)

    def vs_drain(self, key: ServiceKey, event: VirtualServerDrainEvent) -> None:
        for listener in self._vs_drains:
            listener(key, event)

    def node_changed(self, node: NodeInfo | None, at: float) -> None:
        for listener in self._nodes:
            listener(node, at)

    def connections_cut(self, cut: ConnectionsCut) -> None:
        for listener in self._cuts:
            listener(cut)

    def handed_over(self) -> None:
        for listener in self._handed_over:
            listener()

    def table_restored(self, done: Restored) -> None:
        for listener in self._restored:
            listener(done)

    def restores_recurring(self, recurring: bool) -> None:
        for listener in self._recurring:
            listener(recurring)

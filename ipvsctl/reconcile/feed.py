"""What the engine tells the rest of the daemon, typed: the change feed.

The engine and its applier are given one `ChangeFeed` when they are built and publish on it;
a feature (daemon/features/) says what it hears as a `Subscriptions` record, and the wiring
subscribes it before the daemon starts. Four kinds of change, each called on the loop's
thread under its lock, in the order of subscription, O(the change) for every listener:

    service_changed(ref, old, new)   a Service's changes reached the kernel (its desired
                                     state before and after; None: it had none, or has none)
    vs_drain(key, event)             a virtual server that left the wanted set began to drain,
                                     was taken over, or went
    node_changed(node, at)           this node's Node changed (as now read; the event's
                                     arrival, monotonic)
    connections_cut(cut)             a drain's deadline cut established connections of a pod
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ipvsctl.model import (
    ConnectionsCut,
    DesiredService,
    ServiceKey,
    ServiceRef,
    VirtualServerDrainEvent,
)
from ipvsctl.source.node import NodeInfo

ServiceListener = Callable[[ServiceRef, DesiredService | None, DesiredService | None], None]
VirtualServerDrainListener = Callable[[ServiceKey, VirtualServerDrainEvent], None]
NodeListener = Callable[[NodeInfo | None, float], None]
CutListener = Callable[[ConnectionsCut], object]  # never blocks: a writer queues it


@dataclass(frozen=True, slots=True)
class Subscriptions:
    """What one part hears on the feed (None: not that kind)."""

    service: ServiceListener | None = None
    vs_drain: VirtualServerDrainListener | None = None
    node: NodeListener | None = None
    cut: CutListener | None = None


class ChangeFeed:
    __slots__ = ("_cuts", "_nodes", "_services", "_vs_drains")

    def __init__(self, *subscriptions: Subscriptions) -> None:
        self._services: list[ServiceListener] = []
        self._vs_drains: list[VirtualServerDrainListener] = []
        self._nodes: list[NodeListener] = []
        self._cuts: list[CutListener] = []
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

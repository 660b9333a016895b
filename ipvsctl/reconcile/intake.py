"""The source side of the engine: events into the object store, and which Services each
event, node change or node address change makes dirty, O(the Services it touches).

Keeps the indexes that make those answers cheap (Services with a nodePort, Services whose
slices carry topology hints, Services by their external and load-balancer IPs), the node
IPs removed while running (NodePort virtual servers on them are still ours).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable

from ipvsctl.model import NodeContext, ServiceRef
from ipvsctl.model.objects import ServiceInfo
from ipvsctl.obs.logging import fields
from ipvsctl.obs.metrics import Metrics
from ipvsctl.source.events import ObjectKind, SourceEvent
from ipvsctl.source.store import ObjectStore, Problem

log = logging.getLogger("ipvsctl.engine")

# Node IPs removed while running, remembered so their NodePort virtual servers still count
# as ours (`node_ips_known`); bounded because IPv6 temporary addresses rotate for ever.
FORMER_NODE_IPS = 256


class Intake:
    def __init__(self, node: NodeContext, metrics: Metrics, started: float = 0.0) -> None:
        self.metrics = metrics
        # Trigger times (wall) of the changes waiting for the kernel, per Service: the network
        # programming SLI. Only changes after `started` (as kube-proxy's trackerStartTime):
        # the first list's slices changed before this daemon could program them.
        self.started = started
        self.triggers: dict[ServiceRef, list[float]] = {}
        self.store = ObjectStore(
            node.default_scheduler,
            node_name=node.node_name,
            service_proxy_name=node.service_proxy_name,
        )
        self.arrivals: dict[ServiceRef, list[float]] = {}  # monotonic, per dirty Service
        # Services with a nodePort: the only ones a node address change touches.
        self._node_port_services: set[ServiceRef] = set()
        # Services with a slice carrying topology hints: the only ones a zone change touches.
        self._hinted_services: set[ServiceRef] = set()
        # Services by their external and load-balancer IPs (only those that have some):
        # the ones a change of the node's own addresses touches (Node safety).
        self._by_address: dict[str, set[ServiceRef]] = {}
        self._addresses_of: dict[ServiceRef, frozenset[str]] = {}
        self._former_node_ips: dict[str, None] = {}  # insertion-ordered, oldest first
        self.node_ips_known = frozenset(node.node_ips)
        # What Node safety refused of each Service at its last build (plan/guard.py):
        # logged and counted when it changes, not at every rebuild of the Service.
        self._refused: dict[ServiceRef, tuple[str, ...]] = {}
        # The Services refused whole, with why (the per-Service or the node's table
        # limit): `/status` lists them as `plan` does.
        self.skipped: dict[ServiceRef, str] = {}

    def handle(self, event: SourceEvent) -> tuple[set[ServiceRef], bool]:
        """Returns the Services the event changed, and whether this node's Node did (then
        the caller asks `node_changed`)."""
        change = self.store.apply(event)
        for problem in change.problems:
            self._report_problem(problem)
        # A merged event (source/backlog.py) stands for every version it replaced: each is
        # observed from its own arrival.
        stamps = event.arrivals
        for ref in change.services:
            self.arrivals.setdefault(ref, []).extend(stamps)
            self._index(ref)
        for ref, t in change.triggers:
            if t >= self.started:
                self.triggers.setdefault(ref, []).append(t)
        if change.malformed_triggers:
            self.metrics.network_programming_skipped.labels("malformed").inc(
                change.malformed_triggers
            )
        return set(change.services), change.node

    def _index(self, ref: ServiceRef) -> None:
        svc = self.store.services.get(ref)
        if (
            svc is not None
            and svc.type in ("NodePort", "LoadBalancer")
            and any(p.node_port for p in svc.ports)
        ):
            self._node_port_services.add(ref)
        else:
            self._node_port_services.discard(ref)
        self._index_addresses(ref, svc)
        by_name = self.store.slices_by_service.get(ref)
        if by_name and any(sl.has_hints for sl in by_name.values()):
            self._hinted_services.add(ref)
        else:
            self._hinted_services.discard(ref)

    def _index_addresses(self, ref: ServiceRef, svc: ServiceInfo | None) -> None:
        new = (
            frozenset((*svc.external_ips, *svc.load_balancer_ips))
            if svc is not None
            else frozenset()
        )
        old = self._addresses_of.get(ref, frozenset())
        if new == old:
            return
        for address in old - new:
            refs = self._by_address[address]
            refs.discard(ref)
            if not refs:
                del self._by_address[address]
        for address in new - old:
            self._by_address.setdefault(address, set()).add(ref)
        if new:
            self._addresses_of[ref] = new
        else:
            del self._addresses_of[ref]

    def set_host_ips(
        self, ips: frozenset[str], node: NodeContext
    ) -> tuple[NodeContext, set[ServiceRef]] | None:
        """The node's own addresses changed (any interface): the new NodeContext and the
        Services whose external or load-balancer IPs are among the addresses that came or
        went (Node safety refuses, or lets through, their virtual servers at ports outside
        the NodePort range); None when nothing changed. O(the change). ClusterIPs come from
        the service range, no node address: they are checked whenever their Service is
        built, not here."""
        if ips == node.host_ips:
            return None
        changed = ips ^ node.host_ips
        dirty: set[ServiceRef] = set()
        for address in changed:
            dirty |= self._by_address.get(address, set())
        log.info(
            "node's own addresses changed",
            extra=fields(
                added=",".join(sorted(ips - node.host_ips)) or None,
                removed=",".join(sorted(node.host_ips - ips)) or None,
                services=len(dirty),
            ),
        )
        return dataclasses.replace(node, host_ips=ips), dirty

    def node_changed(self, node: NodeContext) -> tuple[NodeContext, set[ServiceRef]]:
        """This node's Node changed: a new zone marks dirty only the Services whose slices
        carry topology hints (node hints follow the node name, which never changes)."""
        obj = self.store.node
        zone = obj.zone if obj is not None else None
        log.info(
            "node object",
            extra=fields(
                node=node.node_name,
                known=obj is not None and obj.present,
                zone=zone,
                deleting=obj.deleting if obj is not None else None,
                taints=",".join(sorted(obj.taints)) if obj is not None and obj.taints else None,
                network_unavailable=obj.network_unavailable if obj is not None else None,
            ),
        )
        if zone == node.zone:
            return node, set()
        log.info("node zone changed", extra=fields(zone=zone, services=len(self._hinted_services)))
        return dataclasses.replace(node, zone=zone), set(self._hinted_services)

    def set_node_ips(
        self,
        ips: Iterable[str],
        node: NodeContext,
    ) -> tuple[NodeContext, set[ServiceRef]] | None:
        """The node's addresses changed: the new NodeContext and the Services with a
        nodePort (their virtual servers move); None when nothing changed."""
        new = tuple(dict.fromkeys(ips))
        old = node.node_ips
        if set(new) == set(old):
            return None
        added = sorted(set(new) - set(old))
        removed = sorted(set(old) - set(new))
        for ip in added:
            self._former_node_ips.pop(ip, None)
        for ip in removed:
            self._former_node_ips[ip] = None
        while len(self._former_node_ips) > FORMER_NODE_IPS:
            del self._former_node_ips[next(iter(self._former_node_ips))]
        self.node_ips_known = frozenset((*new, *self._former_node_ips))
        log.info(
            "node addresses changed",
            extra=fields(
                added=",".join(added) or None,
                removed=",".join(removed) or None,
                services=len(self._node_port_services),
            ),
        )
        return dataclasses.replace(node, node_ips=new), set(self._node_port_services)

    def ready(self, wait_for_node: bool) -> bool:
        synced = self.store.synced
        return {ObjectKind.SERVICE, ObjectKind.ENDPOINT_SLICE} <= synced and (
            ObjectKind.NODE in synced or not wait_for_node
        )

    def refused(self, ref: ServiceRef, reasons: list[str], whole: str | None = None) -> None:
        """Node safety refused these of the Service's virtual servers (or all of it, for
        `whole`): one line and a count in ipvsctl_invalid_objects_total when that changes."""
        if whole is None:
            self.skipped.pop(ref, None)
        else:
            self.skipped[ref] = whole
        now = tuple(reasons)
        if self._refused.get(ref, ()) == now:
            return
        if now:
            self._refused[ref] = now
            self.metrics.invalid_objects.labels("Service").inc()
            shown = "; ".join(now[:3]) + (f"; and {len(now) - 3} more" if len(now) > 3 else "")
            log.warning("virtual servers refused", extra=fields(service=str(ref), reason=shown))
        else:
            del self._refused[ref]

    def _report_problem(self, p: Problem) -> None:
        self.metrics.invalid_objects.labels(p.kind.value).inc()
        msg = "invalid object skipped" if p.fatal else "invalid field ignored"
        log.warning(msg, extra=fields(kind=p.kind.value, object=p.name, reason=p.reason))

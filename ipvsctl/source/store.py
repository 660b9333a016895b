"""The parsed objects known so far, and which Services each change touches.

Every operation costs O(the objects it names): a slice event touches its own Service, a
Replace (relist) compares each listed object with what is stored and reports only real
changes, so a relist of an unchanged cluster reports nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, assert_never

from ipvsctl.model import ServiceRef
from ipvsctl.source.convert import ServiceInfo, SliceInfo, parse_trigger_time
from ipvsctl.source.events import (
    Delete,
    ObjectKind,
    PreparedReplace,
    PreparedUpsert,
    Replace,
    SourceEvent,
    StoreEvent,
    Upsert,
)
from ipvsctl.source.node import NodeInfo
from ipvsctl.source.prepare import Prepared, Preparer


@dataclass(frozen=True, slots=True)
class Problem:
    """An object that was skipped (or partly ignored), for one log line and a metric."""

    kind: ObjectKind
    name: str  # namespace/name
    reason: str
    fatal: bool = True  # False: the object was used, one field ignored


@dataclass(slots=True)
class StoreChange:
    services: set[ServiceRef] = field(default_factory=set)  # need recomputing
    problems: list[Problem] = field(default_factory=list)
    synced: ObjectKind | None = None  # a Replace of this kind was applied
    node: bool = False  # this node's Node changed (store.node)
    # Changed slices' trigger times (the network programming SLI), and how many changed
    # slices carried a malformed one.
    triggers: list[tuple[ServiceRef, float]] = field(default_factory=list)
    malformed_triggers: int = 0

    def merge(self, other: StoreChange) -> None:
        self.services |= other.services
        self.problems += other.problems
        self.node |= other.node
        self.triggers += other.triggers
        self.malformed_triggers += other.malformed_triggers


class ObjectStore:
    def __init__(
        self,
        default_scheduler: str = "rr",
        node_name: str | None = None,
        service_proxy_name: str | None = None,
    ) -> None:
        # How raw objects are parsed (--scheduler, --service-proxy-name, --node-name); a
        # source that prepares its lists must use an equal one.
        self.preparer = Preparer(default_scheduler, node_name, service_proxy_name)
        self.default_scheduler = default_scheduler
        self.service_proxy_name = service_proxy_name
        # This node's Node (other Nodes are ignored): None until seen; once seen and then
        # deleted, a NodeInfo with present=False. Replaced whole, so other threads (the
        # health server) can read it without a lock.
        self.node_name = node_name
        self.node: NodeInfo | None = None
        self.services: dict[ServiceRef, ServiceInfo] = {}
        self.slices: dict[tuple[str, str], SliceInfo] = {}  # (namespace, slice name)
        self.slices_by_service: dict[ServiceRef, dict[str, SliceInfo]] = {}
        self.synced: set[ObjectKind] = set()

    # --- queries ------------------------------------------------------------------
    def slices_of(self, ref: ServiceRef) -> Iterable[SliceInfo]:
        by_name = self.slices_by_service.get(ref)
        return [by_name[n] for n in sorted(by_name)] if by_name else ()

    # --- events -------------------------------------------------------------------
    def apply(self, event: SourceEvent) -> StoreChange:
        """The event's changes (a raw one's objects prepared first, prepare.py)."""
        e = self._prepared(event)
        match e:
            case PreparedUpsert():
                self._check_prepared(e.kind, e.obj)
                change = self._put(e.obj)
            case Delete():
                change = self._delete(e.kind, e.namespace, e.name)
            case PreparedReplace():
                return self._replace(e.kind, e.objects)
            case _:
                assert_never(e)
        if e.earlier_triggers and change.services:
            self._earlier_triggers(change, e.earlier_triggers)
        return change

    def _prepared(self, event: SourceEvent) -> StoreEvent:
        """The event at the store's stage: a raw one's objects prepared (a raw Replace's one
        by one, as listed), a prepared one as the source made it."""
        match event:
            case Upsert():
                obj = self.preparer.prepare(event.kind, event.obj, None)
                return PreparedUpsert(
                    event.kind, obj, event.received, event.earlier, event.earlier_triggers
                )
            case Replace():
                objects = [self.preparer(event.kind, o) for o in event.objects]
                return PreparedReplace(event.kind, objects, event.received)
            case PreparedUpsert() | PreparedReplace() | Delete():
                return event
            case _:
                assert_never(event)

    def _earlier_triggers(self, change: StoreChange, raws: Iterable[Any]) -> None:
        """The trigger times of the versions a merged event replaced (source/backlog.py):
        observed as if each had been applied, with the Service the slice is of now (or
        was, when it is gone)."""
        refs = {ref for ref, _ in change.triggers} or change.services
        ref = min(refs, key=lambda r: (r.namespace, r.name))
        for raw in raws:
            t, malformed = parse_trigger_time(raw)
            if t is not None:
                change.triggers.append((ref, t))
            elif malformed:
                change.malformed_triggers += 1

    def _put(self, prepared: Prepared) -> StoreChange:
        change = StoreChange()
        kind = prepared.kind
        if prepared.problem is not None:
            # The last good version (if any) stays in force: skipping a bad update must
            # not take traffic away from a working Service.
            change.problems.append(Problem(kind, prepared.label or "", prepared.problem))
            return change
        if prepared.unproxied is not None:
            # Not ours (another proxy's, or headless), perhaps since a relabel: as if deleted.
            return self._delete(kind, *prepared.unproxied)
        for w in prepared.warnings:
            change.problems.append(Problem(kind, prepared.label or "", w, fatal=False))
        value = prepared.value
        if isinstance(value, ServiceInfo):
            self._put_service(value, change)
        elif isinstance(value, SliceInfo):
            self._put_slice(value, change)
        elif isinstance(value, NodeInfo):
            self._set_node(value, change)
        return change

    def _delete(self, kind: ObjectKind, namespace: str, name: str) -> StoreChange:
        change = StoreChange()
        if kind is ObjectKind.SERVICE:
            ref = ServiceRef(namespace, name)
            if self.services.pop(ref, None) is not None:
                change.services.add(ref)
        elif kind is ObjectKind.ENDPOINT_SLICE:
            self._drop_slice((namespace, name), change)
        elif (
            kind is ObjectKind.NODE
            and name == self.node_name
            and self.node is not None
            and self.node.present
        ):
            self._set_node(NodeInfo(name, present=False), change)
        return change

    def _replace(self, kind: ObjectKind, objects: list[Prepared]) -> StoreChange:
        change = StoreChange(synced=kind)
        listed: set[tuple[str, str]] = set()
        for prepared in objects:  # before anything changes
            self._check_prepared(kind, prepared)
        for prepared in objects:
            change.merge(self._put(prepared))
            if prepared.key is not None:
                listed.add(prepared.key)
        if kind is ObjectKind.SERVICE:
            gone: Iterable[tuple[str, str]] = [
                (r.namespace, r.name) for r in self.services if (r.namespace, r.name) not in listed
            ]
        elif kind is ObjectKind.ENDPOINT_SLICE:
            gone = [k for k in self.slices if k not in listed]
        elif kind is ObjectKind.NODE:
            gone = [
                ("default", n)
                for n in (self.node_name,)
                if n and not any(name == n for _, name in listed)
            ]
        else:
            gone = []
        for namespace, name in list(gone):
            change.merge(self._delete(kind, namespace, name))
        self.synced.add(kind)
        return change

    # --- internals ----------------------------------------------------------------
    def _check_prepared(self, kind: ObjectKind, obj: Prepared) -> None:
        if obj.kind is not kind or (obj.by is not self.preparer and obj.by != self.preparer):
            # A wiring bug (the source's preparer is not this store's): parsing with
            # another scheduler or proxy name would be silently wrong.
            raise ValueError(f"a {obj.kind} prepared by {obj.by} in a {kind} event")

    def _put_service(self, info: ServiceInfo, change: StoreChange) -> None:
        if self.services.get(info.ref) != info:
            self.services[info.ref] = info
            change.services.add(info.ref)

    def _put_slice(self, info: SliceInfo, change: StoreChange) -> None:
        key = (info.namespace, info.name)
        old = self.slices.get(key)
        if old == info:
            return
        if old is not None and old.service != info.service:
            self._drop_slice(key, change)  # moved to another Service: both need work
        self.slices[key] = info
        if info.service is not None:
            self.slices_by_service.setdefault(info.service, {})[info.name] = info
            change.services.add(info.service)
            if info.trigger_time is not None:
                change.triggers.append((info.service, info.trigger_time))
            elif info.trigger_malformed:
                change.malformed_triggers += 1

    def _drop_slice(self, key: tuple[str, str], change: StoreChange) -> None:
        old = self.slices.pop(key, None)
        if old is None or old.service is None:
            return
        by_name = self.slices_by_service.get(old.service, {})
        by_name.pop(old.name, None)
        if not by_name:
            self.slices_by_service.pop(old.service, None)
        change.services.add(old.service)

    def _set_node(self, info: NodeInfo, change: StoreChange) -> None:
        if self.node != info:
            self.node = info
            change.node = True

"""The source events waiting for the loop: a FIFO that holds at most one event per
EndpointSlice.

When the watch delivers EndpointSlice updates faster than the loop applies them, the queue
held every version of every slice (trimmed API objects, ~7 KB per 10-endpoint slice): at
10,000 Services the backlog of 10,000 updates was ~30 MB, the daemon's peak. Only a slice's
newest version matters to the store, so a newer Upsert or Delete of a slice still waiting
takes the older one's place in the queue (client-go's DeltaFIFO keeps a key's first
position too): the backlog is bounded by the number of slices, not of events.

Nothing is lost by it: the merged event carries the arrival stamps and the trigger-time
annotations of the versions it replaced (`Upsert.earlier`, `earlier_triggers`), so every
event is still observed in `ipvsctl_event_to_kernel_seconds` and the network programming
SLI (from its own arrival to the kernel write that covers it). Events of other keys keep
their order; so does a slice's history around a Replace (a relist): no event merges across
one. Services and Nodes are few and kept as they come.
"""

from __future__ import annotations

import queue
from collections import deque
from collections.abc import Mapping
from typing import Any

from ipvsctl.source.convert import TRIGGER_TIME_ANNOTATION
from ipvsctl.source.events import Delete, ObjectKind, Replace, SourceEvent, Upsert

SliceKey = tuple[str, str]  # (namespace, name)


class _Slot:
    __slots__ = ("event", "key")

    def __init__(self, event: SourceEvent, key: SliceKey | None) -> None:
        self.event = event
        self.key = key


def slice_key(event: SourceEvent) -> SliceKey | None:
    """The EndpointSlice an Upsert or Delete is of, or None (other kinds, a Replace, an
    object without a readable name: those are never merged)."""
    if event.kind is not ObjectKind.ENDPOINT_SLICE:
        return None
    if isinstance(event, Delete):
        return (event.namespace, event.name)
    if isinstance(event, Upsert):
        meta = event.obj.get("metadata") if isinstance(event.obj, Mapping) else None
        if not isinstance(meta, Mapping):
            return None
        name, namespace = meta.get("name"), meta.get("namespace") or "default"
        if isinstance(name, str) and name and isinstance(namespace, str):
            return (namespace, name)
    return None


def _trigger(event: Upsert | Delete) -> Any:
    """The superseded version's trigger-time annotation as sent (parsed by the store)."""
    if isinstance(event, Delete):
        return None
    meta = event.obj.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
    return annotations.get(TRIGGER_TIME_ANNOTATION) if isinstance(annotations, Mapping) else None


def merge(old: Upsert | Delete, new: Upsert | Delete) -> Upsert | Delete:
    """`new` in place of `old`, carrying `old`'s stamps (and theirs) along."""
    earlier = (*old.earlier, old.received)
    trigger = _trigger(old)
    triggers = (*old.earlier_triggers, trigger) if trigger is not None else old.earlier_triggers
    triggers = (*triggers, *new.earlier_triggers)
    earlier = (*earlier, *new.earlier)
    if isinstance(new, Upsert):
        return Upsert(new.kind, new.obj, new.received, earlier, triggers)
    return Delete(new.kind, new.namespace, new.name, new.received, earlier, triggers)


class Backlog(queue.Queue[SourceEvent]):
    """`queue.Queue` (its locking, `put`, `get`, `qsize`) over a deque of slots; an
    EndpointSlice's Upsert or Delete replaces that slice's event still waiting."""

    def _init(self, maxsize: int) -> None:
        self.queue: deque[_Slot] = deque()
        self._waiting: dict[SliceKey, _Slot] = {}
        self.merged = 0  # events that replaced a waiting one (for the bench and tests)

    def _qsize(self) -> int:
        return len(self.queue)

    def _put(self, event: SourceEvent) -> None:
        if isinstance(event, Replace):
            # A relist: a later update must not jump ahead of it into an older slot.
            if event.kind is ObjectKind.ENDPOINT_SLICE:
                self._waiting.clear()
            self.queue.append(_Slot(event, None))
            return
        key = slice_key(event)
        slot = self._waiting.get(key) if key is not None else None
        if slot is not None:
            assert isinstance(slot.event, (Upsert, Delete))
            slot.event = merge(slot.event, event)
            self.merged += 1
            # Queue.put counts an unfinished task per put; one item fewer will be taken.
            self.unfinished_tasks -= 1
            return
        slot = _Slot(event, key)
        self.queue.append(slot)
        if key is not None:
            self._waiting[key] = slot

    def _get(self) -> SourceEvent:
        slot = self.queue.popleft()
        if slot.key is not None and self._waiting.get(slot.key) is slot:
            del self._waiting[slot.key]
        return slot.event

"""The source events waiting for the loop: a FIFO that holds at most one event per
EndpointSlice.

When the watch delivers EndpointSlice updates faster than the loop applies them, the queue
held every version of every slice (trimmed API objects, ~7 KB per 10-endpoint slice): at
10,000 Services the backlog of 10,000 updates was ~30 MB, the daemon's peak. Only a slice's
newest version matters to the store, so a newer Upsert or Delete of a slice still waiting
takes the older one's place in the queue (client-go's DeltaFIFO keeps a key's first
position too): the backlog is bounded by the number of slices, not of events. The API
source parses a watch event's object before it queues it (`store.Prepared`, ~1 KB a
slice), so what waits is the parsed slice, not its raw object.

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
from typing import Any

from ipvsctl.source.convert import trigger_annotation
from ipvsctl.source.events import Delete, ObjectKind, Replace, SourceEvent, Upsert
from ipvsctl.source.store import Prepared, listed_key

SliceKey = tuple[str, str]  # (namespace, name)


class _Slot:
    """One waiting event. Once a newer version merges in, the stamps and triggers of the
    versions it replaced collect here, appended: k updates of one waiting slice cost O(k),
    not the O(k^2) of copying a tuple per merge. The event leaves with them as tuples."""

    __slots__ = ("earlier", "event", "key", "triggers")

    def __init__(self, event: SourceEvent, key: SliceKey | None) -> None:
        self.event = event
        self.key = key
        self.earlier: list[float] | None = None  # None: nothing merged in yet
        self.triggers: list[Any] = []

    def absorb(self, new: Upsert | Delete) -> None:
        """`new` in place of the waiting version, whose stamp and trigger it carries."""
        old = self.event
        assert isinstance(old, (Upsert, Delete))
        if self.earlier is None:
            self.earlier = list(old.earlier)
            self.triggers = list(old.earlier_triggers)
        self.earlier.append(old.received)
        trigger = _trigger(old)
        if trigger is not None:
            self.triggers.append(trigger)
        self.earlier.extend(new.earlier)
        self.triggers.extend(new.earlier_triggers)
        self.event = new

    def take(self) -> SourceEvent:
        event = self.event
        if self.earlier is None:
            return event
        earlier, triggers = tuple(self.earlier), tuple(self.triggers)
        if isinstance(event, Upsert):
            return Upsert(event.kind, event.obj, event.received, earlier, triggers)
        assert isinstance(event, Delete)
        return Delete(event.kind, event.namespace, event.name, event.received, earlier, triggers)


def slice_key(event: SourceEvent) -> SliceKey | None:
    """The EndpointSlice an Upsert or Delete is of, or None (other kinds, a Replace, an
    object without a readable name: those are never merged)."""
    if event.kind is not ObjectKind.ENDPOINT_SLICE:
        return None
    if isinstance(event, Delete):
        return (event.namespace, event.name)
    if isinstance(event, Upsert):
        obj = event.obj
        # parsed in the source's thread: its key was read then, by the same rule
        return obj.key if isinstance(obj, Prepared) else listed_key(obj)
    return None


def _trigger(event: Upsert | Delete) -> Any:
    """The superseded version's trigger-time annotation as sent (parsed by the store)."""
    if isinstance(event, Delete):
        return None
    if isinstance(event.obj, Prepared):
        return event.obj.trigger
    return trigger_annotation(event.obj)


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
            assert isinstance(event, (Upsert, Delete))
            slot.absorb(event)
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
        return slot.take()

"""The source events waiting for the loop: a FIFO that holds at most one event per
EndpointSlice.

When the watch delivers EndpointSlice updates faster than the loop applies them, the queue
held every version of every slice (trimmed API objects, ~7 KB per 10-endpoint slice): at
10,000 Services the backlog of 10,000 updates was ~30 MB, the daemon's peak. Only a slice's
newest version matters to the store, so a newer Upsert or Delete of a slice still waiting
takes the older one's place in the queue (client-go's DeltaFIFO keeps a key's first
position too): the backlog is bounded by the number of slices, not of events. The API
source parses a watch event's object before it queues it (a `PreparedUpsert`, ~1 KB a
slice), so what waits is the parsed slice, not its raw object.

Nothing is lost by it: the merged event carries the arrival stamps and the trigger-time
annotations of the versions it replaced (`Upsert.earlier`, `earlier_triggers`), so every
event is still observed in `ipvsctl_event_to_kernel_seconds` and the network programming
SLI (from its own arrival to the kernel write that covers it). Events of other keys keep
their order; so does a slice's history around a Replace (a relist): no event merges across
one. Services and Nodes are few and kept as they come.
"""

from __future__ import annotations

import dataclasses
import queue
from collections import deque
from typing import Any, assert_never

from ipvsctl.source.convert import trigger_annotation
from ipvsctl.source.events import (
    Delete,
    ObjectKind,
    PreparedReplace,
    PreparedUpsert,
    Replace,
    SourceEvent,
    Upsert,
)
from ipvsctl.source.prepare import listed_key

SliceKey = tuple[str, str]  # (namespace, name)
Change = Upsert | PreparedUpsert | Delete  # what merges: one object's newest version


class _Slot:
    """One waiting event."""

    __slots__ = ("event", "key")

    def __init__(self, event: SourceEvent, key: SliceKey | None = None) -> None:
        self.event = event
        self.key = key

    def take(self) -> SourceEvent:
        return self.event


class _Merging(_Slot):
    """A slice's waiting Upsert or Delete. Once a newer version merges in, the stamps and
    triggers of the versions it replaced collect here, appended: k updates of one waiting
    slice cost O(k), not the O(k^2) of copying a tuple per merge. The event leaves with
    them as tuples."""

    __slots__ = ("change", "earlier", "triggers")

    def __init__(self, change: Change, key: SliceKey) -> None:
        super().__init__(change, key)
        self.change = change
        self.earlier: list[float] | None = None  # None: nothing merged in yet
        self.triggers: list[Any] = []

    def absorb(self, new: Change) -> None:
        """`new` in place of the waiting version, whose stamp and trigger it carries."""
        old = self.change
        if self.earlier is None:
            self.earlier = list(old.earlier)
            self.triggers = list(old.earlier_triggers)
        self.earlier.append(old.received)
        trigger = _trigger(old)
        if trigger is not None:
            self.triggers.append(trigger)
        self.earlier.extend(new.earlier)
        self.triggers.extend(new.earlier_triggers)
        self.change = self.event = new

    def take(self) -> SourceEvent:
        if self.earlier is None:
            return self.change
        earlier, triggers = tuple(self.earlier), tuple(self.triggers)
        return dataclasses.replace(self.change, earlier=earlier, earlier_triggers=triggers)


def slice_key(event: Change) -> SliceKey | None:
    """The EndpointSlice an Upsert or Delete is of, or None (other kinds, an object without
    a readable name: those are never merged)."""
    if event.kind is not ObjectKind.ENDPOINT_SLICE:
        return None
    match event:
        case Delete():
            return (event.namespace, event.name)
        case Upsert():
            return listed_key(event.obj)
        case PreparedUpsert():  # parsed in the source's thread: its key read then, as here
            return event.obj.key
        case _:
            assert_never(event)


def _trigger(event: Change) -> Any:
    """The superseded version's trigger-time annotation as sent (parsed by the store)."""
    match event:
        case Delete():
            return None
        case Upsert():
            return trigger_annotation(event.obj)
        case PreparedUpsert():
            return event.obj.trigger
        case _:
            assert_never(event)


class Backlog(queue.Queue[SourceEvent]):
    """`queue.Queue` (its locking, `put`, `get`, `qsize`) over a deque of slots; an
    EndpointSlice's Upsert or Delete replaces that slice's event still waiting."""

    def _init(self, maxsize: int) -> None:
        self.queue: deque[_Slot] = deque()
        self._waiting: dict[SliceKey, _Merging] = {}
        self.merged = 0  # events that replaced a waiting one (for the bench and tests)

    def _qsize(self) -> int:
        return len(self.queue)

    def _put(self, event: SourceEvent) -> None:
        if isinstance(event, Replace | PreparedReplace):
            # A relist: a later update must not jump ahead of it into an older slot.
            if event.kind is ObjectKind.ENDPOINT_SLICE:
                self._waiting.clear()
            self.queue.append(_Slot(event))
            return
        key = slice_key(event)
        if key is None:
            self.queue.append(_Slot(event))
            return
        slot = self._waiting.get(key)
        if slot is not None:
            slot.absorb(event)
            self.merged += 1
            # Queue.put counts an unfinished task per put; one item fewer will be taken.
            self.unfinished_tasks -= 1
            return
        self._waiting[key] = merging = _Merging(event, key)
        self.queue.append(merging)

    def _get(self) -> SourceEvent:
        slot = self.queue.popleft()
        if slot.key is not None and self._waiting.get(slot.key) is slot:
            del self._waiting[slot.key]
        return slot.take()

"""What every object source (API server watch, manifest folder) emits, and the port it
implements. An object is at one of two stages, and each stage has its own events:

    Upsert, Replace                   raw JSON-like dicts (trimmed to the fields ipvsctl
                                      reads), as a manifest folder emits them
    PreparedUpsert, PreparedReplace   what the node's `Preparer` made of them (prepare.py),
                                      as the API source emits them: parsed where decoded

Parsing and validation happen once, in `source.convert`, through a `Preparer`: the engine's
intake prepares raw events; the store applies prepared ones only.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ipvsctl.source.kinds import ObjectKind

if TYPE_CHECKING:
    from ipvsctl.source.prepare import Prepared

RawObject = dict[str, Any]


class _Mergeable:
    """An event the backlog (backlog.py) may merge newer versions of an object into: it then
    stands for each version it replaced while waiting."""

    __slots__ = ()
    earlier: tuple[float, ...]
    received: float

    @property
    def arrivals(self) -> tuple[float, ...]:
        """Its arrival, after those of the versions it replaced while waiting."""
        return (*self.earlier, self.received)


@dataclass(frozen=True, slots=True)
class Upsert(_Mergeable):
    """An object was added or modified (watch ADDED/MODIFIED), raw."""

    kind: ObjectKind
    obj: RawObject
    received: float  # time.monotonic() when the source got it
    # Older versions this one replaced while waiting (source/backlog.py): their arrival
    # stamps, and their trigger-time annotations as sent.
    earlier: tuple[float, ...] = ()
    earlier_triggers: tuple[Any, ...] = ()


@dataclass(frozen=True, slots=True)
class PreparedUpsert(_Mergeable):
    """An Upsert whose object the source prepared as it decoded it (`Preparer.event`)."""

    kind: ObjectKind
    obj: Prepared
    received: float
    earlier: tuple[float, ...] = ()  # as Upsert's
    earlier_triggers: tuple[Any, ...] = ()


@dataclass(frozen=True, slots=True)
class Delete(_Mergeable):
    """An object was deleted (watch DELETED)."""

    kind: ObjectKind
    namespace: str
    name: str
    received: float
    earlier: tuple[float, ...] = ()  # as Upsert's
    earlier_triggers: tuple[Any, ...] = ()


@dataclass(frozen=True, slots=True)
class Replace:
    """The complete current set of one kind (initial list or relist after 410 / a broken
    stream). Applied as a diff against what is known: objects absent are deleted, unchanged
    ones cause no work. The first Replace of Services and of EndpointSlices marks the source
    as synced."""

    kind: ObjectKind
    objects: list[RawObject]
    received: float

    @property
    def arrivals(self) -> tuple[float, ...]:
        return (self.received,)


@dataclass(frozen=True, slots=True)
class PreparedReplace:
    """A Replace whose objects the source prepared as it decoded the list (the API source:
    no list of raw objects beside the parsed store)."""

    kind: ObjectKind
    objects: list[Prepared]
    received: float

    @property
    def arrivals(self) -> tuple[float, ...]:
        return (self.received,)


# What a source emits, at either stage; what the store applies (the intake prepares first).
SourceEvent = Upsert | Delete | Replace | PreparedUpsert | PreparedReplace
StoreEvent = PreparedUpsert | Delete | PreparedReplace
EventSink = Callable[[SourceEvent], None]


class ObjectSource(Protocol):
    """A source of Services, EndpointSlices and this node's Node. No Pods: what ipvsctl
    knows of a pod comes from the EndpointSlices (CONTRACT.md "Draining")."""

    def run(self, sink: EventSink, stop: threading.Event) -> None:
        """Emit a Replace for Services and one for EndpointSlices, then changes, until
        `stop` is set. Blocking; transient failures are retried inside with backoff and
        never end the call. Raises SourceConfigError only for a fatal configuration error
        found at start-up."""
        ...


class SourceConfigError(Exception):
    """A source cannot start: bad kubeconfig, unreadable manifest folder, ..."""


__all__ = [
    "Delete",
    "EventSink",
    "ObjectKind",
    "ObjectSource",
    "PreparedReplace",
    "PreparedUpsert",
    "RawObject",
    "Replace",
    "SourceConfigError",
    "SourceEvent",
    "StoreEvent",
    "Upsert",
]
_ = threading  # used in the Protocol's signature

"""What every object source (API server watch, manifest folder) emits, and the port it
implements. Sources pass raw JSON-like dicts (trimmed to the fields ipvsctl reads); parsing
and validation happen once, in `source.convert`: on the engine's side, or for the API
source's lists and watch events where each object is decoded (the store's `Preparer`,
source/store.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

RawObject = dict[str, Any]


class ObjectKind(StrEnum):
    SERVICE = "Service"
    ENDPOINT_SLICE = "EndpointSlice"
    NODE = "Node"  # this node's own Node (zone, deletion); no Replace of it is required


@dataclass(frozen=True, slots=True)
class Upsert:
    """An object was added or modified (watch ADDED/MODIFIED)."""

    kind: ObjectKind
    obj: RawObject
    received: float  # time.monotonic() when the source got it
    # Older versions this one replaced while waiting (source/backlog.py): their arrival
    # stamps, and their trigger-time annotations as sent.
    earlier: tuple[float, ...] = ()
    earlier_triggers: tuple[Any, ...] = ()


@dataclass(frozen=True, slots=True)
class Delete:
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
    # Raw objects, or what the store's `Preparer` (source/store.py) made of them where the
    # list was decoded (the API source: no list of raw objects beside the parsed store).
    objects: list[Any]
    received: float


SourceEvent = Upsert | Delete | Replace
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
    "RawObject",
    "Replace",
    "SourceConfigError",
    "SourceEvent",
    "Upsert",
]
_ = threading  # used in the Protocol's signature

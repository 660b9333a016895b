"""The kinds of object a source emits."""

from __future__ import annotations

from enum import StrEnum


class ObjectKind(StrEnum):
    SERVICE = "Service"
    ENDPOINT_SLICE = "EndpointSlice"
    NODE = "Node"  # this node's own Node (zone, deletion); no Replace of it is required

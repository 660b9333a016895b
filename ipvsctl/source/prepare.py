"""The first step of every object: a raw Kubernetes object (JSON-like, trimmed to the
fields ipvsctl reads) parsed with the node's fixed configuration into a `Prepared`, what the
store applies. Sources may prepare objects as they decode them (kube/watch.py), so a list
never holds all its raw objects at once; the store prepares the rest as it applies them (a
manifest folder's, the tests'). Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ipvsctl.model import NodeContext
from ipvsctl.source.convert import (
    InvalidObject,
    Parsed,
    ServiceInfo,
    SliceInfo,
    is_proxied,
    object_name,
    parse_endpoint_slice,
    parse_service,
    trigger_annotation,
)
from ipvsctl.source.kinds import ObjectKind
from ipvsctl.source.node import NodeInfo, parse_node


@dataclass(slots=True)  # not frozen: built once per object and event, frozen's init is slow
class Prepared:
    """One object as a Replace or Upsert applies it, parsed but not yet stored: what the
    store makes of a raw object with its fixed configuration alone (`Preparer`). A source
    may prepare objects as it decodes them (kube/watch.py), so the raw tree of one object
    lives only while it is parsed: a list never holds them all at once, and an update
    waiting in the backlog waits parsed."""

    kind: ObjectKind
    key: tuple[str, str] | None  # (namespace, name) the Replace counts as listed
    value: ServiceInfo | SliceInfo | NodeInfo | None  # None: skipped, not ours, other Node
    by: Preparer
    warnings: tuple[str, ...] = ()
    problem: str | None = None  # fatal: the object is skipped
    label: str | None = None  # namespace/name for the problems (only with one)
    unproxied: tuple[str, str] | None = None  # a Service not ours: delete this one
    # A watch event's slice: its trigger-time annotation as sent, for when a newer version
    # replaces it while it waits (source/backlog.py; the store parses it as a raw one's).
    trigger: Any = None


@dataclass(frozen=True, slots=True)
class Preparer:
    """Parses raw objects as the store with this configuration does (pure)."""

    default_scheduler: str = "rr"
    node_name: str | None = None
    service_proxy_name: str | None = None  # --service-proxy-name

    @classmethod
    def for_node(cls, node: NodeContext) -> Preparer:
        """The one the engine's store uses with this node's configuration."""
        return cls(node.default_scheduler, node.node_name, node.service_proxy_name)

    def __call__(self, kind: ObjectKind, obj: Mapping[str, Any]) -> Prepared:
        return self.prepare(kind, obj, listed_key(obj))

    def event(self, kind: ObjectKind, obj: Mapping[str, Any]) -> Prepared:
        """A watch event's object: as listed, and a slice's trigger-time annotation kept
        (a raw waiting event's is read from it when a newer version replaces it)."""
        prepared = self.prepare(kind, obj, listed_key(obj))
        if kind is ObjectKind.ENDPOINT_SLICE:
            prepared.trigger = trigger_annotation(obj)
        return prepared

    def prepare(
        self, kind: ObjectKind, obj: Mapping[str, Any], key: tuple[str, str] | None
    ) -> Prepared:
        """As called, with the listed key given (None where no Replace reads it)."""
        try:
            if kind is ObjectKind.SERVICE:
                if not is_proxied(obj, self.service_proxy_name):
                    namespace, name = _name_of(obj)
                    return Prepared(
                        kind, key, None, self, unproxied=(namespace, name) if name else None
                    )
                parsed: Parsed[Any] | None = parse_service(obj, self.default_scheduler)
            elif kind is ObjectKind.ENDPOINT_SLICE:
                parsed = parse_endpoint_slice(obj)
            elif kind is ObjectKind.NODE:
                meta = obj.get("metadata") if isinstance(obj, Mapping) else None
                mine = isinstance(meta, Mapping) and meta.get("name") == self.node_name
                parsed = parse_node(obj) if mine else None
            else:
                parsed = None
        except InvalidObject as exc:
            return Prepared(kind, key, None, self, problem=str(exc), label=object_name(obj))
        except (TypeError, AttributeError, OverflowError, RecursionError) as exc:
            # A shape the converters did not foresee: still one object skipped, never a dead
            # loop (the fuzz test hunts these down; each found gets a proper check).
            return Prepared(
                kind, key, None, self, problem=f"malformed: {exc}", label=object_name(obj)
            )
        if parsed is None:
            return Prepared(kind, key, None, self)
        if not parsed.warnings:
            return Prepared(kind, key, parsed.value, self)
        return Prepared(kind, key, parsed.value, self, parsed.warnings, label=object_name(obj))


def _name_of(obj: Mapping[str, Any]) -> tuple[str, str | None]:
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str):
        return "", None
    namespace = meta.get("namespace") or "default"
    return (namespace if isinstance(namespace, str) else ""), meta["name"] or None


def listed_key(obj: Mapping[str, Any]) -> tuple[str, str] | None:
    """(namespace, name) as a Replace counts the object present and the backlog merges its
    updates by, None when unreadable."""
    # type() first: isinstance against the Mapping ABC costs ~0.5 us, and these are dicts
    meta = obj.get("metadata") if type(obj) is dict or isinstance(obj, Mapping) else None
    if (
        (type(meta) is dict or isinstance(meta, Mapping))
        and isinstance(meta.get("name"), str)
        and meta["name"]
    ):
        namespace = meta.get("namespace") or "default"
        if isinstance(namespace, str):  # else skipped as invalid
            return namespace, meta["name"]
    return None

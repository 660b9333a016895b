"""Manifest files as an object source: `ipvsctl plan -f` and `ipvsctl run --manifests DIR`.

Files are `*.yaml`, `*.yml`, `*.json`; multi-document YAML and `kind: List` (or any
`*List`) are unpacked. Following a folder costs O(the changed file): each file's objects
are remembered and a change emits only the upserts and deletes of that file. A file that
stops parsing keeps its last good objects in force (a typo must not delete Services).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ipvsctl.obs.logging import fields
from ipvsctl.source.events import (
    Delete,
    EventSink,
    ObjectKind,
    RawObject,
    Replace,
    SourceConfigError,
    Upsert,
)
from ipvsctl.source.safeyaml import MAX_BYTES, load_all_yaml, load_json

log = logging.getLogger("ipvsctl.manifests")

SUFFIXES = (".yaml", ".yml", ".json")
_KINDS = {k.value: k for k in ObjectKind}
STDIN = Path("-")  # `plan -f -`: YAML or JSON (a YAML subset) from standard input


class ManifestError(Exception):
    """A file that is not YAML/JSON; the message names the file and the parser's words."""


ObjectId = tuple[ObjectKind, str, str]  # kind, namespace, name


@dataclass(frozen=True, slots=True)
class FileObjects:
    objects: dict[ObjectId, RawObject]
    ignored: int  # documents of other kinds


def _documents(path: Path) -> Iterator[Any]:
    try:
        if path == STDIN:
            text = sys.stdin.read(MAX_BYTES + 1)
            if len(text) > MAX_BYTES:
                raise ManifestError(f"standard input: larger than {MAX_BYTES} bytes")
        else:
            if path.stat().st_size > MAX_BYTES:
                raise ManifestError(f"{path}: larger than {MAX_BYTES} bytes")
            text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ManifestError(f"{path}: cannot read: {exc}") from None
    try:
        if path.suffix == ".json":
            yield load_json(text)
        else:
            yield from load_all_yaml(text)
    except (ValueError, yaml.YAMLError, RecursionError) as exc:
        msg = " ".join(str(exc).split())
        name, fmt = ("standard input", "YAML") if path == STDIN else (path, path.suffix[1:].upper())
        raise ManifestError(f"{name}: not valid {fmt}: {msg}") from None


def _unpack(path: Path, doc: Any) -> Iterator[Any]:
    if isinstance(doc, dict) and str(doc.get("kind", "")).endswith("List") and "items" in doc:
        items = doc.get("items") or []
        if not isinstance(items, list):
            raise ManifestError(f"{path}: {doc.get('kind')}: items is not a list")
        for item in items:
            yield from _unpack(path, item)
    elif doc is not None:
        yield doc


def load_file(path: Path) -> FileObjects:
    """The Services, EndpointSlices and Nodes of one file. ManifestError if
    unparseable."""
    objects: dict[ObjectId, RawObject] = {}
    ignored = 0
    for doc in _documents(path):
        for obj in _unpack(path, doc):
            raw_kind = obj.get("kind") if isinstance(obj, dict) else None
            kind = _KINDS.get(raw_kind) if isinstance(raw_kind, str) else None
            if kind is None:
                ignored += 1
                continue
            meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
            ns = meta.get("namespace") or "default"
            # Objects without a usable name still go through, to be reported as invalid.
            objects[(kind, str(ns), str(meta.get("name") or f"<unnamed #{len(objects)}>"))] = obj
    return FileObjects(objects, ignored)


def manifest_files(paths: Iterable[str | Path]) -> list[Path]:
    """Files named, and manifest files inside folders named (recursively), sorted."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out.extend(sorted(f for f in p.rglob("*") if f.is_file() and f.suffix in SUFFIXES))
        elif p.exists() or p == STDIN:
            out.append(p)
        else:
            raise ManifestError(f"{p}: no such file or folder")
    return out


def load_paths(paths: Iterable[str | Path]) -> dict[ObjectKind, list[RawObject]]:
    """Every object in the paths, by kind (later files win on a duplicate name)."""
    merged: dict[ObjectId, RawObject] = {}
    for f in manifest_files(paths):
        merged.update(load_file(f).objects)
    by_kind: dict[ObjectKind, list[RawObject]] = {k: [] for k in ObjectKind}
    for (kind, _, _), obj in merged.items():
        by_kind[kind].append(obj)
    return by_kind


class ManifestSource:
    """Follows a folder by polling file stats (no extra dependency, works on any fs)."""

    emits_node = True  # the first events include a Replace of Nodes (EngineConfig)

    def __init__(self, folder: str | Path, interval: float = 1.0,
                 on_file_error: Callable[[], None] | None = None) -> None:
        self.folder = Path(folder)
        self.interval = interval
        self.on_file_error = on_file_error  # counts a file refused (a metric in the daemon)
        if not self.folder.is_dir():
            raise SourceConfigError(f"--manifests {folder}: not a readable folder")
        self._stats: dict[Path, tuple[float, int]] = {}
        self._files: dict[Path, dict[ObjectId, RawObject]] = {}

    def _scan(self) -> dict[Path, tuple[float, int]]:
        stats = {}
        for f in manifest_files([self.folder]):
            try:
                st = f.stat()
            except OSError:
                continue
            stats[f] = (st.st_mtime, st.st_size)
        return stats

    def _load(self, f: Path) -> dict[ObjectId, RawObject] | None:
        try:
            return load_file(f).objects
        except ManifestError as exc:
            log.error("manifest file unreadable, keeping its last good objects",
                      extra=fields(file=f, error=exc))
            if self.on_file_error is not None:
                self.on_file_error()
            return None

    def initial(self) -> list[Replace]:
        self._stats = self._scan()
        for f in self._stats:
            objs = self._load(f)
            self._files[f] = objs or {}
        now = time.monotonic()
        merged = self._merged()
        return [Replace(k, [o for (kk, _, _), o in merged.items() if kk is k], now)
                for k in (ObjectKind.NODE, ObjectKind.SERVICE,
                          ObjectKind.ENDPOINT_SLICE)]

    def _merged(self) -> dict[ObjectId, RawObject]:
        merged: dict[ObjectId, RawObject] = {}
        for f in sorted(self._files):
            merged.update(self._files[f])
        return merged

    def poll(self) -> list[Upsert | Delete]:
        """Events for files changed since the last call: O(changed files)."""
        stats = self._scan()
        changed = [f for f in stats if self._stats.get(f) != stats[f]]
        removed = [f for f in self._stats if f not in stats]
        self._stats = stats
        events: list[Upsert | Delete] = []
        now = time.monotonic()
        for f in sorted(changed) + sorted(removed):
            new = self._load(f) if f in stats else {}
            if new is None:
                continue
            old = self._files.get(f, {})
            self._files[f] = new
            if f not in stats:
                del self._files[f]
            for oid in sorted(old.keys() - new.keys()):
                if not self._defined_elsewhere(oid):
                    events.append(Delete(oid[0], oid[1], oid[2], now))
            for oid, obj in sorted(new.items()):
                if old.get(oid) != obj:
                    events.append(Upsert(oid[0], obj, now))
        return events

    def _defined_elsewhere(self, oid: ObjectId) -> bool:
        return any(oid in objs for objs in self._files.values())

    def run(self, sink: EventSink, stop: threading.Event) -> None:
        for event in self.initial():
            sink(event)
        while not stop.wait(self.interval):
            try:
                for event in self.poll():
                    sink(event)
            except OSError as exc:
                log.error("manifest folder unreadable", extra=fields(
                    folder=self.folder, error=exc))

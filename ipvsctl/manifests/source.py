"""Manifest files as an object source: `ipvsctl run --manifests DIR`.

Following a folder costs O(the changed file): each file's objects are remembered and a
change emits only the upserts and deletes of that file. A file that stops parsing keeps its
last good objects in force (a typo must not delete Services).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ipvsctl.manifests.files import ManifestError, ObjectId, load_file, manifest_files
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

log = logging.getLogger("ipvsctl.manifests")


class ManifestSource:
    """Follows a folder by polling file stats (no extra dependency, works on any fs)."""

    emits_node = True  # the first events include a Replace of Nodes (EngineConfig)

    def __init__(
        self,
        folder: str | Path,
        interval: float = 1.0,
        on_file_error: Callable[[], None] | None = None,
    ) -> None:
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
            log.error(
                "manifest file unreadable, keeping its last good objects",
                extra=fields(file=f, error=exc),
            )
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
        return [
            Replace(k, [o for (kk, _, _), o in merged.items() if kk is k], now)
            for k in (ObjectKind.NODE, ObjectKind.SERVICE, ObjectKind.ENDPOINT_SLICE)
        ]

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
        for replace in self.initial():
            sink(replace)
        while not stop.wait(self.interval):
            try:
                for change in self.poll():
                    sink(change)
            except OSError as exc:
                log.error("manifest folder unreadable", extra=fields(folder=self.folder, error=exc))

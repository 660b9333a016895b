"""The drain queue on disk: one JSON file in --state-dir, replaced atomically.

Write: a temporary file in the same folder, fsync, rename over the old one, fsync the
folder; a crash leaves either the old or the new file, never half of one. A file that does
not parse is set aside (renamed `*.corrupt-<time>`) and the queue is rebuilt from the kernel
by adoption: a bad file must never crash-loop the daemon.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterable
from pathlib import Path

from ipvsctl.model import DrainEntry
from ipvsctl.obs.logging import fields

log = logging.getLogger("ipvsctl.state")

FILE_NAME = "drain-queue.json"
FORMAT_VERSION = 1


class DrainStateFile:
    def __init__(self, state_dir: str | Path) -> None:
        self.dir = Path(state_dir)
        self.path = self.dir / FILE_NAME
        self.load_error: str | None = None  # why the last load found no usable file

    def ensure_dir(self) -> None:
        """OSError if the folder cannot be made or written (a fatal start-up error)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        if not os.access(self.dir, os.W_OK):
            raise PermissionError(f"{self.dir} is not writable")

    def load(self) -> list[DrainEntry]:
        try:
            raw = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        except OSError as exc:
            self.load_error = f"unreadable: {exc}"
            log.error("drain state unreadable, rebuilding the queue from the kernel",
                      extra=fields(path=self.path, error=exc))
            return []
        try:
            doc = json.loads(raw)
            if doc.get("version") != FORMAT_VERSION:
                raise ValueError(f"unknown version {doc.get('version')!r}")
            return [DrainEntry.from_json(e) for e in doc["entries"]]
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            aside = self.path.with_name(f"{FILE_NAME}.corrupt-{int(time.time())}")
            try:
                self.path.rename(aside)
            except OSError:
                aside = self.path
            self.load_error = f"corrupt: {exc}"
            log.error("drain state corrupt, set aside; rebuilding the queue from the kernel",
                      extra=fields(path=aside, error=exc))
            return []

    def save(self, entries: Iterable[DrainEntry]) -> None:
        """Atomic replace; raises OSError (the caller counts it and retries later)."""
        doc = {"version": FORMAT_VERSION, "entries": [e.to_json() for e in entries]}
        tmp = self.path.with_name(f".{FILE_NAME}.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(doc, f, separators=(",", ":"))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        dir_fd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

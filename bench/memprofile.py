"""Where the daemon's memory goes (`python -m bench.run host --parts memory --memory-trace`):
tracemalloc inside the daemon process (bench/daemon_proc.py `--tracemalloc`), started before
ipvsctl is imported, so every allocation since is counted.

Three readings: after the first list is in the kernel (`after_list`), at the highest traced
total seen while the watch events arrive (`peak`: polled every half second by the bench, a
reading whenever the total passed the last one's by `PEAK_STEP`), and at the end. Each
gives the traced total and tracemalloc's own peak since the reading before, the top
allocation sites by file and by line, and (after the list and at the end) the live objects
by type: every object the cyclic GC tracks, and the strings, ints, floats and bytes they
refer to, each counted once, by `sys.getsizeof` (dicts holding only such atoms are not
tracked by the GC and are missed: read `by_line` for those). Tracing slows the daemon
~3-5x, so its backlog runs deeper than untraced: read the shares, not the RSS, of a
traced run.
"""

from __future__ import annotations

import collections
import gc
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

PEAK_STEP = 4 << 20  # bytes above the last peak snapshot before another is taken
TOP = 25
_ROOT = str(Path(__file__).resolve().parents[1]) + "/"


def start() -> None:
    tracemalloc.start(1)


def _where(filename: str) -> str:
    """A path made short: repo-relative, or from site-packages / the stdlib's lib dir."""
    if filename.startswith(_ROOT):
        return filename[len(_ROOT) :]
    for marker in ("site-packages/", "/lib/python3"):
        i = filename.find(marker)
        if i >= 0:
            return filename[i + len(marker) :] if marker == "site-packages/" else filename[i + 1 :]
    return filename


def _stats(snapshot: tracemalloc.Snapshot, key: str) -> list[dict[str, Any]]:
    out = []
    for s in snapshot.statistics(key)[:TOP]:
        frame = s.traceback[0]
        where = _where(frame.filename) + (f":{frame.lineno}" if key == "lineno" else "")
        out.append({"where": where, "mb": round(s.size / 2**20, 2), "blocks": s.count})
    return out


def by_type() -> list[dict[str, Any]]:
    """Live objects by type: the GC's (frozen ones included) and the atoms they hold."""
    gc.unfreeze()  # frozen objects are in no generation gc.get_objects() walks
    try:
        objs = gc.get_objects()
        seen: set[int] = {id(o) for o in objs}
        count: collections.Counter[str] = collections.Counter()
        size: collections.Counter[str] = collections.Counter()
        atoms = (str, int, float, bytes)
        for o in objs:
            name = type(o).__name__
            count[name] += 1
            size[name] += sys.getsizeof(o)
            for r in gc.get_referents(o):
                if type(r) in atoms and id(r) not in seen:
                    seen.add(id(r))
                    rn = type(r).__name__
                    count[rn] += 1
                    size[rn] += sys.getsizeof(r)
        del objs, seen
    finally:
        gc.freeze()
    return [
        {"type": t, "mb": round(b / 2**20, 2), "objects": count[t]}
        for t, b in size.most_common(TOP)
    ]


def reading(types: bool = True) -> dict[str, Any]:
    current, peak = tracemalloc.get_traced_memory()
    snapshot = tracemalloc.take_snapshot()
    doc: dict[str, Any] = {
        "traced_mb": round(current / 2**20, 1),
        "traced_peak_mb": round(peak / 2**20, 1),
        "by_file": _stats(snapshot, "filename"),
        "by_line": _stats(snapshot, "lineno"),
    }
    del snapshot
    if types:
        doc["by_type"] = by_type()
    tracemalloc.reset_peak()  # the next reading's peak is its own, not this one's walk
    return doc


class PeakWatcher:
    """Snapshots the traced total's new highs (from `arm` on), each time `poll` is called
    (the bench calls it every half second while the events arrive, on the HTTP thread)."""

    def __init__(self, backlog: Any = None) -> None:
        self.backlog = backlog  # () -> events waiting for the loop
        self.best: int | None = None
        self.peak: dict[str, Any] | None = None

    def arm(self) -> None:
        self.best = tracemalloc.get_traced_memory()[0]

    def poll(self) -> int:
        """The traced total now (bytes); a reading is taken when it is a new high."""
        current = tracemalloc.get_traced_memory()[0]
        if self.best is not None and current > self.best + PEAK_STEP:
            self.best = current
            doc = reading(types=False)
            doc["at"] = time.monotonic()
            if self.backlog is not None:
                doc["backlog_events"] = self.backlog()
            self.peak = doc
        return current

    def take(self) -> dict[str, Any] | None:
        return self.peak

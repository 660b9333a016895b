"""The daemon's /status document, cheap enough to serve at 100,000 endpoints.

Building the whole document under the loop lock held it for 0.25-0.4 s at 10,000 Services
and grew the daemon by ~150 MB per caller (every dict, then the indented JSON string).
Instead:
- the loop lock is taken once for the list of Services, then once per `batch` Services to
  turn their applied state into JSON values (a fraction of a millisecond each); encoding and
  compression happen outside it, and the renderer sleeps a little between batches so the
  loop thread gets the GIL at once when an event comes;
- the document is kept compressed (zlib: a few MB at 100,000 endpoints) and shared: callers
  that come while it is rendered wait for that rendering, callers within `max_age` of it
  get it again (`max_age` is the larger of 1 s and four times the rendering's own time, so
  polling clients cannot keep a CPU busy: at 100,000 endpoints a rendering is a few
  seconds old at most);
- each caller gets the JSON decompressed chunk by chunk as it is sent (chunked encoding),
  one caller at a time and at most one a second.
Each Service's part is consistent; the document as a whole is not one instant (Services
changed during the rendering show their state when their batch was read).
"""

from __future__ import annotations

import json
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

from ipvsctl.daemon.status_json import drain_json, service_status, table_json
from ipvsctl.reconcile.view import EngineView

_ENCODE = json.JSONEncoder(separators=(",", ":")).encode


class StatusDocument:
    def __init__(
        self,
        view: EngineView,
        lock: AbstractContextManager[Any],
        *,
        batch: int = 20,
        pause: float = 0.0003,
        min_age: float = 1.0,
        age_factor: float = 4.0,
        min_gap: float = 1.0,
        on_render: Callable[[float], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.view = view
        self.lock = lock
        self.batch = batch
        self.pause = pause
        self.min_age = min_age
        self.age_factor = age_factor  # rendering uses at most ~1/(1+age_factor) of a CPU
        self.min_gap = min_gap
        self._last_sent = -min_gap
        self.on_render = on_render
        self.clock = clock
        self._cond = threading.Condition()
        self._sending = threading.Lock()
        self._rendering = False
        self._doc: list[bytes] | None = None  # compressed pieces
        self._expires = 0.0
        self.renders = 0

    # --- the route --------------------------------------------------------------------------
    def handler(self, q: dict[str, list[str]]) -> tuple[int, str, Iterator[bytes]]:
        return 200, "application/json", self._inflate(self.current())

    def _inflate(self, pieces: list[bytes]) -> Iterator[bytes]:
        # One response streamed at a time, and at most one started every `min_gap`
        # seconds (the others wait their turn, asleep): however many callers poll, and
        # however small the table, /status takes a bounded share of the daemon's CPU.
        with self._sending:
            wait = self._last_sent + self.min_gap - self.clock()
            if wait > 0:
                time.sleep(wait)
            try:
                d = zlib.decompressobj()
                for piece in pieces:
                    if out := d.decompress(piece):
                        yield out
                if out := d.flush():
                    yield out
            finally:
                self._last_sent = self.clock()

    def current(self) -> list[bytes]:
        """The shared compressed document: a fresh rendering, the one under way, or the last
        one while it is younger than its max age."""
        with self._cond:
            while True:
                if self._doc is not None and self.clock() < self._expires:
                    return self._doc
                if not self._rendering:
                    self._rendering = True
                    break
                self._cond.wait()
        doc: list[bytes] | None = None
        started = self.clock()
        try:
            doc = self.render()
        finally:
            took = self.clock() - started
            with self._cond:
                self._rendering = False
                if doc is not None:
                    self._doc = doc
                    self._expires = self.clock() + max(self.min_age, self.age_factor * took)
                    self.renders += 1
                self._cond.notify_all()
        if self.on_render is not None:
            self.on_render(took)
        return doc

    # --- rendering --------------------------------------------------------------------------
    def render(self) -> list[bytes]:
        view = self.view
        z = zlib.compressobj(1)
        out: list[bytes] = []

        def put(text: str) -> None:
            if piece := z.compress(text.encode()):
                out.append(piece)

        with self.lock:
            now = view.wall()
            refs = view.services()
            head = {"node": view.node.node_name, "ready": view.started}
        refs.sort()
        put(_ENCODE(head)[:-1] + ',"virtual_servers":[')
        first = True
        for i in range(0, len(refs), self.batch):
            with self.lock:
                vss = [
                    vs for ref in refs[i : i + self.batch] for vs in service_status(view, ref, now)
                ]
            if vss:
                put(("" if first else ",") + ",".join(map(_ENCODE, vss)))
                first = False
            out.append(z.flush(zlib.Z_SYNC_FLUSH))  # a piece per batch: bounded inflation
            time.sleep(self.pause)  # let the loop thread take the GIL between batches
        with self.lock:
            queue = view.drain_queue()  # frozen entries
            table = table_json(view)
        put('],"drain_queue":[')
        for i in range(0, len(queue), self.batch * 10):
            part = queue[i : i + self.batch * 10]
            put(("," if i else "") + ",".join(_ENCODE(drain_json(x, now)) for x in part))
            out.append(z.flush(zlib.Z_SYNC_FLUSH))
        put("]," + _ENCODE(table)[1:] + "\n")
        out.append(z.flush())
        return [p for p in out if p]

"""The daemon's /metrics: one rendering shared by the scrapes that come together.

Rendered per request on the HTTP workers, /metrics let 64 scraping connections (within the
per-peer bounds, 200 Services opted in to per-Service series) keep the kubelet's /healthz
waiting 12-16 s behind them. Now:
- a scrape is answered with the rendering under way when it arrives, or else with the next
  one: never with one finished before it came, so a value changed before a scrape is in
  its answer, and scrapes that come together share one rendering;
- renderings run one at a time on their own thread (`run`), at most one every
  max(`min_gap`, `gap_factor` x the last one's time) seconds: however many scrape, and
  however large the table, rendering takes a bounded share of one CPU (at most
  1/(1 + gap_factor) of it);
- a scrape waits parked in the HTTP server (no thread held); one still waiting after
  `wait_timeout` (a rendering stuck on a kernel read) gets 503. Health probes are answered
  by the server's selector thread, never behind any of this (httpd/server.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from ipvsctl.httpd import Park, Response
from ipvsctl.obs.logging import FailureStreaks, fields

log = logging.getLogger("ipvsctl.metrics")

MIN_GAP = 1.0  # seconds between the end of a rendering and the start of the next, at least
GAP_FACTOR = 4.0  # ... and at least this many times the last rendering's own time
WAIT_TIMEOUT = 10.0  # a scrape's longest wait (Prometheus's default scrape_timeout)


class MetricsDocument:
    def __init__(
        self,
        render: Callable[[], bytes],
        content_type: str,
        *,
        min_gap: float = MIN_GAP,
        gap_factor: float = GAP_FACTOR,
        wait_timeout: float = WAIT_TIMEOUT,
        on_render: Callable[[float], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.render = render
        self.content_type = content_type
        self.min_gap = min_gap
        self.gap_factor = gap_factor
        self.wait_timeout = wait_timeout
        self.on_render = on_render
        self.clock = clock
        # Called after each rendering (the HTTP server's wake: parked scrapes are polled).
        self.listeners: list[Callable[[], None]] = []
        self._cond = threading.Condition()
        self._done = 0  # the last rendering finished (0: none yet)
        self._rendering: int | None = None  # the one under way
        self._wanted = 0  # the newest rendering a waiting scrape needs
        self._answer: Response | None = None  # the last rendering's answer
        self._next_at = 0.0  # the next rendering starts no sooner
        self._failing = FailureStreaks(log)
        self.renders = 0

    # --- the route (the HTTP server's selector thread: never blocks) -------------------------
    def handler(self, q: dict[str, list[str]]) -> Park:
        with self._cond:
            want = self._rendering if self._rendering is not None else self._done + 1
            if want > self._wanted:
                self._wanted = want
                self._cond.notify_all()
        return Park(_Scrape(self, want, self.clock() + self.wait_timeout))

    def _poll(self, want: int, deadline: float) -> Response | None:
        with self._cond:
            if self._done >= want and self._answer is not None:
                return self._answer
        if self.clock() >= deadline:
            return Response(503, "text/plain; charset=utf-8", b"metrics not rendered in time\n")
        return None

    # --- the renderer thread ----------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        """Render whenever a scrape waits, paced; until `stop` (checked every 0.5 s)."""
        while not stop.is_set():
            with self._cond:
                if not self._cond.wait_for(lambda: self._wanted > self._done, 0.5):
                    continue
                wait = self._next_at - self.clock()
            if wait > 0 and stop.wait(wait):
                return
            self.render_once()

    def render_once(self) -> None:
        with self._cond:
            generation = self._rendering = self._done + 1
        started = self.clock()
        try:
            answer = Response(200, self.content_type, self.render())
            self._failing.recovered("metrics rendering works again")
        except Exception as exc:  # a collector's bug: this scrape fails, the next tries again
            self._failing.failed(logging.ERROR, "metrics rendering failed", error=repr(exc))
            log.debug("metrics rendering failed", exc_info=True)
            answer = Response(500, "text/plain; charset=utf-8", b"metrics rendering failed\n")
        took = self.clock() - started
        if took > self.wait_timeout:  # its scrapes got 503: say why once it is known
            log.warning("metrics rendering slow", extra=fields(seconds=round(took, 1)))
        with self._cond:
            self._done, self._rendering = generation, None
            self._answer = answer
            self._next_at = self.clock() + max(self.min_gap, self.gap_factor * took)
            self.renders += 1
        if self.on_render is not None:
            self.on_render(took)
        for wake in self.listeners:
            wake()


class _Scrape:
    """A parked GET /metrics (`ipvsctl.httpd.Waiter`)."""

    __slots__ = ("_deadline", "doc", "want")

    def __init__(self, doc: MetricsDocument, want: int, deadline: float) -> None:
        self.doc, self.want, self._deadline = doc, want, deadline

    @property
    def deadline(self) -> float:
        return self._deadline

    def poll(self, now: float) -> Response | None:
        return self.doc._poll(self.want, self._deadline)

    def cancel(self) -> None:
        """Nothing to undo: a rendering nobody waits for any more is wasted once."""

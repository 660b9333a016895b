"""List-then-watch of one resource (a reflector, as client-go and kopf do it).

    list (paginated) -> Replace -> watch from the list's resourceVersion -> Upsert/Delete ...
    stream ended cleanly (server timeout)  -> watch again from the last resourceVersion
    410 Gone (ERROR event or HTTP 410)     -> relist -> Replace (the engine diffs it)
    read timeout / reset / other error     -> backoff, relist -> Replace

The resourceVersion is taken from every event, bookmarks included, so a re-watch after a
quiet period does not replay or expire. Raw JSON is read (`_preload_content=False`) and
trimmed at once: deserialising into the generated models is slow and heavy at this scale.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import random
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import ReadTimeoutError

from ipvsctl.kube.backoff import Backoff
from ipvsctl.kube.logs import describe, log
from ipvsctl.kube.settings import KubeSettings
from ipvsctl.source.events import Delete, ObjectKind, RawObject, Replace, SourceEvent, Upsert

ListFunc = Callable[..., Any]  # a generated `list_*_for_all_namespaces` method
WatchRestartCallback = Callable[[str, str], None]  # (resource, reason)

# Reasons for a watch restart (the `reason` label of ipvsctl_watch_restarts_total).
CLOSED = "closed"  # the stream ended cleanly (server timeout): re-watch, no relist
EXPIRED = "expired"  # 410 Gone: relist
TIMEOUT = "timeout"  # no data within the read timeout (half-open connection): relist
ERROR = "error"  # connection refused/reset, HTTP error, bad data: relist


class WatchExpired(Exception):
    """The watched resourceVersion is too old (410)."""


class WatchStatusError(Exception):
    """An ERROR event other than 410."""


class _Stopped(Exception):
    pass


_gc_lock = threading.Lock()
_gc_holders = 0
_gc_was_enabled = False


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector during a list. Decoding allocates hundreds of
    thousands of containers, and as the trimmed objects accumulate the generational GC
    re-scans the growing heap over and over (measured: 10,000 slices of 10 endpoints listed
    in 1.9 s with it, 1.25 s without). Reference counting still frees everything acyclic;
    the pause ends with the list (each page is bounded by its read timeout). Nested and
    concurrent uses (two reflectors) are counted; it only re-enables what it disabled."""
    global _gc_holders, _gc_was_enabled
    with _gc_lock:
        if _gc_holders == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_holders += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_holders -= 1
            if _gc_holders == 0 and _gc_was_enabled:
                gc.enable()


def _shutdown(resp: Any) -> None:
    """Unblock a thread reading `resp` (a urllib3 response) from another thread."""
    sock = getattr(getattr(resp, "connection", None), "sock", None)
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def iter_lines(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """Split a watch stream into its non-empty lines (one JSON event each)."""
    rest = b""
    for chunk in chunks:
        if not chunk:
            continue
        if rest:
            chunk = rest + chunk
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            line = chunk[start:end]
            start = end + 1
            if line.strip():
                yield line
        rest = chunk[start:]
    if rest.strip():
        yield rest


class Reflector:
    """Keeps one resource (all namespaces) flowing into `emit` until `halt` is set."""

    def __init__(
        self,
        *,
        kind: ObjectKind,
        resource: str,
        list_func: ListFunc,
        trim: Callable[[Mapping[str, Any]], RawObject],
        emit: Callable[[SourceEvent], None],
        settings: KubeSettings,
        on_restart: WatchRestartCallback | None = None,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.kind = kind
        self.resource = resource
        self._list_func = list_func
        self._trim = trim
        self._emit = emit
        self._settings = settings
        self._on_restart = on_restart
        self._clock = clock
        self._rng = rng or random.Random()
        self._resp_lock = threading.Lock()
        self._resp: Any = None
        self.resource_version: str | None = None
        self._delivered = False  # the current watch has delivered an event (bookmarks count)
        self.lists = 0  # completed lists (each emitted one Replace)

    # ---- the loop -----------------------------------------------------------------------

    def run(self, halt: threading.Event) -> None:
        s = self._settings
        backoff = Backoff(s.backoff_initial, s.backoff_max, rng=self._rng)
        need_list = True
        while not halt.is_set():
            started = self._clock()
            self._delivered = False
            watching = False  # the list (if any) worked and a watch was opened
            error: BaseException | None = None
            try:
                if need_list:
                    with gc_paused():
                        objects, rv = self._list(halt)
                    self.resource_version = rv
                    self.lists += 1
                    self._emit(Replace(self.kind, objects, self._clock()))
                    del objects
                    need_list = False
                    log(logging.DEBUG, "list complete", resource=self.resource, resource_version=rv)
                started = self._clock()
                watching = True
                self._watch(halt)
                reason = CLOSED
            except _Stopped:
                return
            except WatchExpired as exc:
                reason, error = EXPIRED, exc
            except ApiException as exc:
                reason, error = (EXPIRED if exc.status == 410 else ERROR), exc
            except (ReadTimeoutError, TimeoutError) as exc:
                reason, error = TIMEOUT, exc
            except Exception as exc:  # connection errors, bad JSON, a failing sink: relist
                reason, error = ERROR, exc
            if halt.is_set():
                return
            healthy = watching and (
                self._delivered or self._clock() - started >= s.healthy_watch_seconds)
            if healthy:
                # Only a watch that worked resets the backoff: a server that lists fine
                # but breaks every watch must not make us relist 10,000 Services in a loop.
                backoff.reset()
            delay = 0.0 if reason in (CLOSED, EXPIRED) and healthy else backoff.next()
            need_list = need_list or reason != CLOSED
            self._restarted(reason, delay, need_list, error)
            if delay > 0 and halt.wait(delay):
                return

    def _restarted(
        self, reason: str, delay: float, relist: bool, error: BaseException | None
    ) -> None:
        # A clean end is routine (every few minutes); 410 is expected now and then.
        level = {CLOSED: logging.DEBUG, EXPIRED: logging.INFO}.get(reason, logging.WARNING)
        fields: dict[str, object] = {
            "resource": self.resource,
            "reason": reason,
            "backoff": round(delay, 3),
            "relist": relist,
        }
        if error is not None:
            fields["error"] = describe(error)
        log(level, "watch restart", **fields)
        if self._on_restart is not None:
            try:
                self._on_restart(self.resource, reason)
            except Exception as exc:  # a metrics hook must never stop the watch
                log(logging.ERROR, "watch restart callback failed", error=describe(exc))

    def interrupt(self) -> None:
        """Break the request in flight, if any (called from another thread on stop)."""
        with self._resp_lock:
            resp = self._resp
        if resp is not None:
            _shutdown(resp)

    # ---- requests -----------------------------------------------------------------------

    def _open(self, halt: threading.Event, **kwargs: Any) -> Any:
        resp = self._list_func(_preload_content=False, **kwargs)
        with self._resp_lock:
            self._resp = resp
        if halt.is_set():  # stop came while the request was being sent
            self._release(resp, clean=False)
            raise _Stopped
        return resp

    def _release(self, resp: Any, *, clean: bool) -> None:
        with self._resp_lock:
            if self._resp is resp:
                self._resp = None
        if not clean:
            # Unread data must not go back to the pool with the connection.
            resp.close()
        resp.release_conn()

    def _list(self, halt: threading.Event) -> tuple[list[RawObject], str]:
        s = self._settings
        objects: list[RawObject] = []
        token: str | None = None
        rv: str | None = None
        trim = self._trim
        while True:
            kwargs: dict[str, Any] = {
                "limit": s.page_size,
                "_request_timeout": (s.connect_timeout, s.list_read_timeout),
            }
            if token:
                kwargs["_continue"] = token
            resp = self._open(halt, **kwargs)
            clean = False
            try:
                body = resp.data
                clean = True
            finally:
                self._release(resp, clean=clean)
            page = json.loads(body)
            del body
            if not isinstance(page, dict):
                raise ValueError("list response is not a JSON object")
            items = page.get("items") or ()
            objects.extend(trim(item) for item in items if isinstance(item, dict))
            meta = page.get("metadata") or {}
            rv = meta.get("resourceVersion") or rv
            token = meta.get("continue") or None
            del page
            if not token:
                break
            if halt.is_set():
                raise _Stopped
        if not rv:
            raise ValueError("list response has no metadata.resourceVersion")
        return objects, rv

    def _watch(self, halt: threading.Event) -> None:
        """Watch from `resource_version` until the stream ends cleanly; raises on 410,
        errors and timeouts."""
        s = self._settings
        timeout_seconds = max(1, int(s.watch_timeout * (1.0 + self._rng.random())))
        read_timeout = s.watch_read_timeout or timeout_seconds + s.read_slack
        resp = self._open(
            halt,
            watch=True,
            resource_version=self.resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=timeout_seconds,
            _request_timeout=(s.connect_timeout, read_timeout),
        )
        clean = False
        try:
            for line in iter_lines(resp.stream(None, decode_content=False)):
                received = self._clock()
                if halt.is_set():
                    raise _Stopped
                event = json.loads(line)
                self._delivered = True
                self._handle(event, received)
            clean = True
        finally:
            self._release(resp, clean=clean)

    def _handle(self, event: Any, received: float) -> None:
        if not isinstance(event, dict) or not isinstance(event.get("object"), dict):
            raise ValueError("watch event without an object")
        type_ = event.get("type")
        obj: dict[str, Any] = event["object"]
        if type_ == "ERROR":
            code = obj.get("code")
            message = f"{code} {obj.get('reason')}: {obj.get('message')}"
            if code == 410:
                raise WatchExpired(message)
            raise WatchStatusError(message)
        meta = obj.get("metadata") or {}
        if type_ in ("ADDED", "MODIFIED"):
            self._emit(Upsert(self.kind, self._trim(obj), received))
        elif type_ == "DELETED":
            if meta.get("name"):
                self._emit(
                    Delete(self.kind, meta.get("namespace") or "default", meta["name"], received)
                )
        elif type_ != "BOOKMARK":
            log(logging.DEBUG, "unknown watch event ignored", resource=self.resource, type=type_)
        rv = meta.get("resourceVersion")
        if rv:
            self.resource_version = rv

"""List-then-watch of one resource (a reflector, as client-go and kopf do it).

    list (from the watch cache) -> Replace -> watch from its resourceVersion -> Upsert/Delete
    stream ended cleanly (server timeout)  -> watch again from the last resourceVersion
    410 Gone (ERROR event or HTTP 410)     -> relist -> Replace (the engine diffs it); at once
                                              the first time, with backoff if it repeats
    read timeout / reset / refused / 5xx   -> backoff, watch again from the last
                                              resourceVersion (410 there: relist)
    bad data, other errors                 -> backoff, relist -> Replace

Backoff as client-go's reflector: only a watch that made progress (delivered an object or a
bookmark, or lasted `healthy_watch_seconds`) resets it; an ERROR event is no progress. While
backed off, a shared probe (`/readyz`, readable by everyone) notices the server's return, so
a node catches up within seconds of an outage instead of after its grown backoff
(`_pause`). Lists are served from the API server's watch cache (`resourceVersion=0`, as
client-go does), not from etcd: see `_list` for what that means for time going backwards.

The resourceVersion is taken from every event, bookmarks included, so a re-watch after a
quiet period does not replay or expire. Raw JSON is read (`kube.listwatch`) and
trimmed at once (decode.py): deserialising into the generated models is slow and heavy at
this scale. What to do after a watch ends (wait how, relist or not) is `retry.py`'s pure
rule; this module does the requests and the waiting.

What cannot be read is skipped, never the whole list or the watch: a list item that is not
an object, is nested too deeply to decode, or that trimming or preparing raises on; a watch
event (ADDED, MODIFIED, DELETED) whose object cannot be read. Each is counted
(`on_invalid`, ipvsctl_invalid_objects_total{kind}) and the first of a streak logged; the
last good version of the object stays in force. A body or watch line that is not JSON at
all is a failed request, as before. Attempts that fail in a row (`degraded_after`, a few
backoff periods, with no working watch between) are said through `on_health` (the `source`
degraded condition), and cleared once a watch has worked `healthy_watch_seconds`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError, ReadTimeoutError

from ipvsctl.kube.backoff import BackoffManager
from ipvsctl.kube.decode import decode_list, iter_lines
from ipvsctl.kube.logs import LOGGER, describe, log
from ipvsctl.kube.retry import CLOSED, ERROR, EXPIRED, SUSPECT, TIMEOUT, Wait, decide_retry
from ipvsctl.kube.settings import KubeSettings
from ipvsctl.obs import gcpause
from ipvsctl.obs.logging import FailureStreaks
from ipvsctl.source.convert import object_name
from ipvsctl.source.events import (
    Delete,
    ObjectKind,
    PreparedReplace,
    PreparedUpsert,
    RawObject,
    Replace,
    SourceEvent,
    Upsert,
)
from ipvsctl.source.prepare import Prepared

# A list or watch request returning the raw response (`kube.listwatch.ListWatch`; it takes
# the keyword arguments of the generated `list_*_for_all_namespaces` methods)
ListFunc = Callable[..., Any]
WatchRestartCallback = Callable[[str, str], None]  # (resource, reason)
InvalidObjectCallback = Callable[[str], None]  # (kind): one unreadable object skipped
# (resource, why its lists or watches keep failing; None: they work again)
HealthCallback = Callable[[str, str | None], None]
# Told True when a watch is open (its response came, after any list), False when the
# stream is broken or not yet open (at start, at every restart): a consumer can tell time
# the stream was up from time it was not (the pod_gone grace, reconcile/termination.py).
WatchingCallback = Callable[[bool], None]


# A list that must not be applied (its objects raw, or as `prepare` made them): returns a
# short reason, or None when the list is fine.
ListCheck = Callable[[Replace | PreparedReplace], str | None]
# What a list keeps of each trimmed object in place of it (the store's `Preparer`, bound
# to the kind): parsed where it is decoded, so a list never holds every raw object at once.
Prepare = Callable[[RawObject], Prepared]
# Is the API server answering again? (a cheap request; see kube.probe)
Probe = Callable[[], bool]


class WatchExpired(Exception):
    """The watched resourceVersion is too old (410)."""


class WatchStatusError(Exception):
    """An ERROR event other than 410."""

    def __init__(self, message: str, code: object = None, retry_after: float | None = None):
        super().__init__(message)
        self.code = code
        self.retry_after = retry_after  # the Status's details.retryAfterSeconds


def retry_after(exc: BaseException) -> float | None:
    """The seconds a 429 or 503 asks us to wait (`Retry-After`, as API Priority and Fairness
    sends it; an ERROR event's `details.retryAfterSeconds`), or None."""
    if isinstance(exc, WatchStatusError):
        return exc.retry_after if exc.code in (429, 503) else None
    if not isinstance(exc, ApiException) or exc.status not in (429, 503):
        return None
    value = (exc.headers or {}).get("Retry-After")
    try:  # seconds only: the HTTP-date form is not what the API server sends
        seconds = float(str(value).strip())
    except ValueError:
        return None
    return seconds if 0 <= seconds < float("inf") else None


class WatchListUnavailable(Exception):
    """The server does not offer WatchList (rejected it, or sent no initial-events-end)."""


INITIAL_EVENTS_END = "k8s.io/initial-events-end"


class SuspectList(Exception):
    """A list that `check` refused (the table is kept; retried with backoff)."""


def _transient(exc: BaseException) -> bool:
    """An error of the connection or of an overloaded/restarting server, after which the
    watch can resume from the last resourceVersion: no relist, so an outage shorter than the
    server's watch history costs each node one watch, not a list of everything."""
    if isinstance(exc, ApiException):
        return exc.status in (429, 500, 502, 503, 504)
    if isinstance(exc, WatchStatusError):
        return exc.code in (429, 500, 502, 503, 504)
    return isinstance(exc, (HTTPError, OSError, TimeoutError))


def _unreachable(exc: BaseException) -> bool:
    """No HTTP answer at all (refused, reset, timed out): the server may be down."""
    return isinstance(exc, (HTTPError, OSError, TimeoutError)) and not isinstance(exc, ApiException)


class _Stopped(Exception):
    pass


def _shutdown(resp: Any) -> None:
    """Unblock a thread reading `resp` (a urllib3 response) from another thread."""
    sock = getattr(getattr(resp, "connection", None), "sock", None)
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


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
        prepare: Prepare | None = None,
        prepare_event: Prepare | None = None,
        settings: KubeSettings,
        on_restart: WatchRestartCallback | None = None,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        check: ListCheck | None = None,
        probe: Probe | None = None,
        cluster_nodes: Callable[[], int] | None = None,
        wait: Callable[[threading.Event, float], bool] | None = None,
        on_invalid: InvalidObjectCallback | None = None,
        on_health: HealthCallback | None = None,
        on_watching: WatchingCallback | None = None,
    ) -> None:
        self.kind = kind
        self.resource = resource
        self._list_func = list_func
        self._trim = trim
        # A listed object: trimmed, and prepared when there is a `prepare` (then a Replace
        # carries what it made). A watch event's object likewise with `prepare_event`: a
        # parsed slice waiting in the backlog is ~1 KB where the trimmed raw one is ~7 KB.
        # None for an object that raised there: skipped and counted.
        self._load = self._guarded(trim, prepare)
        self._load_event = self._guarded(trim, prepare_event)
        # The events at the stage their objects are at (source/events.py)
        self._replace: type[Replace] | type[PreparedReplace] = (
            Replace if prepare is None else PreparedReplace
        )
        self._upsert: type[Upsert] | type[PreparedUpsert] = (
            Upsert if prepare_event is None else PreparedUpsert
        )
        self._emit = emit
        self._settings = settings
        self._on_restart = on_restart
        self._on_watching = on_watching
        self._watching: bool | None = None  # as last told (None: not yet)
        self._clock = clock
        self._rng = rng or random.Random()
        self._check = check
        self._probe = probe
        self._cluster_nodes = cluster_nodes
        # How the reflector waits: `halt.wait` (tests pass one that moves a fake clock).
        self._wait = wait or (lambda halt, seconds: halt.wait(seconds))
        self._resp_lock = threading.Lock()
        self._resp: Any = None
        self.resource_version: str | None = None
        self._opened = False
        self._rv_unavailable = False  # the last relist at our resourceVersion failed
        self._suspect = FailureStreaks(LOGGER)  # lists refused by `check`
        self._on_invalid = on_invalid
        self._on_health = on_health
        self._unreadable = FailureStreaks(LOGGER)  # objects skipped as unreadable
        self.skipped = 0  # unreadable objects skipped, all told
        # Attempts (list and watch) that failed in a row, with no working watch between;
        # `_health_gen` tells a timer whether the watch it was started for still runs.
        self._health_lock = threading.Lock()
        self._failures = 0
        self._degraded = False
        self._health_gen = 0
        self._watch_list = settings.watch_list  # cleared for good when the server lacks it
        self.lists = 0  # completed lists (each emitted one Replace)

    # ---- the loop -----------------------------------------------------------------------

    def run(self, halt: threading.Event) -> None:
        s = self._settings
        backoff = BackoffManager(
            s.backoff_initial,
            s.backoff_max,
            s.backoff_reset,
            jitter=s.backoff_jitter,
            clock=self._clock,
            rng=self._rng,
        )
        need_list = True
        last_list: float | None = None  # when the last list started
        expired_streak = 0  # 410s in a row without progress: only the first relists at once
        shortcut_used = False  # the probe ended a pause early since the last progress
        self._tell_watching(False)  # not until the first watch is open
        while not halt.is_set():
            started = self._clock()
            self._opened = False  # the watch request got a response
            error: BaseException | None = None
            try:
                if need_list:
                    last_list = self._clock()
                    self._relist(halt)
                    need_list = False
                started = self._clock()
                self._watch(halt)
                reason = CLOSED
            except _Stopped:
                return
            except SuspectList as exc:
                reason, error = SUSPECT, exc
            except WatchExpired as exc:
                reason, error = EXPIRED, exc
            except ApiException as exc:
                reason, error = (EXPIRED if exc.status == 410 else ERROR), exc
            except (ReadTimeoutError, TimeoutError) as exc:
                reason, error = TIMEOUT, exc
            except Exception as exc:  # connection errors, bad JSON, a failing sink
                reason, error = ERROR, exc
            if halt.is_set():
                return
            self._tell_watching(False)
            # As client-go: what a watch delivered before it failed is no sign of health
            # (a bookmark then a 410, 30,851 lists in 3 s); only time is.
            progress = self._opened and self._clock() - started >= s.healthy_watch_seconds
            retry = decide_retry(
                reason,
                progress=progress,
                expired_streak=expired_streak,
                backed_off=backoff.recent(),
                transient=error is not None and _transient(error),
                have_version=bool(self.resource_version),
            )
            if progress:
                shortcut_used = False
            self._attempt_ended(progress, reason, error)
            expired_streak = retry.expired_streak
            delay = (
                0.0
                if retry.wait is Wait.NOW
                else self._herd_spread()
                if retry.wait is Wait.HERD
                else backoff.next()
            )
            asked = retry_after(error) if error is not None else None
            if asked is not None:  # APF's answer: wait at least that (not for ever)
                delay = max(delay, min(asked, s.backoff_max))
            need_list = need_list or retry.relist
            if need_list and last_list is not None:  # never two lists within the initial step
                delay = max(delay, last_list + s.backoff_initial - self._clock())
            self._restarted(reason, delay, need_list, error)
            if delay <= 0:
                continue
            # The probe may end this pause early once per outage on its own word, and after
            # that only when it saw the server down itself: a server whose /readyz answers
            # while our requests fail is retried at the backoff's pace, not the probe's.
            armed = not shortcut_used and error is not None and _unreachable(error)
            stopped, shortcut = self._pause(halt, delay, armed, need_list)
            if stopped:
                return
            shortcut_used = shortcut_used or shortcut

    def _relist(self, halt: threading.Event) -> None:
        skipped = self.skipped
        # Decoding allocates hundreds of thousands of containers, and as the trimmed objects
        # accumulate the generational GC re-scans the growing heap over and over (measured:
        # 10,000 slices of 10 endpoints listed in 1.9 s with it, 1.25 s without). Reference
        # counting still frees everything acyclic; the pause ends with the list (each page
        # is bounded by its read timeout).
        with gcpause.paused():
            objects, rv = self._list_or_stream(halt)
        skipped = self.skipped - skipped
        replace = self._replace(self.kind, objects, self._clock())
        del objects
        problem = self._check(replace) if self._check is not None else None
        if problem is not None:
            del replace
            self._suspect.failed(
                logging.WARNING, "list refused, table kept", resource=self.resource, problem=problem
            )
            raise SuspectList(problem)
        self._suspect.recovered("list accepted again", resource=self.resource)
        if not skipped:
            self._unreadable.recovered("every object readable again", resource=self.resource)
        self.resource_version = rv
        self.lists += 1
        self._emit(replace)
        del replace
        log(
            logging.DEBUG,
            "list complete",
            resource=self.resource,
            resource_version=rv,
            skipped=skipped,
        )

    def _herd_spread(self) -> float:
        """A random 0..relist_spread_per_node x (nodes seen in EndpointSlices): at 5,000
        nodes and 0.02 s, relists after a long outage spread over ~100 s (~50 lists/s)."""
        nodes = self._cluster_nodes() if self._cluster_nodes is not None else 0
        return self._settings.relist_spread_per_node * nodes * self._rng.random()

    def _pause(
        self, halt: threading.Event, delay: float, armed: bool, relist: bool = False
    ) -> tuple[bool, bool]:
        """Wait `delay` seconds (the backoff), probing the server every `probe_interval`
        (jittered) when the wait is long; returns (stopped, ended early by the probe).
        Once the probe sees the server answer after it was seen unreachable, the wait ends
        after a random `recovery_spread` (so a cluster's nodes do not come back in one
        burst), or the cluster-sized herd spread when the next attempt is a relist."""
        s = self._settings
        probe = self._probe
        if probe is None or s.probe_interval <= 0 or delay <= s.probe_interval:
            return self._wait(halt, delay), False
        deadline = self._clock() + delay
        while True:
            left = deadline - self._clock()
            if left <= 0:
                return False, False
            step = s.probe_interval * (0.5 + self._rng.random())
            if self._wait(halt, min(left, step)):
                return True, False
            if self._clock() >= deadline:
                return False, False
            if not probe():
                armed = True
            elif armed:
                spread = s.recovery_spread * self._rng.random()
                if relist:
                    spread = max(spread, self._herd_spread())
                log(
                    logging.INFO,
                    "API server answers again",
                    resource=self.resource,
                    retry_in=round(spread, 3),
                )
                return self._wait(halt, min(spread, max(0.0, deadline - self._clock()))), True

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

    # ---- what cannot be read, and whether the source works --------------------------------

    def _guarded(
        self, trim: Callable[[Mapping[str, Any]], RawObject], prepare: Prepare | None
    ) -> Callable[[Any], Any]:
        """trim, then prepare, with an object either raises on skipped (None) instead of
        failing the list or the watch: validation reports the shapes it knows; this is for
        the ones it does not. One call per object, as without the guard (a list of 10,000
        slices makes 10,000)."""
        skipped = self._skipped

        if prepare is None:

            def read(obj: Any) -> Any:
                try:
                    return trim(obj)
                except MemoryError:
                    raise
                except Exception as exc:
                    skipped(describe(exc), obj)
                    return None

        else:

            def read(obj: Any) -> Any:
                try:
                    return prepare(trim(obj))
                except MemoryError:
                    raise
                except Exception as exc:
                    skipped(describe(exc), obj)
                    return None

        return read

    def _skipped(self, reason: str, obj: Any = None) -> None:
        """One unreadable object left out: counted every time, logged once per streak (a
        streak ends with a list that skipped nothing)."""
        self.skipped += 1
        self._unreadable.failed(
            logging.WARNING,
            "unreadable object skipped",
            resource=self.resource,
            object=object_name(obj) if isinstance(obj, Mapping) else None,
            reason=reason,
        )
        if self._on_invalid is not None:
            try:
                self._on_invalid(self.kind.value)
            except Exception as exc:  # a metrics hook must never stop the watch
                log(logging.ERROR, "invalid object callback failed", error=describe(exc))

    def _attempt_ended(self, progress: bool, reason: str, error: BaseException | None) -> None:
        """A list-and-watch attempt ended: one that made progress ends a failing streak;
        `degraded_after` in a row without any make the source degraded."""
        with self._health_lock:
            self._health_gen += 1  # a timer's watch has ended
            if progress:
                self._set_healthy()
                return
            self._failures += 1
            if self._failures < self._settings.degraded_after:
                return
            why = f"{reason}: {describe(error)}" if error is not None else reason
            why = f"{self._failures} attempts failed in a row, last {why}"
            if not self._degraded:
                self._degraded = True
                log(
                    logging.WARNING,
                    "API source failing, table kept",
                    resource=self.resource,
                    failures=self._failures,
                    error=why,
                )
            self._report(why)

    def _watch_opened(self) -> threading.Timer | None:
        """A watch is open: while degraded, a timer clears it once this watch has held
        `healthy_watch_seconds` (a quiet healthy watch may send nothing for minutes)."""
        with self._health_lock:
            if not self._degraded:
                return None
            seconds = self._settings.healthy_watch_seconds
            if seconds <= 0:
                self._set_healthy()
                return None
            gen = self._health_gen

        def held() -> None:
            with self._health_lock:
                if gen == self._health_gen:
                    self._set_healthy()

        timer = threading.Timer(seconds, held)
        timer.daemon = True
        timer.name = f"ipvsctl-kube-{self.resource}-health"
        timer.start()
        return timer

    def _set_healthy(self) -> None:
        """Under `_health_lock`."""
        self._failures = 0
        if self._degraded:
            self._degraded = False
            log(logging.INFO, "API source working again", resource=self.resource)
            self._report(None)

    def _report(self, why: str | None) -> None:
        if self._on_health is None:
            return
        try:
            self._on_health(self.resource, why)
        except Exception as exc:  # a metrics hook must never stop the watch
            log(logging.ERROR, "source health callback failed", error=describe(exc))

    def _tell_watching(self, watching: bool) -> None:
        if self._on_watching is None or self._watching is watching:
            return
        self._watching = watching
        try:
            self._on_watching(watching)
        except Exception as exc:  # a listener must never stop the watch
            log(logging.ERROR, "watch state callback failed", error=describe(exc))

    def interrupt(self) -> None:
        """Break the request in flight, if any (called from another thread on stop)."""
        with self._resp_lock:
            resp = self._resp
        if resp is not None:
            _shutdown(resp)

    # ---- requests -----------------------------------------------------------------------

    def _open(self, halt: threading.Event, **kwargs: Any) -> Any:
        resp = self._list_func(**kwargs)
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

    def _list_or_stream(self, halt: threading.Event) -> tuple[list[Any], str]:
        if self._watch_list:
            try:
                return self._stream_list(halt)
            except WatchListUnavailable as exc:
                reason = str(exc)
            except ApiException as exc:
                if exc.status not in (400, 403, 405, 422):
                    raise
                reason = f"HTTP {exc.status}"
            self._watch_list = False
            log(
                logging.INFO,
                "watch-list not offered, listing instead",
                resource=self.resource,
                reason=reason,
            )
        return self._list(halt)

    def _stream_list(self, halt: threading.Event) -> tuple[list[Any], str]:
        """WatchList (KEP-3157): the initial state as a watch stream of ADDED events, ended
        by a bookmark annotated `k8s.io/initial-events-end`, served from the watch cache
        without a list's one big response. The stream is closed there; the regular watch
        follows from the bookmark's resourceVersion."""
        s = self._settings
        kwargs: dict[str, Any] = {
            "watch": True,
            "send_initial_events": True,
            "resource_version_match": "NotOlderThan",
            "allow_watch_bookmarks": True,
            "timeout_seconds": max(1, int(s.watch_timeout)),
            # Each read waits at most this: an old server that ignores sendInitialEvents
            # sends the objects and then nothing, which ends here.
            "_request_timeout": (s.connect_timeout, s.list_read_timeout),
        }
        if self.resource_version:
            kwargs["resource_version"] = self.resource_version
        resp = self._open(halt, **kwargs)
        objects: list[Any] = []
        load = self._load
        try:
            for line in iter_lines(resp.stream(None, decode_content=False)):
                if halt.is_set():
                    raise _Stopped
                try:
                    event = json.loads(line)
                except RecursionError:  # an object too deep to decode: skipped
                    self._skipped("nested too deeply")
                    continue
                type_ = event.get("type") if isinstance(event, dict) else None
                obj = event.get("object") if isinstance(event, dict) else None
                if type_ == "ADDED" and not isinstance(obj, dict):
                    self._skipped(f"an ADDED event whose object is {type(obj).__name__}")
                    continue
                if not isinstance(obj, dict):
                    raise ValueError("watch event without an object")
                if type_ == "ADDED":
                    loaded = load(obj)
                    if loaded is not None:
                        objects.append(loaded)
                elif type_ == "BOOKMARK":
                    meta = obj.get("metadata") or {}
                    annotations = meta.get("annotations") or {}
                    rv = meta.get("resourceVersion")
                    if annotations.get(INITIAL_EVENTS_END) == "true" and rv:
                        return objects, str(rv)
                    raise WatchListUnavailable("a bookmark before the initial-events end")
                elif type_ == "ERROR":
                    code = obj.get("code")
                    if code in (400, 403, 422):
                        raise WatchListUnavailable(f"ERROR {code}")
                    self._handle(event, self._clock())  # raises WatchExpired / status
                else:
                    raise WatchListUnavailable(f"{type_} before the initial-events end")
            raise WatchListUnavailable("the stream ended before the initial-events end")
        except ReadTimeoutError as exc:
            raise WatchListUnavailable("no initial-events end within the read timeout") from exc
        finally:
            self._release(resp, clean=False)

    def _list_options(self) -> dict[str, Any]:
        """Where the list is served from, as client-go's reflector chooses: the first list
        with resourceVersion=0 (the API server's watch cache, any age); a relist with the
        last resourceVersion seen and NotOlderThan (the cache once it is at least that new,
        so the table never goes back before what was applied); after that failed (410, or
        the cache did not catch up), a consistent read (etcd). A cache answer for "0" may be
        older than a previous list from another API server: the watch from its
        resourceVersion then replays the newer events, as for any informer."""
        if self.resource_version is None:
            return {"resource_version": "0"}
        if self._rv_unavailable:
            return {}
        return {"resource_version": self.resource_version, "resource_version_match": "NotOlderThan"}

    def _list(self, halt: threading.Event) -> tuple[list[Any], str]:
        s = self._settings
        objects: list[Any] = []
        token: str | None = None
        rv: str | None = None
        load = self._load
        first = self._list_options()
        while True:
            # A page size is always asked for: servers that paginate cache reads (1.34+)
            # keep each page bounded; older ones answer resourceVersion=0 in one piece.
            kwargs: dict[str, Any] = {
                "limit": s.page_size,
                "_request_timeout": (s.connect_timeout, s.list_read_timeout),
            }
            if token:
                kwargs["_continue"] = token  # the token carries the snapshot's version
            else:
                kwargs.update(first)
            try:
                resp = self._open(halt, **kwargs)
            except ApiException as exc:
                # 410 (too old) or 504 (cache too far behind): the next list reads etcd.
                if not token and first.get("resource_version_match") and exc.status in (410, 504):
                    self._rv_unavailable = True
                raise
            clean = False
            try:
                body = resp.data
                clean = True
            finally:
                self._release(resp, clean=clean)
            items, meta = decode_list(body, load, self._skipped)
            del body
            objects.extend(items)
            del items
            rv = meta.get("resourceVersion") or rv
            token = meta.get("continue") or None
            if not token:
                break
            if halt.is_set():
                raise _Stopped
        if not rv:
            raise ValueError("list response has no metadata.resourceVersion")
        self._rv_unavailable = False
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
        self._opened = True
        timer = self._watch_opened()
        self._tell_watching(True)
        clean = False
        try:
            for line in iter_lines(resp.stream(None, decode_content=False)):
                received = self._clock()
                if halt.is_set():
                    raise _Stopped
                try:
                    event = json.loads(line)
                except RecursionError:  # an object too deep to decode: skipped
                    self._skipped("nested too deeply")
                    continue
                self._handle(event, received)
            clean = True
        finally:
            if timer is not None:
                timer.cancel()
            self._release(resp, clean=clean)

    def _handle(self, event: Any, received: float) -> None:
        type_ = event.get("type") if isinstance(event, dict) else None
        obj = event.get("object") if isinstance(event, dict) else None
        if not isinstance(obj, dict):
            if type_ in ("ADDED", "MODIFIED", "DELETED"):
                # One object that cannot be read: its last good version stays in force,
                # and the watch goes on (a relist would read it no better).
                self._skipped(f"a {type_} event whose object is {type(obj).__name__}")
                return
            raise ValueError("watch event without an object")
        if type_ == "ERROR":
            code = obj.get("code")
            message = f"{code} {obj.get('reason')}: {obj.get('message')}"
            if code == 410:
                raise WatchExpired(message)
            details = obj.get("details")
            after = details.get("retryAfterSeconds") if isinstance(details, dict) else None
            seconds = (
                float(after)
                if isinstance(after, int | float) and not isinstance(after, bool) and after >= 0
                else None
            )
            raise WatchStatusError(message, code, seconds)
        meta = obj.get("metadata")
        if not isinstance(meta, dict):
            meta = {}
        if type_ in ("ADDED", "MODIFIED"):
            loaded = self._load_event(obj)
            if loaded is not None:
                self._emit(self._upsert(self.kind, loaded, received))
        elif type_ == "DELETED":
            name, namespace = meta.get("name"), meta.get("namespace") or "default"
            if isinstance(name, str) and name and isinstance(namespace, str):
                self._emit(Delete(self.kind, namespace, name, received))
            else:
                self._skipped("a DELETED event without a readable name", obj)
        elif type_ != "BOOKMARK":
            log(logging.DEBUG, "unknown watch event ignored", resource=self.resource, type=type_)
        rv = meta.get("resourceVersion")
        if isinstance(rv, str) and rv:  # else the next request would be refused for it
            self.resource_version = rv

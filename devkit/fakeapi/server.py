"""FakeAPIServer: a threaded stdlib HTTP server (on 127.0.0.1 unless told) that serves Services,
EndpointSlices and Pods the way kube-apiserver does on the wire, so the real `kubernetes`
client can be driven against it.

Wire behaviour:
- list: `GET /api/v1/services`, `/apis/discovery.k8s.io/v1/endpointslices`, `/api/v1/pods`
  (and the `/namespaces/{ns}/...` forms), paginated with `limit`/`continue` over a consistent
  snapshot; `metadata.resourceVersion` is the cluster-wide counter at the snapshot.
  `resourceVersion=0` and `resourceVersion=N&resourceVersionMatch=NotOlderThan` are what the
  real server answers from its watch cache (`list_reads` tells them from etcd reads); N newer
  than the server is 504 "Too large resource version"; a resourceVersion with `continue` is
  400. With `cache_pagination=False`, `resourceVersion=0` ignores `limit` (servers < 1.34).
- WatchList (KEP-3157): `?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan`
  streams the current objects as ADDED, then a BOOKMARK annotated
  `k8s.io/initial-events-end: "true"`, then changes. `watch_list="off"` answers 422 (the
  feature gate off), `"ignore"` ignores the parameter (servers before 1.27).
- watch: `?watch=true&resourceVersion=N[&allowWatchBookmarks=true][&timeoutSeconds=T]`: a
  chunked stream of one JSON event per line (ADDED/MODIFIED/DELETED/BOOKMARK/ERROR), starting
  after N. N older than the retained history gets HTTP 410; with no N (or "0") the current
  objects come first as ADDED. The stream ends cleanly after timeoutSeconds.
- get: `GET /api/v1/namespaces/{ns}/pods/{name}`: the object or a 404 Status.
- `fieldSelector=metadata.name=X` on lists and watches (others: 400), as for a node's Node.
- create and patch of events.k8s.io Events: `POST .../namespaces/{ns}/events` (409 when the
  name exists, 422 without the fields the real server requires) and `PATCH .../events/{name}`
  (a merge of the body into the object; 404 when missing).
- any other method: 405 (recorded, so permission checks see it).

Efficiency: every object is serialised once when it changes; lists join the stored bytes and
watch events wrap them, so a list of 100,000 endpoints never re-encodes the world.
"""

from __future__ import annotations

import base64
import bisect
import contextlib
import json
import os
import select
import socket
import struct
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

JSON = dict[str, Any]
Key = tuple[str, str]  # (namespace, name)


@dataclass(frozen=True, slots=True)
class ResourceInfo:
    kind: str
    group: str  # "" is the core group
    version: str
    plural: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def prefix(self) -> str:
        return f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"


RESOURCES: dict[str, ResourceInfo] = {
    info.kind: info
    for info in (
        ResourceInfo("Service", "", "v1", "services"),
        ResourceInfo("EndpointSlice", "discovery.k8s.io", "v1", "endpointslices"),
        ResourceInfo("Pod", "", "v1", "pods"),
        ResourceInfo("Node", "", "v1", "nodes"),  # cluster-scoped; stored as "default"
        # events.k8s.io Events: list/watch/get as above, and create and patch (the only
        # resource written through the wire: the daemon's and shutdown-manager's Events)
        ResourceInfo("Event", "events.k8s.io", "v1", "events"),
    )
}


# A file every FakeAPIServer of this process (and its children) appends each request to,
# one JSON line: the lab checks a whole run's log (no Pod is ever read, issue 23).
REQUEST_LOG_ENV = "IPVSCTL_FAKEAPI_REQUEST_LOG"
_log_lock = threading.Lock()


def _log_request(path: str, record: RequestRecord) -> None:
    line = (
        json.dumps(
            {
                "method": record.method,
                "path": record.path,
                "verb": record.verb,
                "resource": record.resource,
                "namespace": record.namespace,
                "name": record.name,
            }
        )
        + "\n"
    )
    with _log_lock, open(path, "a") as f:
        f.write(line)


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One request as the server saw it. `verb` is the RBAC verb (get, list, watch, create,
    update, patch, delete); group/resource are None for paths that name no known resource."""

    method: str
    path: str
    query: Mapping[str, str]
    verb: str
    group: str | None
    resource: str | None
    namespace: str | None
    name: str | None
    raw_query: str = ""  # the query string as sent (order and encoding: the wire tests)
    accept: str | None = None  # the Accept header


@dataclass(slots=True)
class _Entry:
    key: Key
    rv: int
    uid: str
    raw: bytes  # the object's JSON, as served


@dataclass(slots=True)
class _Fault:
    verb: str
    kind: str | None
    status: int
    as_event: bool
    times: int
    # Watch lines sent before the error ("BOOKMARK", "ADDED": a hostile server that delivers
    # something, then fails), and the error as garbled JSON instead of a Status.
    before: tuple[str, ...] = ()
    garbled: bool = False
    retry_after: int | None = None  # `Retry-After` header / details.retryAfterSeconds


class _Watch:
    __slots__ = ("bookmarks", "commands", "cursor", "hung", "info", "name", "next_bookmark")

    def __init__(self, info: ResourceInfo, cursor: int, bookmarks: bool, next_bookmark: float):
        self.info = info
        self.cursor = cursor  # absolute index into the resource's event log
        self.bookmarks = bookmarks
        self.next_bookmark = next_bookmark
        self.commands: deque[str] = deque()
        self.hung = False
        self.name: str | None = None  # fieldSelector metadata.name


KUBERNETES_SERVICE: JSON = {
    "kind": "Service",
    "apiVersion": "v1",
    "metadata": {
        "name": "kubernetes",
        "namespace": "default",
        "labels": {"component": "apiserver", "provider": "kubernetes"},
    },
    "spec": {
        "type": "ClusterIP",
        "clusterIP": "None",
        "clusterIPs": ["None"],
        "ports": [{"name": "https", "protocol": "TCP", "port": 443, "targetPort": 6443}],
    },
}


_NON_RESOURCE_PATHS = ("/readyz", "/livez", "/healthz")


def _status(code: int, reason: str, message: str) -> JSON:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    410: "Expired",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
}
_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _abort(sock: socket.socket) -> None:
    """Drop a connection hard (RST on close), as a dying server or network would."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], fake: FakeAPIServer) -> None:
        self.fake = fake
        super().__init__(address, _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients going away mid-stream is the normal case here, not worth a traceback.
        import sys

        exc = sys.exc_info()[1]
        if not isinstance(exc, OSError):
            super().handle_error(request, client_address)


class _CountingWriter:
    """The handler's wfile, adding what is written to the server's byte count."""

    def __init__(self, raw: Any, handler: _Handler) -> None:
        self._raw = raw
        self._h = handler

    def write(self, data: bytes) -> int:
        n = self._raw.write(data)
        self._h.server.fake._count_bytes(self._h.acct, len(data))
        return n

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive and chunked streams, as the client expects
    server: _HTTPServer

    acct: tuple[str, str] = ("", "")  # (verb, resource or path) of the current request

    def setup(self) -> None:
        super().setup()
        self.server.fake._register(self.connection)
        self.wfile = _CountingWriter(self.wfile, self)  # type: ignore[assignment]

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.fake._unregister(self.connection)

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.server.fake._handle(self, "GET")

    def do_POST(self) -> None:
        self.server.fake._handle(self, "POST")

    def do_PUT(self) -> None:
        self.server.fake._handle(self, "PUT")

    def do_PATCH(self) -> None:
        self.server.fake._handle(self, "PATCH")

    def do_DELETE(self) -> None:
        self.server.fake._handle(self, "DELETE")


class FakeAPIServer:
    """A fake kube-apiserver for Services, EndpointSlices and Pods.

    Typical use::

        api = FakeAPIServer().start()
        api.add({"kind": "Service", "metadata": {"name": "web", "namespace": "default"}, ...})
        ... point the client at api.url ...
        api.expire_watches(); api.down(); api.up(); api.stop()

    Thread-safe. `bookmark_interval` (seconds, None = never) sends periodic BOOKMARKs to
    watches that asked for them; `max_watch_seconds` caps every watch's timeoutSeconds;
    `history_limit` is how many events per resource are kept for watches that resume from an
    older resourceVersion (older ones get 410); `token` makes every request need
    `Authorization: Bearer <token>`. `kubernetes_service` seeds `default/kubernetes` (headless,
    so it programs nothing) as every real cluster has it; `/readyz`, `/livez` and `/healthz`
    answer 200 "ok" while the server is up. `host` is the address it listens on (an address
    other network namespaces reach, for daemons running as processes in them).
    """

    def __init__(
        self,
        *,
        port: int = 0,
        bookmark_interval: float | None = None,
        max_watch_seconds: float | None = None,
        history_limit: int = 100_000,
        token: str | None = None,
        initial_resource_version: int = 1000,
        record_requests: bool = True,
        kubernetes_service: bool = True,
        cache_pagination: bool = True,
        watch_list: str = "on",
        host: str = "127.0.0.1",
    ) -> None:
        self.host = host
        self.cache_pagination = cache_pagination
        self.watch_list = watch_list
        self.bookmark_interval = bookmark_interval
        self.max_watch_seconds = max_watch_seconds
        self.history_limit = history_limit
        self.token = token
        self.record_requests = record_requests
        self._port = port
        self._cond = threading.Condition()
        self._rv = initial_resource_version
        self._store: dict[str, dict[Key, _Entry]] = {k: {} for k in RESOURCES}
        self._sorted: dict[str, list[_Entry] | None] = dict.fromkeys(RESOURCES)
        # Event log per kind: (resourceVersion, type, namespace, object JSON). `_log_base` is
        # the absolute index of the first kept event; `_dropped_rv` the newest forgotten one.
        self._log: dict[str, list[tuple[int, bytes, str, bytes]]] = {k: [] for k in RESOURCES}
        self._log_base: dict[str, int] = dict.fromkeys(RESOURCES, 0)
        self._dropped_rv: dict[str, int] = dict.fromkeys(RESOURCES, initial_resource_version)
        self._snapshots: dict[str, tuple[int, list[_Entry]]] = {}
        self._watches: set[_Watch] = set()
        self._faults: list[_Fault] = []
        self._requests: list[RequestRecord] = []
        self._bytes: dict[tuple[str, str], int] = {}
        self._conns: set[socket.socket] = set()
        self._hang = False
        self._down = True
        self._stopped = False
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None
        if kubernetes_service:
            # Every real cluster has it, and the daemon refuses a Service list without it.
            # Headless here, so that it programs nothing and tests see only their own objects.
            self._put(KUBERNETES_SERVICE, mode="create")

    # ---- lifecycle ----------------------------------------------------------------------

    def start(self) -> FakeAPIServer:
        self.up()
        return self

    def __enter__(self) -> FakeAPIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self._port}"

    def up(self) -> None:
        """Listen again (on the same port) after `down()`; the stored objects are kept."""
        with self._cond:
            if self._httpd is not None:
                return
            httpd = _HTTPServer((self.host, self._port), self)
            self._port = httpd.server_address[1]
            self._httpd = httpd
            self._down = False
            self._cond.notify_all()
        self._thread = threading.Thread(
            target=httpd.serve_forever,
            kwargs={"poll_interval": 0.02},
            name=f"fakeapi-{self._port}",
            daemon=True,
        )
        self._thread.start()

    def down(self) -> None:
        """Stop listening (new connections are refused) and reset every open connection."""
        with self._cond:
            httpd, self._httpd = self._httpd, None
            self._down = True
            self._cond.notify_all()
            conns = list(self._conns)
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()
        for sock in conns:
            _abort(sock)
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def stop(self) -> None:
        self._stopped = True
        self.down()

    # ---- objects ------------------------------------------------------------------------

    @property
    def resource_version(self) -> int:
        with self._cond:
            return self._rv

    def add(self, obj: JSON) -> JSON:
        """Create an object (kind from `obj["kind"]`); ValueError if it exists. Returns the
        stored object with its new metadata.resourceVersion (and uid)."""
        with self._cond:
            out = self._put(obj, mode="create")
            self._cond.notify_all()
            return out

    def update(self, obj: JSON) -> JSON:
        """Replace an existing object (MODIFIED); KeyError if it does not exist."""
        with self._cond:
            out = self._put(obj, mode="update")
            self._cond.notify_all()
            return out

    def upsert(self, obj: JSON) -> JSON:
        with self._cond:
            out = self._put(obj, mode="upsert")
            self._cond.notify_all()
            return out

    def add_many(self, objs: Iterable[JSON]) -> int:
        """Create or replace many objects under one lock (bulk loads for demos and benches)."""
        n = 0
        with self._cond:
            for obj in objs:
                self._put(obj, mode="upsert", want_copy=False)
                n += 1
            self._cond.notify_all()
        return n

    def delete(self, kind: str, namespace: str, name: str) -> None:
        """Delete an object (DELETED, carrying its last state); KeyError if missing."""
        with self._cond:
            store = self._store[kind]
            entry = store.pop((namespace, name))
            self._rv += 1
            obj = json.loads(entry.raw)
            obj["metadata"]["resourceVersion"] = str(self._rv)
            self._record_event(kind, b"DELETED", namespace, _dumps(obj))
            self._sorted[kind] = None
            self._cond.notify_all()

    def get(self, kind: str, namespace: str, name: str) -> JSON | None:
        with self._cond:
            entry = self._store[kind].get((namespace, name))
        return None if entry is None else json.loads(entry.raw)

    def objects(self, kind: str) -> list[JSON]:
        with self._cond:
            entries = self._sorted_entries(kind)
        return [json.loads(e.raw) for e in entries]

    # ---- failure injection ----------------------------------------------------------------

    def expire_watches(self, kind: str | None = None) -> int:
        """Send an ERROR event with a 410 Expired Status on every open watch (of `kind`),
        then end those streams. Returns how many were expired."""
        return self._command("expire", kind)

    def close_watches(self, kind: str | None = None) -> int:
        """End open watch streams cleanly, as a server-side timeout does."""
        return self._command("close", kind)

    def reset_watches(self, kind: str | None = None) -> int:
        """Break open watch streams mid-stream (connection reset)."""
        return self._command("abort", kind)

    def bookmark(self, kind: str | None = None) -> int:
        """Send a BOOKMARK at the current resourceVersion on open watches that allow them."""
        return self._command("bookmark", kind)

    def fail_next(
        self,
        verb: str,
        kind: str | None = None,
        *,
        status: int = 410,
        as_event: bool = False,
        times: int = 1,
        before: tuple[str, ...] = (),
        garbled: bool = False,
        retry_after: int | None = None,
    ) -> None:
        """Answer the next `times` requests of `verb` (list, watch, get) on `kind` (None:
        any) with an error `status`: as an HTTP error, or, for watches with `as_event`, as a
        200 stream carrying one ERROR event with that Status. A watch fault may first send
        `before` ("BOOKMARK", "ADDED": an object of the kind) and may end in a `garbled`
        line instead of the Status; `retry_after` is sent as the header (HTTP errors) or
        the Status's details.retryAfterSeconds (events)."""
        with self._cond:
            self._faults.append(
                _Fault(verb, kind, status, as_event, times, before, garbled, retry_after)
            )

    def serve_empty_lists(self, kind: str | None = None, *, times: int = 1) -> None:
        """Answer the next `times` lists of `kind` with 200 and no items (a broken proxy in
        front of the server, or an etcd restored empty)."""
        with self._cond:
            self._faults.append(_Fault("empty-list", kind, 200, False, times))

    def clear_faults(self) -> None:
        with self._cond:
            self._faults.clear()

    def compact(self) -> None:
        """Forget the event history, as etcd compaction does: watches from any older
        resourceVersion now get HTTP 410."""
        with self._cond:
            for kind, log in self._log.items():
                self._log_base[kind] += len(log)
                log.clear()
                self._dropped_rv[kind] = self._rv
            self._cond.notify_all()

    def expire_continue_tokens(self) -> None:
        """Paginated lists in progress get 410 Expired on their next page."""
        with self._cond:
            self._snapshots.clear()

    def hang(self) -> None:
        """Go silent: new requests get response headers and then nothing; open watches stop
        sending (no events, no bookmarks, no timeout). Like a half-open connection."""
        with self._cond:
            self._hang = True
            self._cond.notify_all()

    def unhang(self) -> None:
        """Answer again. Connections that were hung are dropped, as dead ones would be."""
        with self._cond:
            self._hang = False
            self._cond.notify_all()

    # ---- observation ----------------------------------------------------------------------

    @property
    def requests(self) -> list[RequestRecord]:
        with self._cond:
            return list(self._requests)

    def count(self, verb: str | None = None, kind: str | None = None) -> int:
        plural = RESOURCES[kind].plural if kind else None
        with self._cond:
            return sum(
                1
                for r in self._requests
                if (verb is None or r.verb == verb) and (plural is None or r.resource == plural)
            )

    def list_reads(self, kind: str | None = None) -> dict[str, int]:
        """Lists (first pages) by where kube-apiserver would serve them: "cache" (the watch
        cache: resourceVersion=0, or a resourceVersion with NotOlderThan) or "etcd" (a
        consistent read: no resourceVersion)."""
        plural = RESOURCES[kind].plural if kind else None
        out = {"cache": 0, "etcd": 0}
        with self._cond:
            for r in self._requests:
                if r.verb != "list" or r.query.get("continue"):
                    continue
                if plural is not None and r.resource != plural:
                    continue
                out["cache" if r.query.get("resourceVersion") else "etcd"] += 1
        return out

    def clear_requests(self) -> None:
        with self._cond:
            self._requests.clear()
            self._bytes.clear()

    def bytes_sent(self, verb: str | None = None, kind: str | None = None) -> int:
        """Response bytes written (headers and chunk framing included), by RBAC verb and kind;
        watch streams count as they flow."""
        plural = RESOURCES[kind].plural if kind else None
        with self._cond:
            return sum(
                n
                for (v, r), n in self._bytes.items()
                if (verb is None or v == verb) and (plural is None or r == plural)
            )

    def _count_bytes(self, acct: tuple[str, str], n: int) -> None:
        with self._cond:
            self._bytes[acct] = self._bytes.get(acct, 0) + n

    def open_watches(self, kind: str | None = None) -> int:
        with self._cond:
            return sum(1 for w in self._watches if kind is None or w.info.kind == kind)

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
        """Wait until `predicate()` is true; it is re-checked whenever a request arrives or a
        watch opens or closes (and every 50 ms). Returns the predicate's last value."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                if predicate():
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.05))

    # ---- internals: state ----------------------------------------------------------------

    def _put(self, obj: JSON, *, mode: str, want_copy: bool = True) -> JSON:
        kind = obj.get("kind")
        if kind not in RESOURCES:
            raise ValueError(f"unsupported kind {kind!r}")
        info = RESOURCES[kind]
        obj = dict(obj)
        meta = dict(obj.get("metadata") or {})
        obj["metadata"] = meta
        obj.setdefault("apiVersion", info.api_version)
        if not meta.get("name"):
            raise ValueError("metadata.name is required")
        meta.setdefault("namespace", "default")
        key = (meta["namespace"], meta["name"])
        store = self._store[kind]
        old = store.get(key)
        if mode == "create" and old is not None:
            raise ValueError(f"{kind} {key[0]}/{key[1]} already exists")
        if mode == "update" and old is None:
            raise KeyError(f"{kind} {key[0]}/{key[1]} not found")
        meta["uid"] = old.uid if old is not None else meta.get("uid") or str(uuid.uuid4())
        self._rv += 1
        meta["resourceVersion"] = str(self._rv)
        raw = _dumps(obj)
        store[key] = _Entry(key, self._rv, meta["uid"], raw)
        self._sorted[kind] = None
        self._record_event(kind, b"ADDED" if old is None else b"MODIFIED", key[0], raw)
        return json.loads(raw) if want_copy else obj

    def _record_event(self, kind: str, type_: bytes, namespace: str, raw: bytes) -> None:
        log = self._log[kind]
        log.append((self._rv, type_, namespace, raw))
        # Trim in batches so appends stay O(1) amortised.
        if len(log) > self.history_limit + self.history_limit // 4 + 1:
            drop = len(log) - self.history_limit
            self._dropped_rv[kind] = log[drop - 1][0]
            del log[:drop]
            self._log_base[kind] += drop

    def _sorted_entries(self, kind: str) -> list[_Entry]:
        # Rebuilt only after a change; never mutated afterwards, so list snapshots can share it.
        entries = self._sorted[kind]
        if entries is None:
            store = self._store[kind]
            entries = [store[k] for k in sorted(store)]
            self._sorted[kind] = entries
        return entries

    def _command(self, cmd: str, kind: str | None) -> int:
        with self._cond:
            n = 0
            for w in self._watches:
                if kind is None or w.info.kind == kind:
                    w.commands.append(cmd)
                    n += 1
            self._cond.notify_all()
            return n

    def _take_fault(self, verb: str, kind: str | None) -> _Fault | None:
        for fault in self._faults:
            if fault.verb == verb and (fault.kind is None or fault.kind == kind):
                fault.times -= 1
                if fault.times <= 0:
                    self._faults.remove(fault)
                return fault
        return None

    def _register(self, sock: socket.socket) -> None:
        with self._cond:
            self._conns.add(sock)

    def _unregister(self, sock: socket.socket) -> None:
        with self._cond:
            self._conns.discard(sock)

    # ---- internals: HTTP ----------------------------------------------------------------

    @staticmethod
    def _route(path: str) -> tuple[ResourceInfo, str | None, str | None] | None:
        for info in RESOURCES.values():
            if not path.startswith(info.prefix + "/"):
                continue
            parts = path[len(info.prefix) + 1 :].strip("/").split("/")
            if parts == [info.plural]:
                return info, None, None
            if len(parts) in (3, 4) and parts[0] == "namespaces" and parts[2] == info.plural:
                return info, parts[1], parts[3] if len(parts) == 4 else None
        return None

    def _handle(self, h: _Handler, method: str) -> None:
        parts = urlsplit(h.path)
        # A request's body is read whatever the answer: left unread on a kept-alive
        # connection, it would be taken for the next request.
        body = _read_body(h) if method in ("POST", "PUT", "PATCH") else b""
        query = dict(parse_qsl(parts.query, keep_blank_values=True))
        selector = query.get("fieldSelector") or ""
        if selector and not selector.startswith("metadata.name="):
            self._send_status(h, 400, f"field selector not supported by this fake: {selector}")
            return
        route = self._route(parts.path)
        info, namespace, name = route if route else (None, None, None)
        is_watch = query.get("watch") in ("true", "1")
        if method != "GET":
            verb = _VERBS.get(method, method.lower())
        elif name is not None or parts.path in _NON_RESOURCE_PATHS:
            verb = "get"
        else:
            verb = "watch" if is_watch else "list"
        record = RequestRecord(
            method,
            parts.path,
            query,
            verb,
            info.group if info else None,
            info.plural if info else None,
            namespace,
            name,
            parts.query,
            h.headers.get("Accept"),
        )
        h.acct = (verb, info.plural if info else parts.path)
        if REQUEST_LOG_ENV in os.environ:
            _log_request(os.environ[REQUEST_LOG_ENV], record)
        with self._cond:
            if self.record_requests:
                self._requests.append(record)
            self._cond.notify_all()
            hang = self._hang
            fault = self._take_fault(verb, info.kind if info else None) if not hang else None
        if self.token is not None:
            scheme, _, cred = (h.headers.get("Authorization") or "").partition(" ")
            if scheme.lower() != "bearer" or cred != self.token:
                self._send_status(h, 401, "Unauthorized")
                return
        if hang:
            self._serve_hang(h)
            return
        if fault is not None:
            message = f"injected {fault.status} for {verb} {parts.path}"
            if (fault.as_event or fault.before or fault.garbled) and verb == "watch":
                self._serve_fault_stream(h, fault, info, message)
            else:
                self._send_status(h, fault.status, message, retry_after=fault.retry_after)
            return
        if info is None and method == "GET" and parts.path in _NON_RESOURCE_PATHS:
            self._send_text(h, 200, b"ok")
            return
        if info is None:
            self._send_status(
                h, 404, f"the server could not find the requested resource ({parts.path})"
            )
            return
        if info.kind == "Event" and method in ("POST", "PATCH"):
            self._write_event(h, method, namespace, name, body)
            return
        if method != "GET":
            self._send_status(h, 405, f"{method} is not supported by this fake")
            return
        if name is not None:
            self._serve_get(h, info, namespace or "default", name)
        elif is_watch:
            self._serve_watch(h, info, namespace, query)
        else:
            self._serve_list(h, info, namespace, query)

    def _write_event(
        self, h: _Handler, method: str, namespace: str | None, name: str | None, raw: bytes
    ) -> None:
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        if not isinstance(body, dict) or namespace is None:
            self._send_status(h, 400, "the body is not a JSON object")
            return
        with self._cond:
            if method == "POST":
                if name is not None:
                    self._send_status(h, 405, "POST names no object")
                    return
                missing = [f for f in _EVENT_REQUIRED if not body.get(f)]
                meta = body.get("metadata") if isinstance(body.get("metadata"), dict) else {}
                if missing or not meta.get("name") or meta.get("namespace", namespace) != namespace:
                    self._send_status(h, 422, f"Event is invalid: missing {missing or 'name'}")
                    return
                if (namespace, meta["name"]) in self._store["Event"]:
                    self._send_status(h, 409, f'events "{meta["name"]}" already exists')
                    return
                body["metadata"] = {**meta, "namespace": namespace}
                out = self._put(body, mode="create")
                code = 201
            else:
                old = self.get("Event", namespace, name or "")
                if old is None:
                    self._send_status(h, 404, f'events "{name}" not found')
                    return
                out = self._put(_merge(old, body), mode="update")
                code = 200
            self._cond.notify_all()
        self._send_json(h, code, _dumps(out))

    def _send_json(self, h: _Handler, code: int, body: bytes) -> None:
        h.send_response(code)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def _send_text(self, h: _Handler, code: int, body: bytes) -> None:
        h.send_response(code)
        h.send_header("Content-Type", "text/plain; charset=utf-8")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def _send_status(
        self, h: _Handler, code: int, message: str, retry_after: int | None = None
    ) -> None:
        body = _dumps(_status(code, _reason(code), message))
        h.send_response(code)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        if retry_after is not None:
            h.send_header("Retry-After", str(retry_after))
        h.end_headers()
        h.wfile.write(body)

    def _serve_fault_stream(
        self, h: _Handler, fault: _Fault, info: ResourceInfo | None, message: str
    ) -> None:
        """A 200 watch stream: the `before` lines, then an ERROR Status or garbled JSON."""
        lines: list[bytes] = []
        with self._cond:
            rv = self._rv
            entries = self._sorted_entries(info.kind) if info else []
        for shape in fault.before:
            if shape == "BOOKMARK" and info is not None:
                lines.append(_bookmark_line(info, rv))
            elif shape == "ADDED" and entries:
                lines.append(_event(b"ADDED", entries[0].raw))
        if fault.garbled:
            lines.append(b'{"type":"MODIFIED","object":{"kind":\n')
        else:
            status = _status(fault.status, _reason(fault.status), message)
            if fault.retry_after is not None:
                status["details"] = {"retryAfterSeconds": fault.retry_after}
            lines.append(_dumps({"type": "ERROR", "object": status}) + b"\n")
        self._start_stream(h)
        self._write_chunk(h, b"".join(lines))
        self._end_stream(h)

    def _serve_get(self, h: _Handler, info: ResourceInfo, namespace: str, name: str) -> None:
        with self._cond:
            entry = self._store[info.kind].get((namespace, name))
        if entry is None:
            body = _status(404, "NotFound", f'{info.plural} "{name}" not found')
            body["details"] = {"name": name, "kind": info.plural}
            self._send_json(h, 404, _dumps(body))
        else:
            self._send_json(h, 200, entry.raw)

    def _serve_list(
        self, h: _Handler, info: ResourceInfo, namespace: str | None, query: Mapping[str, str]
    ) -> None:
        try:
            limit = int(query.get("limit") or 0)
        except ValueError:
            self._send_status(h, 400, "invalid limit")
            return
        token = query.get("continue") or ""
        rv_param = query.get("resourceVersion") or ""
        match = query.get("resourceVersionMatch") or ""
        if token and rv_param:
            self._send_status(
                h, 400, "specifying resource version is not allowed when using continue"
            )
            return
        if match and not rv_param:
            self._send_status(
                h, 400, "resourceVersionMatch is forbidden unless resourceVersion is provided"
            )
            return
        if match not in ("", "NotOlderThan"):
            self._send_status(h, 400, f"resourceVersionMatch={match} is not supported here")
            return
        if rv_param == "0" and not self.cache_pagination:
            limit = 0  # as before 1.34: the watch cache answers in one piece
        if rv_param not in ("", "0"):
            try:
                wanted = int(rv_param)
            except ValueError:
                self._send_status(h, 400, "invalid resourceVersion")
                return
            if wanted > self.resource_version:
                # kube-apiserver waits up to 3 s for its cache, then gives up like this.
                self._send_status(
                    h,
                    504,
                    f"Too large resource version: {wanted}, current: {self.resource_version}",
                )
                return
        with self._cond:
            empty = self._take_fault("empty-list", info.kind) is not None
            if token:
                try:
                    sid, offset = _decode_continue(token)
                except ValueError:
                    self._send_status(h, 400, "invalid continue token")
                    return
                snap = self._snapshots.get(sid)
                if snap is None:
                    expired = True
                else:
                    expired = False
                    rv, entries = snap
            else:
                expired = False
                sid, offset = uuid.uuid4().hex, 0
                rv, entries = self._rv, self._sorted_entries(info.kind)
                if empty:
                    entries = []
                if namespace is not None:
                    entries = [e for e in entries if e.key[0] == namespace]
                if query.get("fieldSelector"):
                    name = query["fieldSelector"].partition("=")[2]
                    entries = [e for e in entries if e.key[1] == name]
            if not expired:
                end = offset + limit if limit > 0 else len(entries)
                page = entries[offset:end]
                more = end < len(entries)
                if more:
                    self._snapshots[sid] = (rv, entries)
                    while len(self._snapshots) > 64:  # abandoned paginations
                        self._snapshots.pop(next(iter(self._snapshots)))
                else:
                    self._snapshots.pop(sid, None)
        if expired:
            self._send_status(
                h,
                410,
                "The provided continue parameter is too old to display a consistent "
                "list result. You can start a new list without the continue parameter.",
            )
            return
        meta: JSON = {"resourceVersion": str(rv)}
        if more:
            meta["continue"] = _encode_continue(sid, end)
            meta["remainingItemCount"] = len(entries) - end
        body = b"".join(
            (
                b'{"kind":"',
                info.kind.encode(),
                b'List","apiVersion":"',
                info.api_version.encode(),
                b'","metadata":',
                _dumps(meta),
                b',"items":[',
                b",".join(e.raw for e in page),
                b"]}",
            )
        )
        self._send_json(h, 200, body)

    def _start_stream(self, h: _Handler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()

    @staticmethod
    def _write_chunk(h: _Handler, data: bytes) -> None:
        h.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    @staticmethod
    def _end_stream(h: _Handler) -> None:
        h.wfile.write(b"0\r\n\r\n")

    def _serve_hang(self, h: _Handler) -> None:
        self._start_stream(h)
        with self._cond:
            while self._hang and not self._down:
                self._cond.wait()
        h.close_connection = True
        _abort(h.connection)

    def _serve_watch(
        self, h: _Handler, info: ResourceInfo, namespace: str | None, query: Mapping[str, str]
    ) -> None:
        kind = info.kind
        rv_param = query.get("resourceVersion") or ""
        watch_list = query.get("sendInitialEvents") in ("true", "1")
        if watch_list and self.watch_list == "off":
            self._send_status(
                h,
                422,
                "sendInitialEvents is forbidden for watch unless the "
                "WatchList feature gate is enabled",
            )
            return
        if watch_list and self.watch_list == "ignore":  # a server older than 1.27
            watch_list = False
        if watch_list:
            if query.get("resourceVersionMatch") != "NotOlderThan":
                self._send_status(
                    h, 422, "sendInitialEvents requires resourceVersionMatch=NotOlderThan"
                )
                return
            if rv_param not in ("", "0") and int(rv_param) > self.resource_version:
                self._send_status(h, 504, f"Too large resource version: {rv_param}")
                return
            rv_param = ""  # the current state, then changes
        try:
            since = int(rv_param) if rv_param not in ("", "0") else None
            timeout = float(query["timeoutSeconds"]) if "timeoutSeconds" in query else 1800.0
        except ValueError:
            self._send_status(h, 400, "invalid resourceVersion or timeoutSeconds")
            return
        if self.max_watch_seconds is not None:
            timeout = min(timeout, self.max_watch_seconds)
        bookmarks = query.get("allowWatchBookmarks") in ("true", "1")
        only_name = (query.get("fieldSelector") or "").partition("=")[2] or None
        now = time.monotonic()
        deadline = now + timeout
        initial: list[bytes] = []
        with self._cond:
            log = self._log[kind]
            if since is None:
                # No resourceVersion: the current state first, then changes.
                initial = [
                    _event(b"ADDED", e.raw)
                    for e in self._sorted_entries(kind)
                    if (namespace is None or e.key[0] == namespace)
                    and (not only_name or e.key[1] == only_name)
                ]
                cursor = self._log_base[kind] + len(log)
                if watch_list:  # KEP-3157: the end of the initial state is a bookmark
                    initial.append(_bookmark_line(info, self._rv, initial_events_end=True))
            elif since < self._dropped_rv[kind]:
                cursor = -1
            else:
                cursor = self._log_base[kind] + bisect.bisect_right(log, since, key=lambda e: e[0])
            if cursor >= 0:
                interval = self.bookmark_interval
                watch = _Watch(
                    info, cursor, bookmarks, now + interval if interval else float("inf")
                )
                watch.name = only_name
                self._watches.add(watch)
                self._cond.notify_all()
        if cursor < 0:
            self._send_status(
                h, 410, f"too old resource version: {since} ({self._dropped_rv[kind]})"
            )
            return
        try:
            self._start_stream(h)
            if initial:
                self._write_chunk(h, b"".join(initial))
            self._stream(h, watch, namespace, deadline)
        except OSError:
            h.close_connection = True
        finally:
            with self._cond:
                self._watches.discard(watch)
                self._cond.notify_all()

    def _stream(self, h: _Handler, w: _Watch, namespace: str | None, deadline: float) -> None:
        kind = w.info.kind
        while True:
            lines: list[bytes] = []
            end: str | None = None
            with self._cond:
                while True:
                    if self._down:
                        end = "abort"
                        break
                    if self._hang:
                        w.hung = True
                        self._cond.wait()
                        continue
                    if w.hung:  # that connection is dead now
                        end = "abort"
                        break
                    base, log = self._log_base[kind], self._log[kind]
                    if w.cursor < base:  # fell out of the history window
                        lines.append(_expired_line(w.cursor))
                        end = "close"
                        break
                    if w.cursor - base < len(log):
                        for _rv, type_, ns, raw in log[w.cursor - base :]:
                            if (namespace is None or ns == namespace) and (
                                w.name is None or json.loads(raw)["metadata"]["name"] == w.name
                            ):
                                lines.append(_event(type_, raw))
                        w.cursor = base + len(log)
                    while w.commands and end is None:
                        cmd = w.commands.popleft()
                        if cmd == "bookmark" and w.bookmarks:
                            lines.append(_bookmark_line(w.info, self._rv))
                        elif cmd == "expire":
                            lines.append(_expired_line(self._rv))
                            end = "close"
                        elif cmd in ("close", "abort"):
                            end = cmd
                    now = time.monotonic()
                    if end is None and now >= deadline:
                        end = "close"
                    if end is None and w.bookmarks and now >= w.next_bookmark:
                        lines.append(_bookmark_line(w.info, self._rv))
                        w.next_bookmark = now + (self.bookmark_interval or float("inf"))
                    if lines or end:
                        break
                    if _client_gone(h.connection):  # as the real server sees a closed stream
                        end = "abort"
                        break
                    wake = min(deadline, w.next_bookmark if w.bookmarks else deadline)
                    self._cond.wait(min(0.2, max(0.0, wake - now)))
            if end == "abort":
                h.close_connection = True
                _abort(h.connection)
                return
            if lines:
                self._write_chunk(h, b"".join(lines))
            if end == "close":
                self._end_stream(h)
                return


# What the real server refuses an events.k8s.io Event without (ValidateEventCreate).
_EVENT_REQUIRED = ("eventTime", "reportingController", "reportingInstance", "action", "reason")


def _read_body(h: _Handler) -> bytes:
    try:
        length = int(h.headers.get("Content-Length") or 0)
    except ValueError:
        return b""
    return h.rfile.read(length) if 0 < length <= 1 << 20 else b""


def _merge(old: JSON, patch: JSON) -> JSON:
    """A merge patch (what a strategic merge patch of plain fields amounts to)."""
    out = dict(old)
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def _client_gone(sock: socket.socket) -> bool:
    """The client closed its end (EOF readable) while the stream waits for news."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        if not readable:
            return False
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except (OSError, ValueError):
        return True


def _reason(code: int) -> str:
    return _REASONS.get(code, "Unknown")


def _event(type_: bytes, raw: bytes) -> bytes:
    return b'{"type":"%s","object":%s}\n' % (type_, raw)


def _bookmark_line(info: ResourceInfo, rv: int, *, initial_events_end: bool = False) -> bytes:
    meta: JSON = {"resourceVersion": str(rv)}
    if initial_events_end:
        meta["annotations"] = {"k8s.io/initial-events-end": "true"}
    obj = {"kind": info.kind, "apiVersion": info.api_version, "metadata": meta}
    return _event(b"BOOKMARK", _dumps(obj))


def _expired_line(rv: int) -> bytes:
    status = _status(410, "Expired", f"too old resource version: {rv}")
    return _event(b"ERROR", _dumps(status))


def _encode_continue(sid: str, offset: int) -> str:
    return base64.urlsafe_b64encode(_dumps({"s": sid, "o": offset})).decode()


def _decode_continue(token: str) -> tuple[str, int]:
    try:
        data = json.loads(base64.urlsafe_b64decode(token.encode()))
        return str(data["s"]), int(data["o"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(token) from exc

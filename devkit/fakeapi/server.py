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

import json
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable

from devkit.fakeapi import wire
from devkit.fakeapi.serving import Serving, _HTTPServer
from devkit.fakeapi.state import (
    JSON,
    KUBERNETES_SERVICE,
    RESOURCES,
    Entry,
    Fault,
    Key,
    RequestRecord,
    Watch,
)


class FakeAPIServer(Serving):
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
        self._store: dict[str, dict[Key, Entry]] = {k: {} for k in RESOURCES}
        self._sorted: dict[str, list[Entry] | None] = dict.fromkeys(RESOURCES)
        # Event log per kind: (resourceVersion, type, namespace, object JSON). `_log_base` is
        # the absolute index of the first kept event; `_dropped_rv` the newest forgotten one.
        self._log: dict[str, list[tuple[int, bytes, str, bytes]]] = {k: [] for k in RESOURCES}
        self._log_base: dict[str, int] = dict.fromkeys(RESOURCES, 0)
        self._dropped_rv: dict[str, int] = dict.fromkeys(RESOURCES, initial_resource_version)
        self._snapshots: dict[str, tuple[int, list[Entry]]] = {}
        self._watches: set[Watch] = set()
        self._faults: list[Fault] = []
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
            wire.abort(sock)
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

    def put_raw(self, kind: str, namespace: str, name: str, raw: bytes) -> None:
        """A broken server: store `raw` verbatim as the JSON of `kind` namespace/name,
        served as it is in lists and as the object of the ADDED or MODIFIED watch event it
        makes (any JSON: an object no client can read, a number, deep nesting). `update`
        or `upsert` of a proper object under that name replaces it."""
        with self._cond:
            store = self._store[kind]
            key = (namespace, name)
            old = store.get(key)
            self._rv += 1
            store[key] = Entry(key, self._rv, old.uid if old else str(uuid.uuid4()), raw)
            self._sorted[kind] = None
            self._record_event(kind, b"ADDED" if old is None else b"MODIFIED", namespace, raw)
            self._cond.notify_all()

    def delete(self, kind: str, namespace: str, name: str) -> None:
        """Delete an object (DELETED, carrying its last state); KeyError if missing."""
        with self._cond:
            store = self._store[kind]
            entry = store.pop((namespace, name))
            self._rv += 1
            obj = json.loads(entry.raw)
            obj["metadata"]["resourceVersion"] = str(self._rv)
            self._record_event(kind, b"DELETED", namespace, wire.dumps(obj))
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
                Fault(verb, kind, status, as_event, times, before, garbled, retry_after)
            )

    def serve_empty_lists(self, kind: str | None = None, *, times: int = 1) -> None:
        """Answer the next `times` lists of `kind` with 200 and no items (a broken proxy in
        front of the server, or an etcd restored empty)."""
        with self._cond:
            self._faults.append(Fault("empty-list", kind, 200, False, times))

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
        raw = wire.dumps(obj)
        store[key] = Entry(key, self._rv, meta["uid"], raw)
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

    def _sorted_entries(self, kind: str) -> list[Entry]:
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

    def _take_fault(self, verb: str, kind: str | None) -> Fault | None:
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

"""The fake API server's HTTP side: the threaded stdlib server and its handler, and each
request routed, faults served, lists paginated over a snapshot, watches streamed (`Serving`,
a mixin of FakeAPIServer in server.py, whose state it reads)."""

from __future__ import annotations

import bisect
import json
import os
import time
import uuid
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from devkit.fakeapi import wire
from devkit.fakeapi.state import (
    JSON,
    REQUEST_LOG_ENV,
    RESOURCES,
    Fault,
    RequestRecord,
    ResourceInfo,
    Watch,
    log_request,
)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], fake: Any) -> None:  # a FakeAPIServer
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


class Serving:
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
        body = wire.read_body(h) if method in ("POST", "PUT", "PATCH") else b""
        query = dict(parse_qsl(parts.query, keep_blank_values=True))
        selector = query.get("fieldSelector") or ""
        if selector and not selector.startswith("metadata.name="):
            self._send_status(h, 400, f"field selector not supported by this fake: {selector}")
            return
        route = self._route(parts.path)
        info, namespace, name = route if route else (None, None, None)
        is_watch = query.get("watch") in ("true", "1")
        if method != "GET":
            verb = wire.VERBS.get(method, method.lower())
        elif name is not None or parts.path in wire.NON_RESOURCE_PATHS:
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
            log_request(os.environ[REQUEST_LOG_ENV], record)
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
        if info is None and method == "GET" and parts.path in wire.NON_RESOURCE_PATHS:
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
                missing = [f for f in wire.EVENT_REQUIRED if not body.get(f)]
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
                out = self._put(wire.merge(old, body), mode="update")
                code = 200
            self._cond.notify_all()
        self._send_json(h, code, wire.dumps(out))

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
        body = wire.dumps(wire.status(code, wire.reason(code), message))
        h.send_response(code)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        if retry_after is not None:
            h.send_header("Retry-After", str(retry_after))
        h.end_headers()
        h.wfile.write(body)

    def _serve_fault_stream(
        self, h: _Handler, fault: Fault, info: ResourceInfo | None, message: str
    ) -> None:
        """A 200 watch stream: the `before` lines, then an ERROR Status or garbled JSON."""
        lines: list[bytes] = []
        with self._cond:
            rv = self._rv
            entries = self._sorted_entries(info.kind) if info else []
        for shape in fault.before:
            if shape == "BOOKMARK" and info is not None:
                lines.append(wire.bookmark_line(info, rv))
            elif shape == "ADDED" and entries:
                lines.append(wire.event(b"ADDED", entries[0].raw))
        if fault.garbled:
            lines.append(b'{"type":"MODIFIED","object":{"kind":\n')
        else:
            status = wire.status(fault.status, wire.reason(fault.status), message)
            if fault.retry_after is not None:
                status["details"] = {"retryAfterSeconds": fault.retry_after}
            lines.append(wire.dumps({"type": "ERROR", "object": status}) + b"\n")
        self._start_stream(h)
        self._write_chunk(h, b"".join(lines))
        self._end_stream(h)

    def _serve_get(self, h: _Handler, info: ResourceInfo, namespace: str, name: str) -> None:
        with self._cond:
            entry = self._store[info.kind].get((namespace, name))
        if entry is None:
            body = wire.status(404, "NotFound", f'{info.plural} "{name}" not found')
            body["details"] = {"name": name, "kind": info.plural}
            self._send_json(h, 404, wire.dumps(body))
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
                    sid, offset = wire.decode_continue(token)
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
            meta["continue"] = wire.encode_continue(sid, end)
            meta["remainingItemCount"] = len(entries) - end
        body = b"".join(
            (
                b'{"kind":"',
                info.kind.encode(),
                b'List","apiVersion":"',
                info.api_version.encode(),
                b'","metadata":',
                wire.dumps(meta),
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
        wire.abort(h.connection)

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
                    wire.event(b"ADDED", e.raw)
                    for e in self._sorted_entries(kind)
                    if (namespace is None or e.key[0] == namespace)
                    and (not only_name or e.key[1] == only_name)
                ]
                cursor = self._log_base[kind] + len(log)
                if watch_list:  # KEP-3157: the end of the initial state is a bookmark
                    initial.append(wire.bookmark_line(info, self._rv, initial_events_end=True))
            elif since < self._dropped_rv[kind]:
                cursor = -1
            else:
                cursor = self._log_base[kind] + bisect.bisect_right(log, since, key=lambda e: e[0])
            if cursor >= 0:
                interval = self.bookmark_interval
                watch = Watch(info, cursor, bookmarks, now + interval if interval else float("inf"))
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

    def _stream(self, h: _Handler, w: Watch, namespace: str | None, deadline: float) -> None:
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
                        lines.append(wire.expired_line(w.cursor))
                        end = "close"
                        break
                    if w.cursor - base < len(log):
                        for _rv, type_, ns, raw in log[w.cursor - base :]:
                            if (namespace is None or ns == namespace) and (
                                w.name is None or json.loads(raw)["metadata"]["name"] == w.name
                            ):
                                lines.append(wire.event(type_, raw))
                        w.cursor = base + len(log)
                    while w.commands and end is None:
                        cmd = w.commands.popleft()
                        if cmd == "bookmark" and w.bookmarks:
                            lines.append(wire.bookmark_line(w.info, self._rv))
                        elif cmd == "expire":
                            lines.append(wire.expired_line(self._rv))
                            end = "close"
                        elif cmd in ("close", "abort"):
                            end = cmd
                    now = time.monotonic()
                    if end is None and now >= deadline:
                        end = "close"
                    if end is None and w.bookmarks and now >= w.next_bookmark:
                        lines.append(wire.bookmark_line(w.info, self._rv))
                        w.next_bookmark = now + (self.bookmark_interval or float("inf"))
                    if lines or end:
                        break
                    if wire.client_gone(h.connection):  # as the real server sees a closed stream
                        end = "abort"
                        break
                    wake = min(deadline, w.next_bookmark if w.bookmarks else deadline)
                    self._cond.wait(min(0.2, max(0.0, wake - now)))
            if end == "abort":
                h.close_connection = True
                wire.abort(h.connection)
                return
            if lines:
                self._write_chunk(h, b"".join(lines))
            if end == "close":
                self._end_stream(h)
                return


# What the real server refuses an events.k8s.io Event without (ValidateEventCreate).

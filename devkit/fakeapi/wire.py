"""The fake API server's wire format: Status bodies, watch events and bookmarks as bytes,
continue tokens, merge patches, reading a request's body."""

from __future__ import annotations

import base64
import contextlib
import json
import select
import socket
import struct
from http.server import BaseHTTPRequestHandler
from typing import Any

from devkit.fakeapi.state import JSON, ResourceInfo

NON_RESOURCE_PATHS = ("/readyz", "/livez", "/healthz")


def status(code: int, reason: str, message: str) -> JSON:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


REASONS = {
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
VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


def dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def abort(sock: socket.socket) -> None:
    """Drop a connection hard (RST on close), as a dying server or network would."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


EVENT_REQUIRED = ("eventTime", "reportingController", "reportingInstance", "action", "reason")


def read_body(h: BaseHTTPRequestHandler) -> bytes:
    try:
        length = int(h.headers.get("Content-Length") or 0)
    except ValueError:
        return b""
    return h.rfile.read(length) if 0 < length <= 1 << 20 else b""


def merge(old: JSON, patch: JSON) -> JSON:
    """A merge patch (what a strategic merge patch of plain fields amounts to)."""
    out = dict(old)
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge(out[k], v)
        else:
            out[k] = v
    return out


def client_gone(sock: socket.socket) -> bool:
    """The client closed its end (EOF readable) while the stream waits for news."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        if not readable:
            return False
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except (OSError, ValueError):
        return True


def reason(code: int) -> str:
    return REASONS.get(code, "Unknown")


def event(type_: bytes, raw: bytes) -> bytes:
    return b'{"type":"%s","object":%s}\n' % (type_, raw)


def bookmark_line(info: ResourceInfo, rv: int, *, initial_events_end: bool = False) -> bytes:
    meta: JSON = {"resourceVersion": str(rv)}
    if initial_events_end:
        meta["annotations"] = {"k8s.io/initial-events-end": "true"}
    obj = {"kind": info.kind, "apiVersion": info.api_version, "metadata": meta}
    return event(b"BOOKMARK", dumps(obj))


def expired_line(rv: int) -> bytes:
    body = status(410, "Expired", f"too old resource version: {rv}")
    return event(b"ERROR", dumps(body))


def encode_continue(sid: str, offset: int) -> str:
    return base64.urlsafe_b64encode(dumps({"s": sid, "o": offset})).decode()


def decode_continue(token: str) -> tuple[str, int]:
    try:
        data = json.loads(base64.urlsafe_b64decode(token.encode()))
        return str(data["s"]), int(data["o"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(token) from exc

"""HTTP messages, pure: a request's head framed and parsed from a connection's bytes, a
response's head, and the values handlers and the server pass (`Request`, `Response`,
`Park`). No sockets here: `server.py` reads and writes them.

A request head must be complete within the bounds a server sets (`max_request_line`,
`max_head`: 414 and 431), well formed (400), and GET or HEAD (405); `frame_request` says
which, or that more bytes are needed.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import parse_qs, urlsplit

_REASON_PHRASES = {
    200: "OK",
    400: "Bad Request",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    414: "URI Too Long",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    """Lower-cased names; a repeated header keeps its last value."""
    peer: str
    """The client's address (IPv4-mapped IPv6 addresses as plain IPv4)."""
    tag: object = None
    """What the listener was registered with (the health server: its port)."""
    accepted: float = 0.0
    """time.monotonic() of the accept."""


Body = bytes | Iterable[bytes]
"""bytes (sent with Content-Length) or chunks (sent chunked, streamed)."""


@dataclass(slots=True)
class Response:
    code: int
    content_type: str
    body: Body
    headers: dict[str, str] = field(default_factory=dict)


class Waiter(Protocol):
    """A parked request's answer, when it has one (`Park`)."""

    @property
    def deadline(self) -> float:
        """time.monotonic() by which `poll` must be called again (it answers by then)."""
        ...

    def poll(self, now: float) -> Response | None:
        """The answer once there is one; None: keep waiting. Called from the selector
        thread: must not block."""
        ...

    def cancel(self) -> None:
        """The client went away (or the server stops) before the answer."""
        ...


@dataclass(frozen=True, slots=True)
class Park:
    """A handler's "answer later": the connection waits in the selector, not in a thread.
    Whoever makes the answer ready calls `BoundedServer.wake()` (polls run at least every
    second and at the waiter's deadline anyway).

    `protected`: no bound ever closes the connection while it waits (the shutdown-manager's
    /shutdown: the kubelet takes a closed preStop as "done"). Otherwise a waiting connection
    may be closed as an idle one is, to make room for another peer."""

    waiter: Waiter
    protected: bool = False


Handle = Callable[[Request], "Response | Park"]


def is_loopback_peer(peer: str) -> bool:
    """A peer on this host's loopback (127.0.0.0/8, ::1): trusted by every server."""
    try:
        return ipaddress.ip_address(peer).is_loopback
    except ValueError:
        return False


def peer_key(peer: str) -> str:
    """Whose share a connection counts in: an IPv4 address, or an IPv6 address's /64 (one
    host, or one pod, can hold a whole /64: counting each address apart would let it take
    every slot). Anything else (not an address) as it is."""
    try:
        addr = ipaddress.ip_address(peer)
    except ValueError:
        return peer
    if addr.version == 4:
        return peer
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return str(addr.ipv4_mapped)
    return str(ipaddress.IPv6Network((int(addr) >> 64 << 64, 64)))


def head(code: int, headers: dict[str, str]) -> bytes:
    lines = [f"HTTP/1.1 {code} {_REASON_PHRASES.get(code, 'Error')}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def plain(code: int, message: str) -> bytes:
    """A whole small response, for refusals written from the selector thread."""
    body = message.encode()
    return (
        head(
            code,
            {
                "Content-Type": "text/plain; charset=utf-8",
                "Content-Length": str(len(body)),
                "Connection": "close",
            },
        )
        + body
    )


def parse_head(data: bytes) -> tuple[str, str, dict[str, str]]:
    """(method, target, headers) of a request head (without the blank line); ValueError
    if it is not one."""
    text = data.decode("latin-1")
    line, _, rest = text.partition("\r\n")
    parts = line.split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1.") or not parts[0].isalpha():
        raise ValueError("bad request line")
    headers: dict[str, str] = {}
    for h in rest.split("\r\n") if rest else ():
        name, sep, value = h.partition(":")
        if not sep or not name or name != name.strip():
            raise ValueError("bad header line")
        headers[name.lower()] = value.strip()
    return parts[0], parts[1], headers


def peer_address(addr: object) -> str:
    host = addr[0] if isinstance(addr, tuple) and addr else ""
    host = str(host).split("%", 1)[0]
    return host[7:] if host.startswith("::ffff:") and "." in host else host


@dataclass(frozen=True, slots=True)
class Refusal:
    """A request refused before any handler sees it: why (`server.REASONS`) and the whole
    reply."""

    reason: str
    reply: bytes


def frame_request(
    buf: bytes, peer: str, tag: object, accepted: float, *, max_request_line: int, max_head: int
) -> Request | Refusal | None:
    """What a connection's bytes so far make: None while the head is not complete, a
    Refusal (too large, malformed, not GET or HEAD), or the Request. Bytes past the head
    are ignored (one request per connection, no bodies)."""
    end = buf.find(b"\r\n\r\n")
    line_end = buf.find(b"\r\n")
    if (line_end < 0 and len(buf) > max_request_line) or line_end > max_request_line:
        return Refusal("too_large", plain(414, "request line too long\n"))
    if (end < 0 and len(buf) > max_head) or end > max_head:
        return Refusal("too_large", plain(431, "request head too large\n"))
    if end < 0:
        return None
    try:
        method, target, headers = parse_head(buf[:end])
    except ValueError:
        return Refusal("bad_request", plain(400, "bad request\n"))
    if method not in ("GET", "HEAD"):
        return Refusal(
            "method",
            plain(405, "only GET and HEAD\n").replace(
                b"Connection: close", b"Allow: GET, HEAD\r\nConnection: close"
            ),
        )
    url = urlsplit(target)
    return Request(method, url.path, parse_qs(url.query), headers, peer, tag, accepted)

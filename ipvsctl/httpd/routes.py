"""A route table on the bounded server (`server.py`: capped connections, idle and slow
clients cut, bounded request heads, GET and HEAD only), for the daemon's API and kube-proxy's
health port. A route returns (code, content type, body); the body is bytes or an iterable
of byte chunks (streamed, chunked encoding).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Collection, Iterable
from typing import Any

from ipvsctl.httpd.request import Park, Request, Response, is_loopback_peer
from ipvsctl.httpd.server import BoundedServer, Limits
from ipvsctl.httpd.sockets import listen_socket

# A route: (code, content type, body), or Park (answered later, holding no thread).
Handler = Callable[[dict[str, list[str]]], tuple[int, str, bytes | Iterable[bytes]] | Park]


def text(code: int, body: str) -> tuple[int, str, bytes]:
    return code, "text/plain; charset=utf-8", body.encode()


def as_json(code: int, doc: Any) -> tuple[int, str, bytes]:
    return code, "application/json", (json.dumps(doc, indent=1) + "\n").encode()


class HTTPServer:
    """`HTTPServer(listen, routes)` binds at once (a taken port raises OSError here) and
    serves from `start()` on its own thread until `stop()`.

    Paths in `local_only` answer 403 unless `is_local(peer)` (default: loopback peers). The
    same peers are the server's trusted ones: never refused or evicted by its bounds.

    Paths in `inline` (health probes) are answered by the server's selector thread as soon
    as they are read, never behind other requests: their handlers must be cheap and never
    block (no lock another thread holds for long, no I/O). An unknown path's 404 is too."""

    def __init__(
        self,
        listen: str,
        routes: dict[str, Handler],
        *,
        limits: Limits | None = None,
        name: str = "http",
        on_refused: Callable[[str], None] | None = None,
        local_only: Collection[str] = (),
        is_local: Callable[[str], bool] = is_loopback_peer,
        inline: Collection[str] = (),
    ) -> None:
        host, _, port = listen.rpartition(":")
        host = host.strip("[]") or "0.0.0.0"
        self.routes = dict(routes)
        self.local_only = frozenset(local_only)
        self.is_local = is_local
        self.inline = frozenset(inline)
        self.sock = listen_socket(host, int(port))
        self.server = BoundedServer(
            self._handle,
            name=name,
            limits=limits,
            on_refused=on_refused,
            trusted=is_local,
            inline=lambda req: req.path in self.inline or req.path not in self.routes,
        )
        self.server.add_listener(self.sock)
        self.thread = threading.Thread(target=self.server.serve, name=name, daemon=True)

    def _handle(self, req: Request) -> Response | Park:
        handler = self.routes.get(req.path)
        body: bytes | Iterable[bytes]
        if handler is None:
            code, ctype, body = text(404, "not found\n")
        elif req.path in self.local_only and not self.is_local(req.peer):
            code, ctype, body = text(403, f"{req.path} answers only clients on this node\n")
        else:
            answer = handler(req.query)
            if isinstance(answer, Park):
                return answer
            code, ctype, body = answer
        return Response(code, ctype, body)

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.server.close()
        if self.thread.ident is not None:
            self.thread.join(timeout=5)
        else:  # never started: serve() after close() only closes the sockets
            self.server.serve()

"""The daemon's HTTP endpoints: /metrics, /healthz, /readyz, /status, /v1/quiesced.

Routes on top of ipvsctl.httpd's bounded server (capped connections, idle and slow clients
cut, bounded request heads, GET and HEAD only). A route returns (code, content type, body);
the body is bytes or an iterable of byte chunks (streamed, chunked encoding).
"""

from __future__ import annotations

import ipaddress
import json
import threading
from collections.abc import Callable, Collection, Iterable
from typing import Any

from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ipvsctl.httpd import BoundedServer, Limits, Park, Request, Response, listen_socket

# A route: (code, content type, body), or Park (answered later, holding no thread).
Handler = Callable[[dict[str, list[str]]], tuple[int, str, bytes | Iterable[bytes]] | Park]


def text(code: int, body: str) -> tuple[int, str, bytes]:
    return code, "text/plain; charset=utf-8", body.encode()


def as_json(code: int, doc: Any) -> tuple[int, str, bytes]:
    return code, "application/json", (json.dumps(doc, indent=1) + "\n").encode()


def metrics_body(render: Callable[[], bytes]) -> Handler:
    return lambda q: (200, CONTENT_TYPE_LATEST, render())


def is_loopback(peer: str) -> bool:
    try:
        return ipaddress.ip_address(peer).is_loopback
    except ValueError:
        return False


class HTTPServer:
    """`HTTPServer(listen, routes)` binds at once (a taken port raises OSError here) and
    serves from `start()` on its own thread until `stop()`.

    Paths in `local_only` answer 403 unless `is_local(peer)` (default: loopback peers). The
    same peers are the server's trusted ones: never refused or evicted by its bounds."""

    def __init__(self, listen: str, routes: dict[str, Handler], *,
                 limits: Limits | None = None, name: str = "http",
                 on_refused: Callable[[str], None] | None = None,
                 local_only: Collection[str] = (),
                 is_local: Callable[[str], bool] = is_loopback) -> None:
        host, _, port = listen.rpartition(":")
        host = host.strip("[]") or "0.0.0.0"
        self.routes = dict(routes)
        self.local_only = frozenset(local_only)
        self.is_local = is_local
        self.sock = listen_socket(host, int(port))
        self.server = BoundedServer(self._handle, name=name, limits=limits,
                                    on_refused=on_refused, trusted=is_local)
        self.server.add_listener(self.sock)
        self.thread = threading.Thread(target=self.server.serve, name=name, daemon=True)

    def _handle(self, req: Request) -> Response | Park:
        handler = self.routes.get(req.path)
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

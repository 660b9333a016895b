"""The daemon's HTTP endpoints: /metrics, /healthz, /readyz, /status."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from prometheus_client.exposition import CONTENT_TYPE_LATEST

log = logging.getLogger("ipvsctl.http")

Handler = Callable[[dict[str, list[str]]], tuple[int, str, bytes]]


def text(code: int, body: str) -> tuple[int, str, bytes]:
    return code, "text/plain; charset=utf-8", body.encode()


def as_json(code: int, doc: Any) -> tuple[int, str, bytes]:
    return code, "application/json", (json.dumps(doc, indent=1) + "\n").encode()


def metrics_body(render: Callable[[], bytes]) -> Handler:
    return lambda q: (200, CONTENT_TYPE_LATEST, render())


class HTTPServer:
    def __init__(self, listen: str, routes: dict[str, Handler]) -> None:
        host, _, port = listen.rpartition(":")
        host = host.strip("[]") or "0.0.0.0"
        routes = dict(routes)

        class _Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                from urllib.parse import parse_qs

                url = urlsplit(self.path)
                handler = routes.get(url.path)
                try:
                    code, ctype, body = (handler(parse_qs(url.query)) if handler
                                         else text(404, "not found\n"))
                except Exception as exc:  # a bug in a handler must not kill the server
                    log.exception("http handler failed", extra={"fields": {"path": url.path}})
                    code, ctype, body = text(500, f"internal error: {exc}\n")
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # scrapes every few seconds would drown the log

        if ":" in host:
            class _Server(ThreadingHTTPServer):
                address_family = __import__("socket").AF_INET6

            self.server: ThreadingHTTPServer = _Server((host, int(port)), _Handler)
        else:
            self.server = ThreadingHTTPServer((host, int(port)), _Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name="http",
                                       daemon=True)

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

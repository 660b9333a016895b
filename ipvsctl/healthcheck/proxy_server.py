"""The server on `--healthz-bind-address` (kube-proxy's :10256): `/healthz` and `/livez`,
answered by `health.proxy`.

Its port is often still taken when ipvsctl starts: kube-proxy runs on the node until the
migration removes it. That is one error line and a count in
`ipvsctl_proxy_health_errors_total`, never a failed start; the port is tried again every
`retry_interval` seconds and taken as soon as it is free (one line when it is).

Both paths are answered by the HTTP server's selector thread as soon as they are read
(plain attributes, no lock): a load balancer's probe never waits behind another request.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable

from ipvsctl.healthcheck.proxy import ProxyState, answer
from ipvsctl.httpd import Handler, HTTPServer, is_loopback_peer
from ipvsctl.obs.logging import FailureStreaks, fields
from ipvsctl.obs.metrics import Metrics

log = logging.getLogger("ipvsctl.proxy_health")

PATHS = ("/healthz", "/livez")


class ProxyHealthServer:
    def __init__(
        self,
        address: str,
        state: Callable[[], ProxyState],
        metrics: Metrics,
        *,
        retry_interval: float = 5.0,
        trusted: Callable[[str], bool] = is_loopback_peer,
    ) -> None:
        self.address = address
        self.trusted = trusted  # the node's own peers: never refused (the kubelet)
        self.state = state
        self.metrics = metrics
        self.retry_interval = retry_interval
        self.http: HTTPServer | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._failing = FailureStreaks(log)  # never ended: one line while it lives

    def _route(self, path: str) -> Handler:
        def handle(query: dict[str, list[str]]) -> tuple[int, str, bytes]:
            code, body = answer(path, self.state())
            self.metrics.proxy_health_responses.labels(path, str(code)).inc()
            return code, "application/json", json.dumps(body, separators=(",", ":")).encode()

        return handle

    def open(self) -> bool:
        """Try to listen once; True when serving."""
        try:
            server = HTTPServer(
                self.address,
                {p: self._route(p) for p in PATHS},
                name="proxy-health",
                is_local=self.trusted,
                inline=PATHS,  # probes: answered at once by the selector thread
                on_refused=lambda r: self.metrics.http_refused.labels("proxy-health", r).inc(),
            )
        except (OSError, ValueError) as exc:
            self.metrics.proxy_health_errors.inc()
            return self._failed(exc)
        with self._lock:
            if self._closed:
                server.stop()
                return False
            self.http = server
        server.start()
        return True

    def _failed(self, exc: Exception) -> bool:
        self._failing.failed(
            logging.ERROR,
            "health server port not opened (kube-proxy still running?), retrying",
            address=self.address,
            error=exc,
            retry_in=self.retry_interval,
        )
        return False

    def run(self, stop: threading.Event) -> None:
        """Open the port, retrying while it is taken; return at `stop`. The thread lives as
        long as the daemon: the daemon's /healthz counts a thread that ended as dead."""
        while not stop.is_set():
            if self.open():
                log.info(
                    "health server listening", extra=fields(address=self.address, port=self.port)
                )
                stop.wait()
                return
            stop.wait(self.retry_interval)

    @property
    def port(self) -> int | None:
        return self.http.port if self.http is not None else None

    def close(self) -> None:
        with self._lock:
            self._closed = True
            server, self.http = self.http, None
        if server is not None:
            server.stop()

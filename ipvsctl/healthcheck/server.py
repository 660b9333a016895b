"""The healthCheckNodePort server: one thread multiplexing every health-check port.

`on_service` (a service listener on the engine's change feed, on the loop's thread) updates
the pure state and opens or closes ports; the thread (`run`) is ipvsctl.httpd's bounded
server with every port as a listener: request heads are read by its selector (a slow or
silent client holds no thread and is cut after a few seconds), every request is answered by
that same thread as soon as it is read (a probe never waits behind another), and
connections are capped. A
port that cannot be opened (already in use) is counted, logged once, and retried every
`retry_interval` seconds while its Service wants it.

Requests are answered whatever their path, as kube-proxy does: load balancers probe
`/healthz`, some probe `/`.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable

from ipvsctl.healthcheck.state import HealthState
from ipvsctl.httpd import (
    BoundedServer,
    Limits,
    Request,
    Response,
    is_loopback_peer,
    listen_socket,
)
from ipvsctl.model import DesiredService, ServiceRef
from ipvsctl.obs.logging import FailureStreaks, fields
from ipvsctl.obs.metrics import Metrics

log = logging.getLogger("ipvsctl.healthcheck")

# Load balancers probe every few seconds from a handful of addresses.
HEALTH_HTTP_LIMITS = Limits(max_connections=64, workers=2)


def listen_any(port: int) -> socket.socket:
    """A listening socket on every address of the node (kube-proxy listens on all too)."""
    return listen_socket(None, port)


class HealthServer:
    def __init__(
        self,
        node_name: str,
        *,
        metrics: Metrics | None = None,
        listen: Callable[[int], socket.socket] = listen_any,
        proxy_healthy: Callable[[], bool] = lambda: True,
        retry_interval: float = 5.0,
        trusted: Callable[[str], bool] = is_loopback_peer,
    ) -> None:
        self.state = HealthState(node_name)
        self.metrics = metrics
        self.listen = listen
        self.proxy_healthy = proxy_healthy
        self.retry_interval = retry_interval
        self._lock = threading.Lock()
        self._sockets: dict[int, socket.socket] = {}  # open ports
        self._failed = FailureStreaks(log)  # ports wanted but not open
        self._closed = False
        self._next_retry = 0.0
        # Every request is a probe, answered at once by the selector thread (a dict look-up
        # under a lock held only for dict updates): none waits behind another.
        self.http = BoundedServer(
            self._answer,
            name="health",
            limits=HEALTH_HTTP_LIMITS,
            on_refused=self._refused,
            inline=lambda req: True,
            trusted=trusted,  # the node's own peers: never refused
        )

    # --- the listener -----------------------------------------------------------------------
    def on_service(
        self, ref: ServiceRef, old: DesiredService | None, new: DesiredService | None
    ) -> None:
        """A service listener (the change feed): new counts, and ports opened or closed."""
        if (old is None or old.health_check_node_port is None) and (
            new is None or new.health_check_node_port is None
        ):
            return  # the common case: not an externalTrafficPolicy Local LoadBalancer
        with self._lock:
            changes = self.state.update(ref, new)
        for port in changes.close:
            self._close(port)
        for port in changes.open:
            self._open(port)
        if changes.open or changes.close:
            log.info(
                "health check ports",
                extra=fields(
                    service=ref,
                    opened=",".join(map(str, changes.open)) or "-",
                    closed=",".join(map(str, changes.close)) or "-",
                ),
            )

    def ports(self) -> list[int]:
        """The ports open now."""
        with self._lock:
            return sorted(self._sockets)

    def _open(self, port: int) -> None:
        try:
            sock = self.listen(port)
        except OSError as exc:
            if self.metrics is not None:
                self.metrics.health_check_errors.inc()
            self._failed.failed(
                logging.ERROR,
                "health check port not opened, retrying",
                key=port,
                port=port,
                error=exc,
            )
            return
        recovered = self._failed.recovered(None, key=port)
        with self._lock:
            if port not in self.state.by_port or self._closed:  # unwanted meanwhile
                sock.close()
                return
            self._sockets[port] = sock
        self.http.add_listener(sock, port)
        if recovered:
            log.info("health check port opened", extra=fields(port=port))
        self._gauge()

    def _close(self, port: int) -> None:
        self._failed.recovered(None, key=port)  # no longer wanted: no longer failing
        with self._lock:
            sock = self._sockets.pop(port, None)
        if sock is not None:
            self.http.remove_listener(sock)
        self._gauge()

    def _gauge(self) -> None:
        if self.metrics is not None:
            with self._lock:
                n = len(self._sockets)
            self.metrics.health_check_ports.set(n)

    # --- the thread -------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        self.http.serve(stop, tick=self._retry, tick_interval=min(1.0, self.retry_interval))

    def _retry(self) -> None:
        now = time.monotonic()
        if now < self._next_retry:
            return
        self._next_retry = now + self.retry_interval
        with self._lock:
            failed = sorted(
                p for p in self._failed.running() if isinstance(p, int) and p in self.state.by_port
            )
        for port in failed:
            self._open(port)

    def _answer(self, req: Request) -> Response:
        healthy = self.proxy_healthy()
        with self._lock:
            ans = self.state.answer(req.tag, healthy)  # type: ignore[arg-type]
        code, body = ans if ans is not None else (503, b"{}")  # closed meanwhile
        return Response(code, "application/json", body)

    def _refused(self, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.http_refused.labels("health", reason).inc()

    def close(self) -> None:
        """Close every port (daemon shutdown)."""
        with self._lock:
            self._closed = True
            socks = list(self._sockets.values())
            self._sockets.clear()
        for sock in socks:
            sock.close()
        self.http.close()

"""The healthCheckNodePort server: one thread multiplexing every health-check port.

`on_service` (an Engine service listener, on the loop's thread) updates the pure state and
opens or closes ports; the thread (`run`) accepts on all of them with one selector and
answers each connection on a short-lived thread: a slow or silent client never holds up
the others. A port that cannot be opened (already in use) is counted, logged once, and
retried every `retry_interval` seconds while its Service wants it.

Requests are answered whatever their path or method, as kube-proxy does: load balancers
probe `/healthz`, some probe `/`.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable

from ipvsctl.health.state import HealthState
from ipvsctl.model import DesiredService, ServiceRef
from ipvsctl.obs.logging import fields
from ipvsctl.obs.metrics import Metrics

log = logging.getLogger("ipvsctl.health")

MAX_REQUEST = 8192
READ_TIMEOUT = 5.0


def listen_socket(port: int) -> socket.socket:
    """A non-blocking listening TCP socket on every address of the node: dual-stack `::`
    where IPv6 exists, else 0.0.0.0 (kube-proxy listens on all addresses too)."""
    try:
        s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    except OSError as exc:
        if exc.errno not in (errno.EAFNOSUPPORT, errno.EPROTONOSUPPORT):
            raise
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        host = "0.0.0.0"
    else:
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        host = "::"
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, port))
        s.listen(128)
        s.setblocking(False)
    except OSError:
        s.close()
        raise
    return s


def response(code: int, body: bytes) -> bytes:
    reason = {200: "OK", 503: "Service Unavailable"}.get(code, "Error")
    head = (f"HTTP/1.1 {code} {reason}\r\nContent-Type: application/json\r\n"
            f"X-Content-Type-Options: nosniff\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n")
    return head.encode() + body


class HealthServer:
    def __init__(
        self,
        node_name: str,
        *,
        metrics: Metrics | None = None,
        listen: Callable[[int], socket.socket] = listen_socket,
        proxy_healthy: Callable[[], bool] = lambda: True,
        retry_interval: float = 5.0,
    ) -> None:
        self.state = HealthState(node_name)
        self.metrics = metrics
        self.listen = listen
        self.proxy_healthy = proxy_healthy
        self.retry_interval = retry_interval
        self._lock = threading.Lock()
        self._sockets: dict[int, socket.socket] = {}  # open ports
        self._failed: set[int] = set()  # wanted but not open
        self._pending: list[tuple[str, int, socket.socket | None]] = []  # for the thread
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._closed = False

    # --- the listener -----------------------------------------------------------------------
    def on_service(self, ref: ServiceRef, old: DesiredService | None,
                   new: DesiredService | None) -> None:
        """Engine service listener: new counts, and ports opened or closed."""
        if (old is None or old.health_check_node_port is None) and (
                new is None or new.health_check_node_port is None):
            return  # the common case: not an externalTrafficPolicy Local LoadBalancer
        with self._lock:
            changes = self.state.update(ref, new)
        for port in changes.close:
            self._close(port)
        for port in changes.open:
            self._open(port)
        if changes.open or changes.close:
            log.info("health check ports", extra=fields(
                service=ref, opened=",".join(map(str, changes.open)) or "-",
                closed=",".join(map(str, changes.close)) or "-"))

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
            with self._lock:
                first = port not in self._failed
                self._failed.add(port)
            if first:
                log.error("health check port not opened, retrying", extra=fields(
                    port=port, error=exc))
            return
        with self._lock:
            recovered = port in self._failed
            self._failed.discard(port)
            if port not in self.state.by_port or self._closed:  # unwanted meanwhile
                sock.close()
                return
            self._sockets[port] = sock
            self._pending.append(("add", port, sock))
        if recovered:
            log.info("health check port opened", extra=fields(port=port))
        self._gauge()
        self._wake()

    def _close(self, port: int) -> None:
        with self._lock:
            self._failed.discard(port)
            sock = self._sockets.pop(port, None)
            if sock is not None:
                self._pending.append(("remove", port, sock))
        self._gauge()
        self._wake()

    def _gauge(self) -> None:
        if self.metrics is not None:
            with self._lock:
                n = len(self._sockets)
            self.metrics.health_check_ports.set(n)

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    # --- the thread -------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        next_retry = 0.0
        while not stop.is_set():
            events = self._selector.select(timeout=min(1.0, self.retry_interval))
            self._apply_pending()
            for key, _ in events:
                if key.fileobj is self._wake_r:
                    with contextlib.suppress(OSError):
                        while self._wake_r.recv(4096):
                            pass
                    continue
                self._accept(key.fileobj, key.data)  # type: ignore[arg-type]
            now = time.monotonic()
            if now >= next_retry:
                next_retry = now + self.retry_interval
                with self._lock:
                    failed = sorted(p for p in self._failed if p in self.state.by_port)
                for port in failed:
                    self._open(port)

    def _apply_pending(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        for op, port, sock in pending:
            assert sock is not None
            if op == "add":
                self._selector.register(sock, selectors.EVENT_READ, port)
            else:
                with contextlib.suppress(KeyError, ValueError):
                    self._selector.unregister(sock)
                sock.close()

    def _accept(self, sock: socket.socket, port: int) -> None:
        try:
            conn, _ = sock.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            return  # closed meanwhile
        threading.Thread(target=self._handle, args=(conn, port), daemon=True,
                         name=f"health-{port}").start()

    def _handle(self, conn: socket.socket, port: int) -> None:
        try:
            conn.setblocking(True)
            conn.settimeout(READ_TIMEOUT)
            data = b""
            while b"\r\n\r\n" not in data and len(data) < MAX_REQUEST:
                chunk = conn.recv(4096)
                if not chunk:
                    break
                data += chunk
            healthy = self.proxy_healthy()
            with self._lock:
                ans = self.state.answer(port, healthy)
            if ans is not None:
                conn.sendall(response(*ans))
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        """Close every port (daemon shutdown)."""
        with self._lock:
            self._closed = True
            socks = list(self._sockets.values())
            self._sockets.clear()
            self._pending.clear()
        for sock in socks:
            sock.close()
        self._wake_r.close()
        self._wake_w.close()

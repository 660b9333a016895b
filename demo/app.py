"""The application in each backend pod: a small HTTP/1.1 server that says which pod
answered, and shuts down the way well-behaved apps do.

- Requests: `GET /?work=MS` takes MS milliseconds (the request's "work"): the answer, with
  `X-Pod: <pod>`, starts after a third of it and its body comes in three parts over the
  rest; keep-alive unless the client sends `Connection: close`.
- SIGTERM (after the pod's preStop delay): the listening socket is closed at once - new
  connections to the pod are refused from then on - but every open connection is served
  until its client closes it. The app exits when the last one is gone.
- SIGKILL (the pod's grace period is over): open connections are reset.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from collections.abc import Callable

from ipvsctl.kernel.host import enter_netns as enter


class App:
    def __init__(self, pod_name: str, netns: str, ip: str, port: int = 8080,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.pod = pod_name
        self.port = port
        self.clock = clock
        self.lock = threading.Lock()
        self.conns: set[socket.socket] = set()
        self.served = 0
        self.terminating = False
        self.killed = False
        self.exited = threading.Event()
        self.exited_at: float | None = None
        ready = threading.Event()
        errors: list[BaseException] = []

        def listen() -> None:
            try:
                enter(netns)
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind((ip, port))
                s.listen(128)
                self.sock = s
            except BaseException as exc:
                errors.append(exc)
                return
            finally:
                ready.set()
            self._accept_loop()

        self.thread = threading.Thread(target=listen, name=f"app-{pod_name}", daemon=True)
        self.thread.start()
        ready.wait()
        if errors:
            raise errors[0]

    # --- serving ------------------------------------------------------------------------
    def _accept_loop(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # the listener was closed: SIGTERM
            with self.lock:
                if self.killed:
                    conn.close()
                    return
                self.conns.add(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True,
                             name=f"app-{self.pod}-conn").start()

    def _serve(self, conn: socket.socket) -> None:
        buf = b""
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    data = conn.recv(4096)
                    if not data:
                        return
                    buf += data
                head, _, buf = buf.partition(b"\r\n\r\n")
                lines = head.decode(errors="replace").split("\r\n")
                work_ms = 0
                if "work=" in lines[0]:
                    with contextlib.suppress(ValueError):
                        work_ms = int(lines[0].split("work=", 1)[1].split()[0].split("&")[0])
                close = any(ln.lower() == "connection: close" for ln in lines[1:])
                # the work: a third before the answer starts, the body streamed in three
                # parts over the rest (so a request is "in flight" both ways for a while)
                body = f"hello from {self.pod}\n".encode().ljust(3 * 64)
                parts = [body[:64], body[64:128], body[128:]]
                head = (b"HTTP/1.1 200 OK\r\nX-Pod: " + self.pod.encode()
                        + b"\r\nContent-Length: " + str(len(body)).encode()
                        + (b"\r\nConnection: close" if close else b"") + b"\r\n\r\n")
                for k, part in enumerate(parts):
                    time.sleep(work_ms / 3000)
                    if self.killed:
                        return  # SIGKILL mid-request: the close below resets the connection
                    conn.sendall(head + part if k == 0 else part)
                with self.lock:
                    self.served += 1
                if close:
                    return
        except OSError:
            return
        finally:
            with contextlib.suppress(OSError):
                conn.close()
            with self.lock:
                self.conns.discard(conn)
                last = self.terminating and not self.conns
            if last:
                self._exit()

    def _exit(self) -> None:
        if not self.exited.is_set():
            self.exited_at = self.clock()
            self.exited.set()

    # --- signals --------------------------------------------------------------------------
    def sigterm(self) -> None:
        """Stop accepting (close the listener); finish the open connections."""
        with self.lock:
            self.terminating = True
            idle = not self.conns
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self.sock.close()
        if idle:
            self._exit()

    def sigkill(self) -> int:
        """Reset every open connection; returns how many there were."""
        with self.lock:
            self.killed = True
            conns = list(self.conns)
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self.sock.close()
        for c in conns:
            # linger 0: the close in _serve sends a reset; SHUT_RD wakes its recv()
            with contextlib.suppress(OSError):
                c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RD)
        self._exit()
        return len(conns)

    @property
    def open_connections(self) -> int:
        with self.lock:
            return len(self.conns)

"""The application in each backend pod: a small HTTP/1.1 server that says which pod
answered, and shuts down the way well-behaved apps do.

- Requests: `GET /?work=MS` takes MS milliseconds (the request's "work"): the answer, with
  `X-Pod: <pod>`, starts after a third of it and its body comes in three parts over the
  rest; keep-alive unless the client sends `Connection: close`.
- `GET /stream?for=MS&every=MS` (a download): the answer's head at once, then a line
  `tick N` every `every` ms for `for` ms, then the server closes. It does not need the
  client's side any more: a client that shuts down its write side after the request
  (half-close: the server reads EOF, its socket goes to CLOSE_WAIT) still gets every tick.
  What the server saw is kept in `streams` (when it read the EOF, its socket's TCP state).
  With `&eof=0` it does not wait for that EOF (a client that keeps its side open).
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

from ipvsctl.kernel.netns import enter_netns as enter


class App:
    def __init__(
        self,
        pod_name: str,
        netns: str,
        ip: str,
        port: int = 8080,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.pod = pod_name
        self.port = port
        self.clock = clock
        self.lock = threading.Lock()
        self.conns: set[socket.socket] = set()
        self.served = 0
        self.streams: list[dict[str, object]] = []
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
            threading.Thread(
                target=self._serve, args=(conn,), daemon=True, name=f"app-{self.pod}-conn"
            ).start()

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
                if lines[0].startswith("GET /stream"):
                    self._stream(conn, lines[0])
                    return
                close = any(ln.lower() == "connection: close" for ln in lines[1:])
                # the work: a third before the answer starts, the body streamed in three
                # parts over the rest (so a request is "in flight" both ways for a while)
                body = f"hello from {self.pod}\n".encode().ljust(3 * 64)
                parts = [body[:64], body[64:128], body[128:]]
                head = (
                    b"HTTP/1.1 200 OK\r\nX-Pod: "
                    + self.pod.encode()
                    + b"\r\nContent-Length: "
                    + str(len(body)).encode()
                    + (b"\r\nConnection: close" if close else b"")
                    + b"\r\n\r\n"
                )
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

    def _stream(self, conn: socket.socket, request_line: str) -> None:
        """The download: ticks for a while whether or not the client still sends."""
        query = dict(
            kv.split("=", 1)
            for kv in request_line.split()[1].partition("?")[2].split("&")
            if "=" in kv
        )
        duration = int(query.get("for", "10000")) / 1000
        every = int(query.get("every", "500")) / 1000
        peer = conn.getpeername()
        info: dict[str, object] = {
            "client": f"{peer[0]}:{peer[1]}",
            "start": self.clock(),
            "eof": None,
            "tcp_state": None,
            "ticks": 0,
            "end": None,
            "how": None,
        }
        with self.lock:
            self.streams.append(info)
        conn.sendall(
            b"HTTP/1.1 200 OK\r\nX-Pod: " + self.pod.encode() + b"\r\nConnection: close\r\n\r\n"
        )
        # The client half-closes right after its request: read its EOF, as a server that
        # is done reading does, then look at this socket's state as the kernel has it.
        # (`eof=0`: a client that keeps its side open, a plain stream: nothing to read.)
        if query.get("eof") != "0":
            conn.settimeout(5.0)
            with contextlib.suppress(OSError):
                if conn.recv(4096) == b"":
                    info["eof"] = self.clock()
                    info["tcp_state"] = tcp_state(conn)
            conn.settimeout(None)
        end = time.monotonic() + duration
        n = 0
        try:
            while time.monotonic() < end:
                time.sleep(min(every, max(0.0, end - time.monotonic())))
                if self.killed:
                    info["how"] = "reset (SIGKILL)"
                    return
                n += 1
                conn.sendall(f"tick {n}\n".encode())
                info["ticks"] = n
            info["how"] = "closed by the server"
        finally:
            info["end"] = self.clock()

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


TCP_STATES = {
    "01": "ESTABLISHED",
    "02": "SYN_SENT",
    "03": "SYN_RECV",
    "04": "FIN_WAIT1",
    "05": "FIN_WAIT2",
    "06": "TIME_WAIT",
    "07": "CLOSE",
    "08": "CLOSE_WAIT",
    "09": "LAST_ACK",
    "0A": "LISTEN",
    "0B": "CLOSING",
}


def tcp_state(conn: socket.socket) -> str | None:
    """This IPv4 socket's TCP state as the kernel shows it (/proc/net/tcp of the calling
    thread's network namespace: the pod's)."""

    def hexaddr(addr: tuple[str, int]) -> str:
        ip = socket.inet_aton(addr[0])[::-1].hex().upper()
        return f"{ip}:{addr[1]:04X}"

    local, remote = hexaddr(conn.getsockname()), hexaddr(conn.getpeername())
    with contextlib.suppress(OSError), open("/proc/thread-self/net/tcp") as f:
        for line in f.read().splitlines()[1:]:
            cols = line.split()
            if cols[1] == local and cols[2] == remote:
                return TCP_STATES.get(cols[3], cols[3])
    return None

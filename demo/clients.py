"""Client load through the virtual IP, from a client pod's network namespace.

- ShortLoad: new connection per request (`Connection: close`), at a steady rate, each
  request doing some work on the server (so some are always in flight).
- LongLived: keep-alive connections opened before the rollout that send a request every
  so often; one that breaks is counted and reopened.
- HalfClosed: one download (`GET /stream`) whose client shuts down its write side right
  after the request and then only reads: the server sees EOF and keeps sending.

Every request is recorded with its start and end (seconds on the demo's clock), the pod
that answered, and for a failure its kind: refused, reset, timeout, closed (EOF before
the answer).
"""

from __future__ import annotations

import contextlib
import errno
import queue
import random
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ipvsctl.kernel.netns import enter_netns as enter


class RequestFailed(Exception):
    def __init__(self, kind: str, detail: str = "") -> None:
        super().__init__(f"{kind}: {detail}" if detail else kind)
        self.kind = kind


def classify(exc: BaseException) -> str:
    if isinstance(exc, RequestFailed):
        return exc.kind
    if isinstance(exc, ConnectionRefusedError):
        return "refused"
    if isinstance(exc, ConnectionResetError | BrokenPipeError):
        return "reset"
    if isinstance(exc, TimeoutError | socket.timeout):
        return "timeout"
    if isinstance(exc, OSError) and exc.errno in (errno.ECONNREFUSED,):
        return "refused"
    return type(exc).__name__


def request(sock: socket.socket, work_ms: int, close: bool, buf: bytearray) -> str:
    """One request on an open connection; the answering pod. Raises on any failure."""
    sock.sendall(
        f"GET /?work={work_ms} HTTP/1.1\r\nHost: web\r\n"
        f"{'Connection: close' + chr(13) + chr(10) if close else ''}\r\n".encode()
    )
    while b"\r\n\r\n" not in buf:
        data = sock.recv(4096)
        if not data:
            raise RequestFailed("closed", "connection closed before the answer")
        buf += data
    head, _, rest = bytes(buf).partition(b"\r\n\r\n")
    headers = {}
    for line in head.decode(errors="replace").split("\r\n")[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    length = int(headers.get("content-length", "0"))
    while len(rest) < length:
        data = sock.recv(4096)
        if not data:
            raise RequestFailed("closed", "connection closed in the body")
        rest += data
    buf[:] = rest[length:]
    return headers.get("x-pod", "?")


def read_stream_head(sock: socket.socket) -> tuple[str | None, bytes]:
    """A `/stream` answer's head: the answering pod (`X-Pod`) and what came after the head."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        data = sock.recv(4096)
        if not data:
            raise RequestFailed("closed", "connection closed before the answer")
        buf += data
    head, _, rest = buf.partition(b"\r\n\r\n")
    pod = None
    for line in head.decode(errors="replace").split("\r\n")[1:]:
        k, _, v = line.partition(":")
        if k.strip().lower() == "x-pod":
            pod = v.strip()
    return pod, rest


@dataclass
class Record:
    start: float
    end: float
    ok: bool
    error: str | None
    pod: str | None
    conn: int | None = None  # long-lived connection number
    connect: float | None = None  # seconds the TCP handshake took (ShortLoad)


@dataclass
class ShortLoad:
    netns: str
    address: str
    port: int
    rate: float  # requests per second
    work_ms: tuple[int, int] = (100, 600)
    workers: int = 12
    timeout: float = 15.0
    clock: Callable[[], float] = time.monotonic
    seed: int = 7
    records: list[Record] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._jobs: queue.Queue[int | None] = queue.Queue()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._rng = random.Random(self.seed)
        self._threads = [
            threading.Thread(target=self._worker, daemon=True, name=f"short-{i}")
            for i in range(self.workers)
        ]
        self._pacer = threading.Thread(target=self._pace, daemon=True, name="short-pacer")

    def start(self) -> None:
        for t in self._threads:
            t.start()
        self._pacer.start()

    def stop(self) -> None:
        self._stop.set()
        self._pacer.join()
        for _ in self._threads:
            self._jobs.put(None)
        for t in self._threads:
            t.join(timeout=self.timeout + 5)

    def _pace(self) -> None:
        interval = 1.0 / self.rate
        nxt = time.monotonic()
        while not self._stop.is_set():
            self._jobs.put(self._rng.randint(*self.work_ms))
            nxt += interval
            self._stop.wait(max(0.0, nxt - time.monotonic()))

    def _worker(self) -> None:
        enter(self.netns)
        while True:
            work = self._jobs.get()
            if work is None:
                return
            start = self.clock()
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.settimeout(self.timeout)
            connected: float | None = None
            try:
                s.connect((self.address, self.port))
                connected = self.clock() - start
                pod = request(s, work, True, bytearray())
                rec = Record(start, self.clock(), True, None, pod, connect=connected)
            except Exception as exc:
                rec = Record(start, self.clock(), False, classify(exc), None, connect=connected)
            finally:
                s.close()
            with self._lock:
                self.records.append(rec)


@dataclass
class LongLived:
    netns: str
    address: str
    port: int
    connections: int = 3
    every: float = 1.0  # seconds between requests on one connection
    work_ms: int = 50
    timeout: float = 15.0
    clock: Callable[[], float] = time.monotonic
    records: list[Record] = field(default_factory=list)
    breaks: list[tuple[float, int, str | None, str]] = field(default_factory=list)
    closed: list[tuple[float, int, str | None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._run, args=(i,), daemon=True, name=f"long-{i}")
            for i in range(self.connections)
        ]
        self.opened = threading.Barrier(self.connections + 1)

    def start(self) -> None:
        for t in self._threads:
            t.start()
        self.opened.wait(timeout=60)  # all connected before the rollout starts

    def stop(self) -> None:
        """Close every connection cleanly (the client's choice: the connection survived)."""
        self._stop.set()
        for t in self._threads:
            t.join(timeout=self.timeout + 5)

    def _connect(self) -> socket.socket:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        s.connect((self.address, self.port))
        return s

    def _run(self, i: int) -> None:
        enter(self.netns)
        first = True
        sock: socket.socket | None = None
        pod: str | None = None
        buf = bytearray()
        while not self._stop.is_set():
            start = self.clock()
            try:
                if sock is None:
                    sock, buf = self._connect(), bytearray()
                pod = request(sock, self.work_ms, False, buf)
                rec = Record(start, self.clock(), True, None, pod, i)
            except Exception as exc:
                kind = classify(exc)
                rec = Record(start, self.clock(), False, kind, None, i)
                if sock is not None:
                    with self._lock:
                        self.breaks.append((rec.end, i, pod, kind))
                    with contextlib.suppress(OSError):
                        sock.close()
                sock, pod = None, None
            with self._lock:
                self.records.append(rec)
            if first:
                first = False
                with contextlib.suppress(threading.BrokenBarrierError):
                    self.opened.wait(timeout=60)
            self._stop.wait(self.every)
        if sock is not None:
            sock.close()
            with self._lock:
                self.closed.append((self.clock(), i, pod))


@dataclass
class HalfClosed:
    """One half-closed connection: the request, then `shutdown(SHUT_WR)` (the client's FIN),
    then every tick the server still sends is read and stamped, until the server closes (or
    the connection breaks)."""

    netns: str
    address: str
    port: int
    until: float  # the server streams until this time on the demo clock
    every_ms: int = 500
    timeout: float = 15.0
    clock: Callable[[], float] = time.monotonic
    half_close: bool = True  # False: a plain download (the service-delete demo)
    pod: str | None = None
    opened: float | None = None
    half_closed: float | None = None
    ticks: list[float] = field(default_factory=list)
    ended: float | None = None
    end: str | None = None  # "closed by the server", or the failure's kind

    def __post_init__(self) -> None:
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="half-closed")

    def start(self) -> None:
        self._thread.start()
        self._started.wait(timeout=60)

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def _run(self) -> None:
        enter(self.netns)
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        try:
            s.connect((self.address, self.port))
            self.opened = self.clock()
            ms = max(0, int((self.until - self.clock()) * 1000))
            s.sendall(
                f"GET /stream?for={ms}&every={self.every_ms} HTTP/1.1\r\nHost: web\r\n\r\n".encode()
            )
            if self.half_close:
                s.shutdown(socket.SHUT_WR)  # the client is done sending; it keeps reading
                self.half_closed = self.clock()
            self.pod, buf = read_stream_head(s)
            self._started.set()
            while True:
                while b"\n" in buf:
                    _, _, buf = buf.partition(b"\n")
                    self.ticks.append(self.clock())
                data = s.recv(4096)
                if not data:
                    self.end = "closed by the server"
                    break
                buf += data
        except Exception as exc:
            self.end = classify(exc)
        finally:
            self.ended = self.clock()
            self._started.set()
            s.close()

    def to_json(self) -> dict[str, object]:
        return {
            "pod": self.pod,
            "opened": self.opened,
            "half_closed": self.half_closed,
            "until": self.until,
            "ticks": self.ticks,
            "ended": self.ended,
            "end": self.end,
        }

"""Load that counts: every outcome kept, with its time on the lab clock.

- Short requests: a new TCP connection per request at a steady rate (demo/clients.py
  ShortLoad: an HTTP request with some server work, `Connection: close`); the handshake's
  time is kept for the connect p99. A failure is `refused`, `reset`, `timeout` or `closed`
  (EOF before the whole answer).
- Streams: long-lived downloads (`GET /stream` on demo/app.py: a line every `every` s for
  `length` s, then the server closes), each reopened as soon as it ends. A stream is cut when
  it ends any other way than the server's close (a FIN: the app only closes a stream at its
  end, a kill resets it): reset, or no line for `stall` s (a proxy that drops a connection's
  packets leaves its client waiting). A stream that does not connect and get its answer's
  head within a short request's timeout (10 s) is a failed new connection.
- UDP: DNS-like queries at a steady rate, each from a new socket (a new source port: a stub
  resolver) or from one fixed port (a forwarding cache), each with an id its answer echoes;
  a query fails when no answer comes within `timeout` (an answer that comes later, on the
  fixed port, is kept as `late`). A stall is the time from a failed query to the next
  answered one. The pods keep every query they got (dns.py): a failed query is either lost
  on the way or answered too late.

Every generator runs in the netns of its client (a pod on a node, or the outside client)
and is stopped with `stop()`, which lets open streams finish (a stream the lab ends is
not counted as cut).
"""

from __future__ import annotations

import errno
import itertools
import random
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from demo.clients import Record, ShortLoad, classify, read_stream_head
from ipvsctl.kernel.netns import enter_netns


@dataclass
class StreamRecord:
    client: str
    start: float
    end: float
    pod: str | None
    lines: int
    expected: int
    outcome: str  # "complete", or how it was cut: reset, closed, stalled, refused, ...

    @property
    def cut(self) -> bool:
        return self.outcome != "complete"


@dataclass
class Streams:
    """`count` streams from `netns` to address:port, each `length` s long, reopened at once."""

    name: str
    netns: str
    address: str
    port: int
    clock: Callable[[], float]
    count: int = 1
    length: float = 8.0
    every: float = 0.5
    stall: float = 5.0
    answer_timeout: float = 10.0  # to connect and get the head: a short request's timeout
    records: list[StreamRecord] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._run, daemon=True, name=f"stream-{self.name}-{i}")
            for i in range(self.count)
        ]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self, timeout: float = 60.0) -> None:
        """No new stream; the open ones run to their end."""
        self._stop.set()
        for t in self._threads:
            t.join(timeout)

    def _run(self) -> None:
        enter_netns(self.netns)
        while not self._stop.is_set():
            rec = self.one()
            with self._lock:
                self.records.append(rec)
            if rec.cut:
                self._stop.wait(0.2)  # a client backs off a little before it reopens

    def one(self) -> StreamRecord:
        start = self.clock()
        expected = int(self.length / self.every)
        lines, pod, outcome = 0, None, "complete"
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.settimeout(self.answer_timeout)
        try:
            s.connect((self.address, self.port))
            ms, every = int(self.length * 1000), int(self.every * 1000)
            s.sendall(
                f"GET /stream?for={ms}&every={every}&eof=0 HTTP/1.1\r\nHost: web\r\n\r\n".encode()
            )
            pod, buf = read_stream_head(s)
            s.settimeout(self.stall)  # from here on, a gap between lines is a cut
            while True:
                lines += buf.count(b"\n")
                buf = buf.rpartition(b"\n")[2]
                data = s.recv(4096)
                if not data:
                    break  # the server's close: the only clean end (a kill resets)
                buf += data
        except Exception as exc:
            kind = classify(exc)
            outcome = "stalled" if kind == "timeout" and lines else kind
        finally:
            s.close()
        return StreamRecord(self.name, start, self.clock(), pod, lines, expected, outcome)


_QUERY_IDS = itertools.count(1)


@dataclass
class UdpRecord:
    client: str
    qid: str  # the query's id, which the answer echoes and the pod keeps
    start: float
    end: float
    ok: bool
    pod: str | None
    fixed_port: bool
    late: float | None = None  # an answer that came after the timeout (fixed port only)


@dataclass
class UdpQueries:
    name: str
    netns: str
    address: str
    port: int
    clock: Callable[[], float]
    rate: float = 2.0
    timeout: float = 2.0
    fixed_share: float = 0.5  # queries sent from one fixed source port
    seed: int = 11
    records: list[UdpRecord] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._rng = random.Random(self.seed)
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"udp-{self.name}")
        self._by_qid: dict[str, UdpRecord] = {}

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(self.timeout + 30)

    def _run(self) -> None:
        enter_netns(self.netns)
        fixed = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        fixed.bind(("0.0.0.0", 0))
        nxt = time.monotonic()
        try:
            while not self._stop.is_set():
                use_fixed = self._rng.random() < self.fixed_share
                rec = self._query(fixed if use_fixed else None)
                self.records.append(rec)
                self._by_qid[rec.qid] = rec
                nxt += 1.0 / self.rate
                self._stop.wait(max(0.0, nxt - time.monotonic()))
        finally:
            fixed.close()

    def _answer(self, data: bytes) -> tuple[str, str]:
        pod, _, qid = data.decode(errors="replace").partition(" ")
        return pod, qid

    def _query(self, sock: socket.socket | None) -> UdpRecord:
        own = sock is None
        s = sock or socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        qid = f"{self.name}:{next(_QUERY_IDS)}"  # unique in the whole run
        start = self.clock()
        ok, pod = False, None
        try:
            s.settimeout(self.timeout)
            s.sendto(qid.encode(), (self.address, self.port))
            deadline = time.monotonic() + self.timeout
            while time.monotonic() < deadline:
                data, peer = s.recvfrom(2048)
                if peer[0] != self.address:
                    continue
                answered_by, answered = self._answer(data)
                if answered == qid:
                    ok, pod = True, answered_by
                    break
                self._late(answered)  # an earlier query's answer, after its timeout
        except OSError as exc:  # timeout, or ICMP port unreachable (ECONNREFUSED)
            if not isinstance(exc, TimeoutError) and exc.errno not in (errno.ECONNREFUSED,):
                raise
        finally:
            if own:
                s.close()
        return UdpRecord(self.name, qid, start, self.clock(), ok, pod, not own)

    def _late(self, qid: str) -> None:
        rec = self._by_qid.get(qid)
        if rec is not None and rec.late is None:
            rec.late = self.clock()


@dataclass
class Load:
    """A scenario's whole load: short requests, streams and UDP from several clients."""

    short: list[ShortLoad] = field(default_factory=list)
    short_names: list[str] = field(default_factory=list)
    streams: list[Streams] = field(default_factory=list)
    udp: list[UdpQueries] = field(default_factory=list)

    def add_short(
        self,
        name: str,
        netns: str,
        address: str,
        port: int,
        clock: Callable[[], float],
        rate: float,
    ) -> None:
        self.short.append(
            ShortLoad(
                netns, address, port, rate=rate, work_ms=(50, 300), workers=4, timeout=10.0,
                clock=clock, seed=len(self.short) + 7,
            )
        )  # fmt: skip
        self.short_names.append(name)

    def start(self) -> None:
        for g in self.short:
            g.start()
        for s in self.streams:
            s.start()
        for u in self.udp:
            u.start()
        self._stopped: set[int] = set()

    def stop_client(self, name: str) -> None:
        """Stop one client's generators (its pod is going away): no new request or stream,
        the open streams run to their end."""
        for g, n in zip(self.short, self.short_names, strict=True):
            if n == name:
                self._stop(g)
        for gen in (*self.udp, *self.streams):
            if gen.name == name:
                self._stop(gen)

    def _stop(self, gen: ShortLoad | Streams | UdpQueries) -> None:
        if id(gen) not in self._stopped:
            self._stopped.add(id(gen))
            gen.stop()

    def stop(self) -> None:
        for gen in (*self.short, *self.udp, *self.streams):
            self._stop(gen)

    def short_records(self) -> list[tuple[str, Record]]:
        return [
            (n, r) for g, n in zip(self.short, self.short_names, strict=True) for r in g.records
        ]

    def stream_records(self) -> list[StreamRecord]:
        return [r for s in self.streams for r in s.records]

    def udp_records(self) -> list[UdpRecord]:
        return [r for u in self.udp for r in u.records]

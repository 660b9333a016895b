"""One small bounded HTTP/1.1 server for every ipvsctl listener (the daemon's --listen, the
healthCheckNodePorts, the shutdown-manager).

Why not `http.server.ThreadingHTTPServer`: it starts a thread per connection with no cap and
no idle timeout, so a flood of idle connections holds as many threads, and a client sending
its headers one byte a second holds one for ever. Here:

- one thread (`serve`) accepts and reads request heads for every connection with a selector:
  an idle or slow connection costs a socket and a small buffer, never a thread;
- the whole request head must arrive within `header_timeout` (slowloris is cut), its request
  line and headers are bounded (414, 431), only GET and HEAD are served (405);
- bounds are per peer: an IPv4 address, or an IPv6 address's /64 (`peer_key`), so a flood
  from one host never refuses or evicts another's connection: a peer holds at most
  `max_per_peer` connections (one past that closes the same peer's oldest closable
  connection, or is refused); past `max_connections` in all, a new connection closes the
  oldest closable one of the peer holding the most (only if it holds at least two more
  than the newcomer), else it is refused with 503 at once. Closable: still sending its
  head, then stalled writing its answer, then parked unless `Park.protected`;
- trusted peers (`trusted(peer)`: loopback and the node's own addresses, where the
  kubelet's probes and a preStop come from) are never refused or evicted, count by their
  exact address, and for no other peer's share: their connections come on top of
  `max_connections`, so the kubelet probing never costs a stranger a slot;
- requests for which `inline(request)` is true (health probes: cheap, never blocking) are
  answered by the selector thread itself, as soon as their head is read: they never wait
  behind other requests in the worker pool;
- the others are answered by `workers` threads; one request per connection
  (`Connection: close`);
- an answer whose body is bytes is written by the selector thread without blocking (a
  client that does not read holds a socket, not a thread) within `write_timeout`; a
  streamed body (chunks) is written by a worker within the same timeout;
- a handler may answer `Park(waiter)` instead of a Response: the connection goes back to
  the selector, holding no thread, until the waiter has the answer (the shutdown-manager's
  /shutdown waits so, for as many callers as come; the daemon's /metrics waits for the
  next shared rendering). A parked connection whose client closes is dropped
  (`waiter.cancel()`).

Every refusal calls `on_refused(reason)` (the daemon counts them in
`ipvsctl_http_refused_total{server,reason}`); reasons are in `REASONS`.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import selectors
import socket
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ipvsctl.httpd.request import (
    Handle,
    Park,
    Refusal,
    Request,
    Response,
    frame_request,
    head,
    is_loopback_peer,
    peer_address,
    peer_key,
    plain,
)
from ipvsctl.obs.logging import fields

log = logging.getLogger("ipvsctl.http")

REASONS = ("busy", "evicted", "timeout", "too_large", "bad_request", "method", "forbidden")
LIMIT_LOG_INTERVAL = 60.0  # "connection limit reached" at most this often per server
# Writing answers shares the selector thread with reading requests (probes among them): a
# write event sends at most SEND_CHUNK bytes, and a turn of the loop writes for at most
# WRITE_SLICE seconds before it reads again (the rest are still writable: next turn).
SEND_CHUNK = 65536
WRITE_SLICE = 0.005


@dataclass(frozen=True, slots=True)
class Limits:
    max_connections: int = 64
    """Open connections of untrusted peers, whatever their state (trusted peers' come on
    top: they take no room from anyone)."""
    max_per_peer: int = 16
    """Open connections of one (untrusted) peer: an IPv4 address or an IPv6 /64."""
    workers: int = 4
    """Threads answering complete requests that are not answered inline."""
    header_timeout: float = 5.0
    """The whole request head must arrive within this many seconds of the accept."""
    write_timeout: float = 30.0
    """The whole response must be written within this many seconds."""
    max_request_line: int = 4096
    max_head: int = 16384
    """Request line plus headers."""

    def __post_init__(self) -> None:
        if self.max_connections < 1 or self.workers < 1 or self.max_per_peer < 1:
            raise ValueError("max_connections, max_per_peer and workers must be >= 1")


class _Conn:
    __slots__ = ("accepted", "buf", "deadline", "key", "peer", "sock", "tag", "trusted")

    def __init__(
        self,
        sock: socket.socket,
        peer: str,
        key: str,
        tag: object,
        now: float,
        limits: Limits,
        trusted: bool,
    ) -> None:
        self.sock, self.peer, self.key, self.tag, self.accepted = sock, peer, key, tag, now
        self.deadline = now + limits.header_timeout
        self.buf = b""
        self.trusted = trusted


class _Parked:
    __slots__ = ("conn", "protected", "req", "waiter")

    def __init__(self, conn: _Conn, req: Request, park: Park) -> None:
        self.conn, self.req, self.waiter, self.protected = conn, req, park.waiter, park.protected


class _Writing:
    """An answer being written by the selector thread: what is left of it."""

    __slots__ = ("bufs", "conn", "deadline", "path")

    def __init__(self, conn: _Conn, bufs: list[memoryview], deadline: float, path: str) -> None:
        self.conn, self.bufs, self.deadline, self.path = conn, bufs, deadline, path


class _Answered:
    """A worker's answer handed back to the selector thread (parked, or bytes to write)."""

    __slots__ = ("answer", "conn", "req")

    def __init__(self, conn: _Conn, req: Request, answer: Response | Park) -> None:
        self.conn, self.req, self.answer = conn, req, answer


_Victim = _Conn | _Parked | _Writing


class BoundedServer:
    """The selector thread (`serve`) and the worker pool; listeners are added and removed
    at any time from any thread."""

    def __init__(
        self,
        handle: Handle,
        *,
        name: str = "http",
        limits: Limits | None = None,
        on_refused: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        trusted: Callable[[str], bool] = is_loopback_peer,
        inline: Callable[[Request], bool] = lambda req: False,
    ) -> None:
        self.handle = handle
        self.name = name
        self.limits = limits or Limits()
        self.on_refused = on_refused
        self.clock = clock
        self.trusted = trusted
        self.inline = inline
        self.refused: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)  # busy, parked or writing went down
        self._busy = 0  # connections handed to the workers, not yet back or closed
        self._pending: list[tuple[str, socket.socket, object]] = []
        self._reading: OrderedDict[socket.socket, _Conn] = OrderedDict()  # oldest first
        # Per peer key: its open connections (reading, busy, parked, writing), and its
        # reading ones oldest first (the first a bound closes).
        self._per_peer: Counter[str] = Counter()
        self._trusted_open = 0  # open connections of trusted peers: outside the cap
        self._peer_reading: dict[str, OrderedDict[socket.socket, _Conn]] = {}
        self._parked: OrderedDict[socket.socket, _Parked] = OrderedDict()
        self._writing: OrderedDict[socket.socket, _Writing] = OrderedDict()
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._pool = ThreadPoolExecutor(self.limits.workers, thread_name_prefix=f"{name}-worker")
        self._stop = threading.Event()
        self._last_limit_log = -LIMIT_LOG_INTERVAL
        self._write_turn = 0
        self._poll_due = False  # parked requests to poll at the end of this turn
        self._next_poll = 0.0  # ... and no later than this

    # --- listeners (any thread) -------------------------------------------------------------
    def add_listener(self, sock: socket.socket, tag: object = None) -> None:
        sock.setblocking(False)
        with self._lock:
            self._pending.append(("add", sock, tag))
        self._wake()

    def remove_listener(self, sock: socket.socket) -> None:
        """Stop accepting on `sock` and close it (in the selector thread)."""
        with self._lock:
            self._pending.append(("remove", sock, None))
        self._wake()

    def open_connections(self) -> int:
        with self._lock:
            return len(self._reading) + self._busy + len(self._parked) + len(self._writing)

    def parked(self) -> int:
        with self._lock:
            return len(self._parked)

    def _key(self, peer: str) -> str:
        """The share a peer's connections count in: a trusted peer's own address, else its
        IPv4 address or IPv6 /64."""
        return peer if self.trusted(peer) else peer_key(peer)

    def connections_of(self, peer: str) -> int:
        """Open connections counted in `peer`'s share (its /64's, for IPv6)."""
        key = self._key(peer)
        with self._lock:
            return self._per_peer.get(key, 0)

    def wait_answered(self, timeout: float) -> bool:
        """Block until no request is parked, being answered or written (at most
        `timeout` s)."""
        with self._idle:
            return self._idle.wait_for(
                lambda: not self._parked and not self._busy and not self._writing, timeout
            )

    def wake(self) -> None:
        """A parked request's answer may be ready: poll now (any thread)."""
        self._wake()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    # --- the selector thread ----------------------------------------------------------------
    def serve(
        self,
        stop: threading.Event | None = None,
        tick: Callable[[], None] | None = None,
        tick_interval: float = 1.0,
    ) -> None:
        """Run until `stop` (or `close()`); `tick` is called about every `tick_interval`."""
        next_tick = 0.0
        while not self._stop.is_set() and not (stop is not None and stop.is_set()):
            now = self.clock()
            timeout = min(1.0, tick_interval)
            if self._reading:
                timeout = min(timeout, next(iter(self._reading.values())).deadline - now)
            if self._writing:
                timeout = min(timeout, next(iter(self._writing.values())).deadline - now)
            if self._parked:
                timeout = 0.0 if self._poll_due else min(timeout, self._next_poll - now)
            events = self._selector.select(max(0.0, timeout))
            self._apply_pending()
            writable: list[_Writing] = []
            for key, _ in events:
                data = key.data
                if key.fileobj is self._wake_r:
                    self._poll_due = True  # a parked answer may be ready
                    with contextlib.suppress(OSError):
                        while self._wake_r.recv(4096):
                            pass
                elif isinstance(data, _Conn):
                    if data.sock in self._reading:  # not evicted by an accept just now
                        self._read(data)
                elif isinstance(data, _Parked):
                    if self._parked.get(data.conn.sock) is data:
                        self._parked_readable(data)
                elif isinstance(data, _Writing):
                    writable.append(data)
                else:  # a listener: ("listener", tag)
                    self._accept(key.fileobj, data[1])  # type: ignore[arg-type]
            self._write_some(writable)
            self._expire(self.clock())
            now = self.clock()
            if self._parked and (self._poll_due or now >= self._next_poll):
                self._poll_parked(now)
            if tick is not None and self.clock() >= next_tick:
                next_tick = self.clock() + tick_interval
                tick()
        self._shutdown()

    def _apply_pending(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        for op, sock, tag in pending:
            if op == "add":
                # The tuple marks a listener (connections carry a _Conn).
                self._selector.register(sock, selectors.EVENT_READ, ("listener", tag))
            elif isinstance(tag, _Answered):  # a worker's: parked or written from here
                with self._lock:
                    self._busy -= 1  # counted below as parked or writing (or closed)
                self._respond(tag.conn, tag.req, tag.answer)
            else:
                with contextlib.suppress(KeyError, ValueError):
                    self._selector.unregister(sock)
                sock.close()

    def _accept(self, lsock: socket.socket, tag: object) -> None:
        for _ in range(64):  # drain the backlog a bit per wake-up, fairly
            try:
                sock, addr = lsock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return  # closed meanwhile, or out of file descriptors: try next round
            sock.setblocking(False)
            peer = peer_address(addr)
            trusted = self.trusted(peer)
            key = peer if trusted else peer_key(peer)
            if not self._admit(key, trusted):
                self._refuse(sock, "busy", plain(503, "too many connections\n"))
                continue
            conn = _Conn(sock, peer, key, tag, self.clock(), self.limits, trusted)
            with self._lock:
                self._reading[sock] = conn
                self._peer_reading.setdefault(key, OrderedDict())[sock] = conn
                self._per_peer[key] += 1
                self._trusted_open += trusted
            self._selector.register(sock, selectors.EVENT_READ, conn)

    def _admit(self, key: str, trusted: bool) -> bool:
        """Room for a new connection of peer `key`, made by closing another if fair (see
        the module docstring); False: refuse it. A trusted peer's is always admitted and
        takes no room (it comes on top of the cap)."""
        if trusted:
            return True
        with self._lock:
            mine = self._per_peer.get(key, 0)
            open_ = len(self._reading) + self._busy + len(self._parked) + len(self._writing)
            total = open_ - self._trusted_open
        if mine >= self.limits.max_per_peer:
            victim = self._oldest_of(key)
            if victim is None:
                return False
            self._evict(victim)
            return True
        if total < self.limits.max_connections:
            return True
        victim = self._victim(mine)
        if victim is None:
            return False
        self._evict(victim)
        return True

    def _oldest_of(self, key: str) -> _Victim | None:
        """The peer's oldest connection still sending its head, else its oldest answer
        stalled in writing, else its oldest parked one that is not protected."""
        reading = self._peer_reading.get(key)
        if reading:
            return next(iter(reading.values()))
        for w in self._writing.values():
            if w.conn.key == key:
                return w
        return next(
            (p for p in self._parked.values() if p.conn.key == key and not p.protected), None
        )

    def _victim(self, newcomer: int) -> _Victim | None:
        """Whom a new connection may displace at the cap: the oldest closable connection of
        the untrusted peer holding the most, if it holds at least two more than the
        newcomer's peer."""
        with self._lock:
            ranked = sorted(self._per_peer.items(), key=lambda kv: -kv[1])
        for key, n in ranked:
            if n < newcomer + 2:
                return None
            if self.trusted(key):
                continue
            victim = self._oldest_of(key)
            if victim is not None:
                return victim
        return None

    def _evict(self, victim: _Victim) -> None:
        if isinstance(victim, _Parked):
            self._unpark(victim, cancel=True, reason="evicted")
        elif isinstance(victim, _Writing):
            self._end_write(victim, reason="evicted")
        else:
            self._forget(victim)
            self._drop(victim, "evicted")

    def _read(self, conn: _Conn) -> None:
        try:
            chunk = conn.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._forget(conn)
            conn.sock.close()
            return
        conn.buf += chunk
        req = frame_request(
            conn.buf,
            conn.peer,
            conn.tag,
            conn.accepted,
            max_request_line=self.limits.max_request_line,
            max_head=self.limits.max_head,
        )
        if req is None:
            return  # the head is not complete yet
        if isinstance(req, Refusal):
            self._forget(conn)
            self._refuse(conn.sock, req.reason, req.reply)
            return
        self._forget(conn, keep_count=True)  # counted for its peer until closed
        if self.inline(req):  # a probe: answered here and now
            self._respond(conn, req, self._call(req))
            return
        with self._lock:
            self._busy += 1
        try:
            self._pool.submit(self._answer, conn, req)
        except RuntimeError:  # the pool is shut down: we are stopping
            self._closed(conn)

    def _call(self, req: Request) -> Response | Park:
        try:
            return self.handle(req)
        except Exception as exc:  # a bug in a handler must not kill the server
            log.exception("http handler failed", extra=fields(server=self.name, path=req.path))
            return Response(
                500, "text/plain; charset=utf-8", f"internal error: {type(exc).__name__}\n".encode()
            )

    def _respond(self, conn: _Conn, req: Request, answer: Response | Park) -> None:
        """(The selector thread.) Park the connection, write a bytes answer from here, or
        hand a streamed one to a worker."""
        if isinstance(answer, Park):
            parked = _Parked(conn, req, answer)
            with self._lock:
                self._parked[conn.sock] = parked
            self._poll_due = True  # its answer may be ready already (woken before it came)
            try:
                # Readable: the client closed (or sent more, which is read and dropped).
                self._selector.register(conn.sock, selectors.EVENT_READ, parked)
            except (OSError, ValueError):
                self._unpark(parked, cancel=True)
            return
        if answer.code == 403:
            self.count("forbidden")
        if isinstance(answer.body, bytes | bytearray):
            self._start_write(conn, req, answer)
            return
        with self._lock:
            self._busy += 1
        try:
            self._pool.submit(self._stream_and_close, conn, req, answer)
        except RuntimeError:  # stopping
            self._closed(conn)

    def _closed(self, conn: _Conn) -> None:
        """A connection handed to the workers is closed."""
        with contextlib.suppress(OSError):
            conn.sock.close()
        with self._lock:
            self._busy -= 1
            self._release(conn)
            self._idle.notify_all()

    def _forget(self, conn: _Conn, keep_count: bool = False) -> None:
        """Out of the reading set; `keep_count`: the connection lives on (answered)."""
        with self._lock:
            if self._reading.pop(conn.sock, None) is not None:
                reading = self._peer_reading.get(conn.key)
                if reading is not None:
                    reading.pop(conn.sock, None)
                    if not reading:
                        del self._peer_reading[conn.key]
                if not keep_count:
                    self._release(conn)
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(conn.sock)

    def _release(self, conn: _Conn) -> None:
        """One connection closed. Called with the lock held."""
        self._trusted_open -= conn.trusted
        self._per_peer[conn.key] -= 1
        if self._per_peer[conn.key] <= 0:
            del self._per_peer[conn.key]

    # --- answers written by the selector thread ---------------------------------------------
    def _start_write(self, conn: _Conn, req: Request, resp: Response) -> None:
        body = resp.body
        assert isinstance(body, bytes | bytearray)
        headers = {
            "Content-Type": resp.content_type,
            **resp.headers,
            "X-Content-Type-Options": "nosniff",
            "Connection": "close",
            "Content-Length": str(len(body)),
        }
        bufs = [memoryview(head(resp.code, headers))]
        if body and req.method != "HEAD":
            bufs.append(memoryview(body))  # shared with every other caller: never copied
        w = _Writing(conn, bufs, self.clock() + self.limits.write_timeout, req.path)
        with self._lock:
            self._writing[conn.sock] = w
        # A small answer (a probe's) goes at once; a large one waits its turns.
        if sum(map(len, bufs)) <= SEND_CHUNK and not self._send(w):
            return
        try:
            self._selector.register(conn.sock, selectors.EVENT_WRITE, w)
        except (OSError, ValueError):
            self._end_write(w)

    def _write_some(self, writable: list[_Writing]) -> None:
        """A chunk for each writable answer, starting a turn later each time (none
        starves), until WRITE_SLICE is spent."""
        if not writable:
            return
        self._write_turn += 1
        first = self._write_turn % len(writable)
        started = time.monotonic()
        for w in writable[first:] + writable[:first]:
            if self._writing.get(w.conn.sock) is w:
                self._send(w)
            if time.monotonic() - started > WRITE_SLICE:
                return

    def _send(self, w: _Writing) -> bool:
        """Send one chunk (at most SEND_CHUNK bytes); False: done (written, or the client
        went)."""
        chunk: list[memoryview] = []
        room = SEND_CHUNK
        for buf in w.bufs:
            if room <= 0:
                break
            chunk.append(buf[:room])
            room -= len(chunk[-1])
        try:
            n = w.conn.sock.sendmsg(chunk)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError as exc:  # the client went away
            if exc.errno not in (errno.EPIPE, errno.ECONNRESET):
                log.debug("http write failed", extra=fields(server=self.name, error=exc))
            self._end_write(w)
            return False
        while n and w.bufs:
            head_ = w.bufs[0]
            if n >= len(head_):
                n -= len(head_)
                w.bufs.pop(0)
            else:
                w.bufs[0], n = head_[n:], 0
        if w.bufs:
            return True
        self._end_write(w)
        return False

    def _end_write(self, w: _Writing, reason: str | None = None) -> None:
        with self._lock:
            if self._writing.pop(w.conn.sock, None) is None:
                return
            self._release(w.conn)
            self._idle.notify_all()
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(w.conn.sock)
        if reason is not None:
            self.count(reason)
        with contextlib.suppress(OSError):
            w.conn.sock.close()

    # --- parked requests (the selector thread) ------------------------------------------
    def _parked_readable(self, parked: _Parked) -> None:
        try:
            data = parked.conn.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:  # the client went away
            self._unpark(parked, cancel=True)

    def _poll_parked(self, now: float) -> None:
        """Poll every parked request: when woken, when one was parked, at the earliest
        waiter's deadline, and at least every second (not at every turn of the loop: with
        many parked, that would cost more than the writes it interleaves with)."""
        self._poll_due = False
        next_poll = now + 1.0
        for parked in list(self._parked.values()):
            try:
                resp = parked.waiter.poll(now)
            except Exception:  # a bug in a waiter must not kill the server
                log.exception(
                    "http parked request failed",
                    extra=fields(server=self.name, path=parked.req.path),
                )
                resp = Response(500, "text/plain; charset=utf-8", b"internal error\n")
            if resp is None:
                next_poll = min(next_poll, parked.waiter.deadline)
                continue
            with self._lock:
                self._parked.pop(parked.conn.sock, None)  # the peer's count goes on
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(parked.conn.sock)
            self._respond(parked.conn, parked.req, resp)
        self._next_poll = next_poll

    def _unpark(self, parked: _Parked, cancel: bool, reason: str | None = None) -> None:
        with self._lock:
            if self._parked.pop(parked.conn.sock, None) is None:
                return
            self._release(parked.conn)
            self._idle.notify_all()
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(parked.conn.sock)
        if cancel:
            with contextlib.suppress(Exception):
                parked.waiter.cancel()
        if reason is not None:
            self._refuse(parked.conn.sock, reason, b"")
        else:
            with contextlib.suppress(OSError):
                parked.conn.sock.close()

    def _expire(self, now: float) -> None:
        while self._reading:
            conn = next(iter(self._reading.values()))
            if conn.deadline > now:
                break
            self._forget(conn)
            self._refuse(
                conn.sock,
                "timeout",
                plain(408, "request head not received in time\n") if conn.buf else b"",
            )
        while self._writing:
            w = next(iter(self._writing.values()))
            if w.deadline > now:
                break
            log.debug("http write timed out", extra=fields(server=self.name, path=w.path))
            self._end_write(w)

    def _drop(self, conn: _Conn, reason: str) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(conn.sock)
        self._refuse(conn.sock, reason, b"")

    def _refuse(self, sock: socket.socket, reason: str, reply: bytes) -> None:
        """Count, answer what fits in the socket buffer without blocking, close."""
        self.count(reason)
        if reply:
            with contextlib.suppress(OSError):
                sock.send(reply)
                # Unread input at close() makes the kernel send a reset, which can destroy
                # the reply before the client reads it: drain what has arrived (bounded).
                for _ in range(16):
                    if not sock.recv(65536):
                        break
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_WR)
        sock.close()
        if reason in ("busy", "evicted"):
            now = self.clock()
            if now - self._last_limit_log >= LIMIT_LOG_INTERVAL:
                self._last_limit_log = now
                log.warning(
                    "http connection limit reached, closing connections",
                    extra=fields(
                        server=self.name,
                        max_connections=self.limits.max_connections,
                        refused=dict(self.refused),
                    ),
                )

    def count(self, reason: str) -> None:
        with self._lock:
            self.refused[reason] += 1
        if self.on_refused is not None:
            self.on_refused(reason)

    # --- the workers ------------------------------------------------------------------------
    def _answer(self, conn: _Conn, req: Request) -> None:
        answer = self._call(req)
        if isinstance(answer, Response) and not isinstance(answer.body, bytes | bytearray):
            if answer.code == 403:
                self.count("forbidden")
            self._stream_and_close(conn, req, answer)
            return
        # Parked or bytes: back to the selector, which holds it without a thread.
        with self._lock:
            self._pending.append(("answer", conn.sock, _Answered(conn, req, answer)))
        self._wake()

    def _stream_and_close(self, conn: _Conn, req: Request, resp: Response) -> None:
        """Write a streamed (chunked) response and close (a worker)."""
        sock = conn.sock
        try:
            sock.setblocking(True)
            sock.settimeout(self.limits.write_timeout)
            self._write_chunked(sock, req, resp)
        except OSError as exc:  # the client went away or was too slow to read
            if exc.errno not in (errno.EPIPE, errno.ECONNRESET, None) and not isinstance(
                exc, TimeoutError
            ):
                log.debug("http write failed", extra=fields(server=self.name, error=exc))
        except Exception:  # a streamed body failing half-way: the client sees a cut stream
            log.exception("http response failed", extra=fields(server=self.name, path=req.path))
        finally:
            self._closed(conn)

    def _write_chunked(self, sock: socket.socket, req: Request, resp: Response) -> None:
        headers = {
            "Content-Type": resp.content_type,
            **resp.headers,
            "X-Content-Type-Options": "nosniff",
            "Connection": "close",
            "Transfer-Encoding": "chunked",
        }
        deadline = time.monotonic() + self.limits.write_timeout
        chunks = resp.body
        assert not isinstance(chunks, bytes | bytearray)
        try:
            sock.sendall(head(resp.code, headers))
            if req.method == "HEAD":
                return
            for chunk in chunks:
                if not chunk:
                    continue
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("response not written in time")
                sock.settimeout(left)
                sock.sendall(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
            sock.sendall(b"0\r\n\r\n")
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()

    # --- stopping ---------------------------------------------------------------------------
    def close(self) -> None:
        """Stop `serve` (from another thread); it closes every socket on its way out."""
        self._stop.set()
        self._wake()

    def _shutdown(self) -> None:
        if self._selector.get_map() is None:
            return  # already done
        self._apply_pending()
        for key in list(self._selector.get_map().values()):
            if key.fileobj is not self._wake_r:
                with contextlib.suppress(OSError):
                    key.fileobj.close()  # type: ignore[union-attr]
        with self._lock:
            self._reading.clear()
            self._peer_reading.clear()
            parked, self._parked = list(self._parked.values()), OrderedDict()
            self._writing.clear()
            self._idle.notify_all()
        for p in parked:  # their sockets were closed above
            with contextlib.suppress(Exception):
                p.waiter.cancel()
        self._selector.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._wake_r.close()
        self._wake_w.close()

"""The bounded HTTP server on loopback: slow and idle clients, floods, oversized and
non-GET requests, streaming, and the daemon wrapper's local-only paths."""

from __future__ import annotations

import socket
import threading
import time
import urllib.request
from collections.abc import Iterator

import pytest

from ipvsctl.httpd import HTTPServer, Limits, text


def _get(port: int, path: str = "/ok", timeout: float = 5.0) -> tuple[int, bytes]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"http://127.0.0.1:{port}{path}", timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _raw(port: int, data: bytes, timeout: float = 5.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


@pytest.fixture
def server() -> Iterator[tuple[HTTPServer, list[str]]]:
    refused: list[str] = []
    srv = HTTPServer(
        "127.0.0.1:0",
        {
            "/ok": lambda q: text(200, "ok\n"),
            "/stream": lambda q: (200, "text/plain", (b"line %d\n" % i for i in range(1000))),
            "/secret": lambda q: text(200, "secret\n"),
        },
        limits=Limits(max_connections=20, workers=2, header_timeout=1.0),
        on_refused=refused.append,
        local_only={"/secret"},
        is_local=lambda peer: False,
    )
    srv.start()
    yield srv, refused
    srv.stop()


def _threads() -> int:
    return threading.active_count()


def test_get_and_head(server: tuple[HTTPServer, list[str]]) -> None:
    srv, _ = server
    assert _get(srv.port) == (200, b"ok\n")
    reply = _raw(srv.port, b"HEAD /ok HTTP/1.1\r\nHost: x\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 200 ") and reply.endswith(b"\r\n\r\n")
    assert b"Content-Length: 3" in reply
    assert _get(srv.port, "/nope")[0] == 404


def test_streamed_body_is_chunked_and_complete(server: tuple[HTTPServer, list[str]]) -> None:
    srv, _ = server
    code, body = _get(srv.port, "/stream")
    assert code == 200
    assert body == b"".join(b"line %d\n" % i for i in range(1000))


def test_only_get_and_head(server: tuple[HTTPServer, list[str]]) -> None:
    srv, refused = server
    reply = _raw(srv.port, b"POST /ok HTTP/1.1\r\nContent-Length: 0\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 405 ") and b"Allow: GET, HEAD" in reply
    assert _raw(srv.port, b"garbage\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    assert refused == ["method", "bad_request"]


def test_oversized_request_line_and_head(server: tuple[HTTPServer, list[str]]) -> None:
    srv, refused = server
    long_line = b"GET /" + b"a" * 10000 + b" HTTP/1.1\r\n\r\n"
    assert _raw(srv.port, long_line).startswith(b"HTTP/1.1 414 ")
    big_head = b"GET /ok HTTP/1.1\r\n" + b"X-A: " + b"b" * 3000 + b"\r\n"
    assert _raw(srv.port, big_head * 10 + b"\r\n").startswith(b"HTTP/1.1 431 ")
    assert refused == ["too_large", "too_large"]
    assert _get(srv.port) == (200, b"ok\n")


def test_slowloris_is_cut(server: tuple[HTTPServer, list[str]]) -> None:
    """Headers one byte at a time never complete: the connection is closed at the header
    timeout (1 s here), long before the client would finish."""
    srv, refused = server
    request = b"GET /ok HTTP/1.1\r\nHost: slow\r\nX-Pad: " + b"p" * 100 + b"\r\n\r\n"
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
    started = time.monotonic()
    cut = False
    try:
        for byte in request:
            try:
                s.send(bytes([byte]))
            except OSError:
                cut = True
                break
            s.settimeout(0.1)
            try:
                data = s.recv(4096)
            except TimeoutError:
                continue
            cut = True  # a 408 or EOF before the head was complete
            assert data == b"" or data.startswith(b"HTTP/1.1 408 ")
            break
    finally:
        s.close()
    assert cut
    assert time.monotonic() - started < 4
    assert refused == ["timeout"]


def test_idle_flood_keeps_threads_bounded_and_serves(server: tuple[HTTPServer, list[str]]) -> None:
    srv, refused = server
    # In batches the accept backlog can hold, each taken by the server before the next (a
    # client whose SYN meets a full backlog waits seconds for its retry).
    idle: list[socket.socket] = []
    try:
        for _ in range(10):
            idle += [socket.create_connection(("127.0.0.1", srv.port)) for _ in range(50)]
            deadline = time.monotonic() + 30
            while (
                refused.count("evicted") + srv.server.open_connections() < len(idle)
                and time.monotonic() < deadline
            ):
                time.sleep(0.01)
        assert refused.count("evicted") >= 480
        assert srv.server.open_connections() <= 20
        assert _get(srv.port) == (200, b"ok\n")  # a real client still gets in
        # This server's threads only: other tests' threads may still be ending meanwhile.
        mine = [t for t in threading.enumerate() if t.name.startswith(f"{srv.server.name}-worker")]
        assert 0 < len(mine) <= srv.server.limits.workers
        assert srv.server.open_connections() <= 20
    finally:
        for s in idle:
            s.close()


def test_busy_workers_refuse_new_connections_with_503() -> None:
    release = threading.Event()
    started = threading.Semaphore(0)

    def slow(q: dict[str, list[str]]) -> tuple[int, str, bytes]:
        started.release()
        release.wait(10)
        return text(200, "slow\n")

    refused: list[str] = []
    srv = HTTPServer(
        "127.0.0.1:0",
        {"/slow": slow},
        is_local=lambda peer: False,
        limits=Limits(max_connections=2, workers=2),
        on_refused=refused.append,
    )
    srv.start()
    try:
        results: list[tuple[int, bytes]] = []
        clients = [
            threading.Thread(target=lambda: results.append(_get(srv.port, "/slow")))
            for _ in range(2)
        ]
        for c in clients:
            c.start()
        assert started.acquire(timeout=5) and started.acquire(timeout=5)
        assert _get(srv.port, "/slow")[0] == 503
        assert refused == ["busy"]
        release.set()
        for c in clients:
            c.join(5)
        assert results == [(200, b"slow\n")] * 2
    finally:
        release.set()
        srv.stop()


def test_local_only_paths_refuse_other_peers(server: tuple[HTTPServer, list[str]]) -> None:
    srv, refused = server
    assert _get(srv.port, "/secret")[0] == 403
    assert _get(srv.port, "/ok")[0] == 200
    assert refused == ["forbidden"]


def test_handler_error_is_500_and_server_lives() -> None:
    def boom(q: dict[str, list[str]]) -> tuple[int, str, bytes]:
        raise RuntimeError("bug")

    srv = HTTPServer("127.0.0.1:0", {"/boom": boom, "/ok": lambda q: text(200, "ok\n")})
    srv.start()
    try:
        assert _get(srv.port, "/boom")[0] == 500
        assert _get(srv.port, "/ok") == (200, b"ok\n")
    finally:
        srv.stop()


def test_taken_port_raises_at_construction() -> None:
    a = HTTPServer("127.0.0.1:0", {})
    try:
        with pytest.raises(OSError):
            HTTPServer(f"127.0.0.1:{a.port}", {})
    finally:
        a.stop()


def _connect(port: int, peer: str) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(peer, 0))


def _ask(s: socket.socket, path: str = "/healthz") -> int:
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    data = b""
    while chunk := s.recv(4096):
        data += chunk
    return int(data.split()[1]) if data else 0


def test_a_flood_from_one_peer_never_refuses_or_evicts_another_peers_probes() -> None:
    """Regression: an idle flood from one address evicted other clients' connections (the
    kubelet's probes failed 1-4 of 10-25). Bounds are per peer now: 127.0.0.3 floods,
    127.0.0.2 probes as the kubelet does (connect, then send), neither trusted."""
    refused: list[str] = []
    srv = HTTPServer(
        "127.0.0.1:0",
        {"/healthz": lambda q: text(200, "ok\n")},
        is_local=lambda peer: peer == "127.0.0.1",
        limits=Limits(max_connections=64, max_per_peer=16, workers=2),
        on_refused=refused.append,
    )
    srv.start()
    flood: list[socket.socket] = []
    try:
        waiting = _connect(srv.port, "127.0.0.2")  # opened before the flood, sent after
        codes = []
        for _round in range(25):
            flood += [_connect(srv.port, "127.0.0.3") for _ in range(20)]
            with _connect(srv.port, "127.0.0.2") as probe:
                codes.append(_ask(probe))
        assert codes == [200] * 25
        assert _ask(waiting) == 200
        waiting.close()
        assert refused.count("evicted") >= 400  # the flood's own connections only
        assert srv.server.connections_of("127.0.0.3") <= 16
        # A trusted peer is never refused, even past the cap.
        with _connect(srv.port, "127.0.0.1") as local:
            assert _ask(local) == 200
    finally:
        for s in flood:
            s.close()
        srv.stop()


def test_the_cap_makes_room_from_the_heaviest_peer_only() -> None:
    srv = HTTPServer(
        "127.0.0.1:0",
        {"/healthz": lambda q: text(200, "ok\n")},
        is_local=lambda peer: False,
        limits=Limits(max_connections=8, max_per_peer=8, workers=1),
    )
    srv.start()
    try:
        early = _connect(srv.port, "127.0.0.2")
        heavy = [_connect(srv.port, "127.0.0.3") for _ in range(7)]
        # At the cap: a newcomer displaces the heaviest peer's oldest, never 127.0.0.2's.
        with _connect(srv.port, "127.0.0.4") as newcomer:
            assert _ask(newcomer) == 200
        assert _ask(early) == 200
        early.close()
        for s in heavy:
            s.close()
    finally:
        srv.stop()


# --- the pure part: a request head framed from a connection's bytes --------------------------
@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"GET /healthz HTTP/1.1\r\nHost: x\r\n", None),  # not complete yet
        (
            b"GET /v1/quiesced?ip=10.0.0.1 HTTP/1.1\r\nHost: x\r\n\r\n",
            ("GET", "/v1/quiesced", {"ip": ["10.0.0.1"]}, {"host": "x"}),
        ),
        (b"HEAD / HTTP/1.0\r\n\r\n", ("HEAD", "/", {}, {})),
        (b"POST / HTTP/1.1\r\n\r\n", ("method", 405)),
        (b"GET /\r\n\r\n", ("bad_request", 400)),
        (b"GET / HTTP/1.1\r\n bad: header\r\n\r\n", ("bad_request", 400)),
        (b"GET /" + b"a" * 100 + b" HTTP/1.1\r\n\r\n", ("too_large", 414)),
        (b"GET /" + b"a" * 100, ("too_large", 414)),  # no line end yet, already too long
        (b"GET / HTTP/1.1\r\nX: " + b"a" * 300 + b"\r\n\r\n", ("too_large", 431)),
    ],
    ids=[
        "incomplete",
        "query",
        "head",
        "post",
        "no-version",
        "header-space",
        "long-line",
        "long-partial-line",
        "long-head",
    ],
)
def test_frame_request(data: bytes, expected: object) -> None:
    from ipvsctl.httpd.request import Refusal, Request, frame_request

    got = frame_request(data, "192.0.2.1", None, 5.0, max_request_line=64, max_head=256)
    if expected is None:
        assert got is None
    elif isinstance(got, Request):
        assert (got.method, got.path, got.query, got.headers) == expected
        assert (got.peer, got.accepted) == ("192.0.2.1", 5.0)
    else:
        assert isinstance(got, Refusal)
        reason, code = expected  # type: ignore[misc]
        assert got.reason == reason and got.reply.startswith(f"HTTP/1.1 {code} ".encode())


def test_a_client_that_does_not_read_holds_no_worker() -> None:
    """Answers in bytes are written by the selector thread, a chunk at a time: a client
    that never reads its 8 MB answer holds a socket, and the one worker answers others
    meanwhile; a client that reads gets every byte."""
    big = bytes(range(256)) * (8 * 4096)
    srv = HTTPServer(
        "127.0.0.1:0",
        {
            "/big": lambda q: (200, "application/octet-stream", big),
            "/ok": lambda q: text(200, "ok\n"),
        },
        limits=Limits(workers=1),
    )
    srv.start()
    try:
        stuck = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
        stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stuck.sendall(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
        for _ in range(5):
            assert _get(srv.port) == (200, b"ok\n")
        code, body = _get(srv.port, "/big")
        assert code == 200 and body == big
        stuck.close()
    finally:
        srv.stop()

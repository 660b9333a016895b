"""A scrape flood and a prober, for the daemon's HTTP under load (the lab's flood test and
bench/http_flood.py).

    python -m devkit.httpflood --host H --port P [--path /metrics] --sources A,B,C,D
                               [--per-source 16] [--seconds 30]

The flood: `per-source` connections from each source address (bound before connecting),
each asking `path` again as soon as its last answer ended (connect, GET, read to the end,
close), for `seconds`, from one process and one thread (a selector), so the flood costs
the machine little beside the server it loads. Bounded in time and count: it stops by
itself. Prints one JSON line: scrapes answered (by code), errors, bytes, the answers'
latencies (ms).

`probe(...)`: what the kubelet does, from another address: a GET every `interval` seconds,
each timed from connect to the whole answer.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import selectors
import socket
import statistics
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field


def _ms(values: list[float]) -> dict[str, float | int | None]:
    if not values:
        return {"n": 0}
    s = sorted(values)

    def pct(p: float) -> float:
        return round(s[max(0, min(len(s) - 1, -(-len(s) * p // 100) - 1))] * 1000, 1)

    return {
        "n": len(s),
        "p50": pct(50),
        "p90": pct(90),
        "p99": pct(99),
        "max": round(s[-1] * 1000, 1),
        "mean": round(statistics.fmean(s) * 1000, 1),
    }


@dataclass
class _Slot:
    source: str
    sock: socket.socket | None = None
    started: float = 0.0
    buf: bytearray = field(default_factory=bytearray)
    sent: bool = False


def flood(
    host: str,
    port: int,
    sources: list[str],
    per_source: int = 16,
    seconds: float = 30.0,
    path: str = "/metrics",
) -> dict[str, object]:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    request = f"GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
    sel = selectors.DefaultSelector()
    codes: Counter[int] = Counter()
    errors: Counter[str] = Counter()
    latencies: list[float] = []
    received = 0
    end = time.monotonic() + seconds

    def start(slot: _Slot) -> None:
        s = socket.socket(family, socket.SOCK_STREAM)
        s.setblocking(False)
        s.bind((slot.source, 0))
        slot.sock, slot.started, slot.buf, slot.sent = s, time.monotonic(), bytearray(), False
        with contextlib.suppress(BlockingIOError):
            s.connect((host, port))
        sel.register(s, selectors.EVENT_WRITE, slot)

    def finish(slot: _Slot, error: str | None) -> None:
        nonlocal received
        assert slot.sock is not None
        sel.unregister(slot.sock)
        slot.sock.close()
        if error is not None:
            errors[error] += 1
        elif slot.buf.startswith(b"HTTP/1."):
            codes[int(slot.buf.split(b" ", 2)[1])] += 1
            latencies.append(time.monotonic() - slot.started)
            received += len(slot.buf)
        else:
            errors["closed without an answer"] += 1
        if time.monotonic() < end:
            start(slot)

    slots = [_Slot(src) for src in sources for _ in range(per_source)]
    for slot in slots:
        start(slot)
    while time.monotonic() < end and sel.get_map():
        for key, _ in sel.select(0.5):
            slot = key.data
            assert slot.sock is not None
            if not slot.sent:
                err = slot.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err:
                    finish(slot, f"connect: errno {err}")
                    continue
                try:
                    slot.sock.sendall(request)
                except OSError as exc:
                    finish(slot, f"send: {type(exc).__name__}")
                    continue
                slot.sent = True
                sel.modify(slot.sock, selectors.EVENT_READ, slot)
                continue
            try:
                chunk = slot.sock.recv(262144)
            except BlockingIOError:
                continue
            except OSError as exc:
                finish(slot, f"recv: {type(exc).__name__}")
                continue
            if chunk:
                slot.buf += chunk
            else:
                finish(slot, None)
    for key in list(sel.get_map().values()):
        key.fileobj.close()  # type: ignore[union-attr]
    return {
        "connections": len(slots),
        "sources": sources,
        "seconds": seconds,
        "answers": {str(c): n for c, n in sorted(codes.items())},
        "errors": dict(errors),
        "bytes": received,
        "answer_ms": _ms(latencies),
    }


def probe(
    connect: Callable[[], socket.socket],
    path: str,
    seconds: float,
    interval: float = 0.1,
) -> tuple[list[float], Counter[int]]:
    """GET `path` every `interval` for `seconds` on a fresh connection from `connect()`
    (which connects, with its own timeout): each answer's time and the codes (0: none)."""
    times: list[float] = []
    codes: Counter[int] = Counter()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.monotonic()
        code = 0
        try:
            with connect() as s:
                s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                data = b""
                while chunk := s.recv(65536):
                    data += chunk
            code = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.") else 0
        except OSError:
            code = 0
        times.append(time.monotonic() - t0)
        codes[code] += 1
        time.sleep(max(0.0, t0 + interval - time.monotonic()))
    return times, codes


def summary(times: list[float]) -> dict[str, float | int | None]:
    return _ms(times)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m devkit.httpflood")
    p.add_argument("--host", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--path", default="/metrics")
    p.add_argument("--sources", required=True, help="comma-separated source addresses")
    p.add_argument("--per-source", type=int, default=16)
    p.add_argument("--seconds", type=float, default=30.0)
    args = p.parse_args(argv)
    result = flood(
        args.host,
        args.port,
        args.sources.split(","),
        args.per_source,
        min(args.seconds, 600.0),
        args.path,
    )
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Lab pieces for a table flushed under live connections (another proxy's start-up cleanup:
`ipvsadm -C`, then `kube-ipvs0` deleted), on top of labkit's node and pods:

- `StreamServer`: in a pod, pushes a numbered line every `interval` to each client and
  reads what the client sends (counted), until the client says "bye": then "bye-ack" and a
  clean close. Server-side errors (a reset from the client) are recorded.
- `Stream`: a client connection to it that reads every line, checks the numbers are
  contiguous, sends a line every `interval` itself, and records the longest silence (the
  stall a flush causes) and any error. `finish()` says bye and waits for bye-ack: True
  means the connection carried data both ways from start to end.
- `flush_like_kube_proxy(node)`: what kube-proxy's nftables mode does at start-up
  (pkg/proxy/ipvs CleanupLeftovers): `ipvsadm -C`, then the dummy interface deleted.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from dataclasses import dataclass, field

from devkit.labkit import Netns, Node, Pod, sh


class StreamServer:
    def __init__(self, pod: Pod, port: int = 8081, interval: float = 0.02) -> None:
        self.pod, self.port, self.interval = pod, port, interval
        self.errors: list[str] = []
        self.finished = 0
        self.received: dict[int, int] = {}
        self._stop = threading.Event()
        s = pod.netns.socket(socket.AF_INET6, socket.SOCK_STREAM)
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("::", port))
        s.listen(64)
        s.settimeout(0.5)
        self.sock = s
        self._ids = 0
        threading.Thread(target=self._accept, daemon=True, name=f"stream-{pod.name}").start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._ids += 1
            threading.Thread(target=self._serve, args=(conn, self._ids), daemon=True).start()

    def _serve(self, conn: socket.socket, ident: int) -> None:
        done = threading.Event()
        self.received[ident] = 0

        def reader() -> None:
            buf = b""
            try:
                while True:
                    data = conn.recv(4096)
                    if not data:
                        return
                    buf += data
                    while b"\n" in buf:
                        line, _, buf = buf.partition(b"\n")
                        if line == b"bye":
                            done.set()
                            return
                        self.received[ident] += 1
            except OSError as exc:
                self.errors.append(f"read {ident}: {exc!r}")
            finally:
                done.set()

        threading.Thread(target=reader, daemon=True).start()
        seq = 0
        try:
            conn.sendall(f"{self.pod.name}\n".encode())
            while not done.wait(self.interval):
                seq += 1
                conn.sendall(f"{seq}\n".encode())
            conn.sendall(b"bye-ack\n")
            self.finished += 1
        except OSError as exc:
            self.errors.append(f"write {ident}: {exc!r}")
        finally:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_WR)
            time.sleep(0.2)
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self.sock.close()


@dataclass
class Stream:
    """A client of StreamServer (see the module docstring)."""

    netns: Netns
    address: str
    port: int
    interval: float = 0.05
    pod: str = ""
    lines: int = 0
    sent: int = 0
    error: str | None = None
    gaps: list[tuple[float, float]] = field(default_factory=list)  # (at, seconds) > 0.5 s
    ended: bool = False

    def __post_init__(self) -> None:
        family = socket.AF_INET6 if ":" in self.address else socket.AF_INET
        s = self.netns.socket(family, socket.SOCK_STREAM)
        s.settimeout(20)
        s.connect((self.address, self.port))
        s.settimeout(None)
        self.sock = s
        self._buf = b""
        self.pod = self._readline()
        self.last = time.monotonic()
        self._stop = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._writer = threading.Thread(target=self._write, daemon=True)
        self._writer.start()

    def _readline(self) -> str:
        while b"\n" not in self._buf:
            data = self.sock.recv(4096)
            if not data:
                raise ConnectionError("closed by peer")
            self._buf += data
        line, _, self._buf = self._buf.partition(b"\n")
        return line.decode()

    def _read(self) -> None:
        expect = 1
        try:
            while True:
                line = self._readline()
                now = time.monotonic()
                if now - self.last > 0.5:
                    self.gaps.append((now, now - self.last))
                self.last = now
                if line == "bye-ack":
                    self.ended = True
                    return
                if int(line) != expect:
                    self.error = f"line {line} where {expect} was due"
                    return
                expect += 1
                self.lines += 1
        except (OSError, ValueError) as exc:
            self.error = f"read: {exc!r}"

    def _write(self) -> None:
        try:
            while not self._stop.wait(self.interval):
                self.sock.sendall(f"c{self.sent}\n".encode())
                self.sent += 1
        except OSError as exc:
            self.error = self.error or f"write: {exc!r}"

    def alive(self) -> bool:
        return self.error is None and self._reader.is_alive()

    def stall(self) -> float:
        """The longest silence seen so far (seconds), the current one included."""
        current = time.monotonic() - self.last
        return max([current, *(g for _, g in self.gaps)])

    def finish(self, timeout: float = 30.0) -> bool:
        """Say bye and wait for bye-ack: whether the stream carried data to the end."""
        self._stop.set()
        self._writer.join(timeout)
        try:
            if self.error is None:
                self.sock.sendall(b"bye\n")
        except OSError as exc:
            self.error = f"bye: {exc!r}"
        self._reader.join(timeout)
        self.sock.close()
        return self.ended and self.error is None


def flush_like_kube_proxy(node: Node, interface: str = "kube-ipvs0") -> None:
    """kube-proxy's IPVS cleanup: the IPVS table flushed, then the dummy interface deleted."""
    sh("ipvsadm", "-C", netns=node.name)
    sh("ip", "link", "del", interface, netns=node.name, check=False)


@dataclass
class UdpFlow:
    """A connected UDP socket that sends a datagram every `interval` and waits for each
    answer: answered, lost (no answer in time) and refused (ICMP port unreachable) counts."""

    netns: Netns
    address: str
    port: int
    interval: float = 0.1
    answered: int = 0
    lost: int = 0
    refused: int = 0
    answers: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        family = socket.AF_INET6 if ":" in self.address else socket.AF_INET
        self.sock = self.netns.socket(family, socket.SOCK_DGRAM)
        self.sock.connect((self.address, self.port))
        self.sock.settimeout(self.interval)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sock.send(b"ping")
                self.answers.add(self.sock.recv(2048).decode())
                self.answered += 1
                time.sleep(self.interval)
            except TimeoutError:
                self.lost += 1
            except ConnectionRefusedError:
                self.refused += 1
                time.sleep(self.interval)
            except OSError:
                self.refused += 1
                time.sleep(self.interval)

    def stop(self) -> dict[str, object]:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()
        return {
            "answered": self.answered,
            "lost": self.lost,
            "refused": self.refused,
            "answers": sorted(self.answers),
        }

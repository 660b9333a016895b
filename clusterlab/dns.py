"""The DNS-like app of `udp` pods: answers each datagram with its pod's name and the query's
id, and keeps every query it received with its time, so that a query a client saw fail can
be told apart: never reached a pod (lost on the way), or reached one whose answer came too
late. On SIGTERM it stops answering at once (its socket closes: the node answers further
queries with ICMP port unreachable)."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable

from ipvsctl.kernel.netns import enter_netns


class DnsResponder:
    def __init__(
        self, pod: str, netns: str, ip: str, port: int, clock: Callable[[], float]
    ) -> None:
        self.pod = pod
        self.clock = clock
        self.received: list[tuple[float, str]] = []  # (time, query id)
        self._stop = threading.Event()
        ready = threading.Event()
        errors: list[BaseException] = []

        def run() -> None:
            try:
                enter_netns(netns)
                s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                s.bind((ip, port))
                s.settimeout(0.5)
                self.sock = s
            except BaseException as exc:
                errors.append(exc)
                return
            finally:
                ready.set()
            self._serve()

        self.thread = threading.Thread(target=run, daemon=True, name=f"dns-{pod}")
        self.thread.start()
        ready.wait()
        if errors:
            raise errors[0]

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                data, peer = self.sock.recvfrom(2048)
            except TimeoutError:
                continue
            except OSError:
                return
            qid = data.decode(errors="replace")
            self.received.append((self.clock(), qid))
            with contextlib.suppress(OSError):
                self.sock.sendto(f"{self.pod} {qid}".encode(), peer)

    def close(self) -> None:
        """SIGTERM: no more answers."""
        self._stop.set()
        with contextlib.suppress(OSError):
            self.sock.close()

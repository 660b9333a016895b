"""Drains that end when the connections end, on the real kernel with real TCP:
the engine reads /proc/net/ip_vs for counts and /proc/net/ip_vs_conn for the states of
TCP real servers whose connections are all inactive.

- a normal close (TIME_WAIT in IPVS for 2 minutes) -> deleted `drained` within two checks;
- a connection half-closed by the client (the server still sending) -> kept, data flowing,
  until it ends;
- a reset connection (CLOSE) -> `drained`;
- 2,000 TIME_WAIT entries on another real server: the check's work on them is a cheap
  per-line test, none is parsed (asserted on the scan's counters, never on time).
Also prints what one /proc/net/ip_vs read costs against per-virtual-server netlink dumps
(`MEASURE` lines: ratios only, the guest is emulated).
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import pytest

from devkit.builders import endpoint, endpoint_slice, service
from devkit.harness import Harness
from devkit.labkit import Node, Pod, RecordingKernel, wait_for
from ipvsctl.daemon.status_json import engine_status
from ipvsctl.kernel.netns import run_in_netns
from ipvsctl.model import ConnScan, Protocol, RealServerKey, ServiceKey, VirtualServer

pytestmark = pytest.mark.lab

VIP = "10.96.0.10"
KEY = ServiceKey(Protocol.TCP, VIP, 80)


class Streamer:
    """A pod's TCP server on 8080: greets with the pod's name, echoes lines, and after the
    client's FIN keeps sending "tick" lines while `hold` is set (a half-closed stream whose
    server still has data to send), then closes."""

    def __init__(self, pod: Pod) -> None:
        self.pod = pod
        self.hold = threading.Event()
        self.ticks = 0
        s = pod.netns.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("0.0.0.0", 8080))
        s.listen(256)
        s.settimeout(0.5)
        self.sock = s
        self.stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._talk, args=(conn,), daemon=True).start()

    def _talk(self, conn: socket.socket) -> None:
        try:
            conn.sendall(self.pod.name.encode() + b"\n")
            while data := conn.recv(4096):
                conn.sendall(data)
            while self.hold.is_set():  # the client half-closed: keep streaming
                conn.sendall(b"tick\n")
                self.ticks += 1
                time.sleep(0.2)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


def setup(node: Node, n_pods: int = 2) -> tuple[Harness, list[Pod], list[Streamer]]:
    pods = [node.make_pod(f"10.244.1.{i}", tcp=()) for i in range(1, n_pods + 1)]
    servers = [Streamer(p) for p in pods]
    h = Harness(kernel=RecordingKernel(node.kernel), drain_timeout=600.0)
    h.start([service("web")], [endpoint_slice("web", [endpoint(p.ip, pod=p.name) for p in pods])])
    return h, pods, servers


def rs(pod: Pod) -> RealServerKey:
    return RealServerKey(pod.ip, 8080)


def states(node: Node, pod: Pod) -> list[str]:
    return sorted(
        c[1]
        for c in node.ipvs_connections()
        if c[0] == "TCP" and c[4] == str(rs(pod)) and not c[2].endswith(":0")
    )


def in_kernel(node: Node, pod: Pod) -> bool:
    return str(rs(pod)) in node.ipvsadm()[str(KEY)].real_servers


def connect_to(client: Pod, pod: Pod) -> Any:
    """A connection through the VIP that landed on `pod` (rr: at most a few tries)."""
    for _ in range(10):
        conn = client.connect(VIP, 80)
        if conn.pod == pod.name:
            return conn
        conn.close()
    raise AssertionError(f"no connection reached {pod.name}")


def drain(h: Harness, keep: list[Pod]) -> None:
    h.upsert(endpoint_slice("web", [endpoint(p.ip, pod=p.name) for p in keep]))


def test_normal_close_is_drained_within_two_checks(node: Node, client: Pod) -> None:
    h, (a, b), _ = setup(node)
    conn = connect_to(client, a)
    assert conn.echo("hello")
    drain(h, [b])
    h.check()
    assert in_kernel(node, a)  # ESTABLISHED holds it
    conn.close()
    wait_for(lambda: states(node, a) == ["TIME_WAIT"], what="TIME_WAIT in IPVS")
    h.check()
    if in_kernel(node, a):
        h.check()
    assert not in_kernel(node, a)
    assert h.deletions("drained") == 1 and h.deletions("deadline") == 0


def test_half_closed_by_the_client_is_kept_while_the_server_still_sends(
    node: Node, client: Pod
) -> None:
    h, (a, b), servers = setup(node)
    servers[0].hold.set()
    conn = connect_to(client, a)
    drain(h, [b])
    conn.sock.shutdown(socket.SHUT_WR)  # the client is done sending; the server is not
    wait_for(lambda: servers[0].ticks >= 2, what="the server streaming after the FIN")
    held = states(node, a)
    assert held and all(s not in ("TIME_WAIT", "CLOSE") for s in held), held
    for _ in range(3):
        h.check()
        assert in_kernel(node, a)
        assert conn.readline() == "tick"  # data still flows to the client
    status = next(
        r
        for r in engine_status(h.view)["virtual_servers"][0]["real_servers"]
        if r["address"] == a.ip
    )
    assert status["drain"]["connections"]["closing"] >= 1
    servers[0].hold.clear()  # the stream ends: the server closes too
    wait_for(lambda: not conn.sock.recv(4096) or False, what="the server's FIN")
    conn.close()
    wait_for(lambda: states(node, a) in (["TIME_WAIT"], ["CLOSE"]), what="closed in IPVS")
    wait_for(
        lambda: (h.check(), not in_kernel(node, a))[1],
        timeout=60,
        interval=0.5,
        what="deleted after the stream ended",
    )
    assert h.deletions("drained") == 1 and h.deletions("deadline") == 0


def test_reset_connection_is_drained(node: Node, client: Pod) -> None:
    h, (a, b), _ = setup(node)
    conn = connect_to(client, a)
    drain(h, [b])
    conn.abort()
    wait_for(lambda: states(node, a) == ["CLOSE"], what="CLOSE in IPVS")
    h.check()
    if in_kernel(node, a):
        h.check()
    assert not in_kernel(node, a) and h.deletions("drained") == 1


def closed_connections(client: Pod, n: int) -> None:
    """n connections through the VIP, each closed normally (TIME_WAIT for 2 minutes), made
    from one thread inside the client's netns (a socket per connection, no thread each)."""

    def run() -> None:
        for _ in range(n):
            with socket.create_connection((VIP, 80), timeout=20) as s:
                s.recv(64)

    run_in_netns(client.netns.name, run)


def test_2000_time_wait_entries_elsewhere_are_not_parsed(node: Node, client: Pod) -> None:
    h, (a, b), _ = setup(node)
    drain(h, [b])
    h.check()  # a had no connection: deleted at once by its counts
    assert not in_kernel(node, a)
    # All to b. A few more than the 2,000 asserted: the one CI failure (2026-11-26, passing
    # alone right after) saw fewer than 2,000 entries for 60 s after 2,000 connections,
    # i.e. some connections shared an entry; the margin keeps the test about parsing.
    closed_connections(client, 2050)
    wait_for(lambda: len(node.ipvs_connections()) >= 2000, what="2,000 entries")
    drain(h, [a, b])
    conn = connect_to(client, a)
    conn.close()
    drain(h, [b])
    wait_for(lambda: states(node, a) == ["TIME_WAIT"], what="a's connection in TIME_WAIT")
    h.check()
    assert not in_kernel(node, a) and h.deletions("drained") == 2
    scan = h.engine.drain_check.reader.last_scan
    assert isinstance(scan, ConnScan)
    # every line was read once; only a's own line got past the cheap DestIP:DPrt check
    assert scan.lines > 2000 and scan.slow == 0 and scan.bad == 0
    assert scan.matched == 1, scan


def test_measure_one_table_read_against_per_virtual_server_dumps(node: Node) -> None:
    """Not a timing assertion: prints the costs so the choice rests on numbers."""
    n = 200
    keys = [ServiceKey(Protocol.TCP, f"10.97.{i // 250}.{i % 250 + 1}", 80) for i in range(n)]
    for i, key in enumerate(keys):
        node.kernel.add_virtual_server(VirtualServer(key), False)
        node.kernel.add_real_server(key, RealServerKey(f"10.245.{i // 250}.{i % 250 + 1}", 8080), 1)
    for wanted in (1, 10, 100, 200):
        t0 = time.perf_counter()
        dumps = {k: node.kernel.list_real_servers(k) for k in keys[:wanted]}
        t1 = time.perf_counter()
        table = node.kernel.read_real_servers(keys[:wanted])
        t2 = time.perf_counter()
        assert table == dumps
        print(
            f"MEASURE vs={n} draining_vs={wanted} dumps_ms={(t1 - t0) * 1000:.1f} "
            f"table_read_ms={(t2 - t1) * 1000:.1f}",
            flush=True,
        )

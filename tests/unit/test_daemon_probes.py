"""The daemon's probes under a scrape flood, in-process: /healthz and /readyz are answered
while every scrape waits on a /metrics rendering, and the scrapes that come together share
one rendering. The flood comes from four addresses within the per-peer bounds (16 each),
the probes from the node (loopback), as the kubelet's do."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from devkit.builders import endpoint, endpoint_slice, service
from ipvsctl.daemon.options import DaemonOptions, DrainOptions, HTTPOptions, SourceOptions
from ipvsctl.daemon.wiring import Daemon
from ipvsctl.kernel.fake import FakeKernel
from ipvsctl.manifests import ManifestSource
from ipvsctl.model import NodeContext

FLOOD = [f"127.0.0.{3 + i // 16}" for i in range(64)]  # four peers, 16 connections each
GET = b"GET %s HTTP/1.1\r\nHost: x\r\n\r\n"


class Gate:
    """A collector whose rendering blocks until the test opens it (a slow /metrics: 200
    Services' per-Service series on a loaded node), counting how often it is rendered."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.calls = 0
        self.entered = threading.Semaphore(0)

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        self.calls += 1
        self.entered.release()
        self.open.wait(30)
        yield GaugeMetricFamily("test_gate_renders", "renderings so far", value=self.calls)


def ask(port: int, path: str, source: str = "127.0.0.1", timeout: float = 3.0) -> bytes:
    with socket.create_connection(
        ("127.0.0.1", port), timeout=timeout, source_address=(source, 0)
    ) as s:
        s.sendall(GET % path.encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
        return data


def code(reply: bytes) -> int:
    return int(reply.split()[1]) if reply else 0


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "web.yaml").write_text(
        yaml.safe_dump_all(
            [service("web"), endpoint_slice("web", [endpoint("10.244.1.5", pod="web-1")])]
        )
    )
    d = Daemon(
        DaemonOptions(
            node=NodeContext("node-a", ("192.0.2.10",)),
            source=SourceOptions(manifests=str(folder)),
            drain=DrainOptions(state_dir=str(tmp_path / "state")),
            http=HTTPOptions(listen="127.0.0.1:0"),
        ),
        FakeKernel(),
        ManifestSource(folder, interval=0.05),
    )
    # Every 127.0.0.0/8 address is loopback, so trusted: here only 127.0.0.1 is (the node),
    # and the flood's four addresses are bounded as strangers' are.
    d.http.server.trusted = lambda peer: peer == "127.0.0.1"
    d.start()
    yield d
    d.shutdown()


def test_probes_are_answered_while_every_scrape_waits_on_one_rendering(daemon: Daemon) -> None:
    """Rendered per request on the 8 HTTP workers, a slow /metrics held all of them and the
    kubelet's /healthz waited behind (12-16 s against a 5 s probe timeout). Now the probes
    are answered at once and the 64 scrapes share one rendering."""
    gate = Gate()
    daemon.metrics.registry.register(gate)
    port = daemon.http.port
    deadline = time.monotonic() + 10
    while code(ask(port, "/readyz")) != 200:
        assert time.monotonic() < deadline, "never ready"
    replies: list[bytes] = []
    scrapes = [
        threading.Thread(target=lambda s=s: replies.append(ask(port, "/metrics", s, 30)))
        for s in FLOOD
    ]
    try:
        for t in scrapes:
            t.start()
        assert gate.entered.acquire(timeout=10)  # a rendering is under way, and stuck
        deadline = time.monotonic() + 10
        while daemon.http.server.open_connections() < 64:  # every scrape is in
            assert time.monotonic() < deadline, daemon.http.server.open_connections()
            time.sleep(0.01)
        for _ in range(20):
            t0 = time.monotonic()
            assert code(ask(port, "/healthz")) == 200
            assert code(ask(port, "/readyz")) == 200
            assert time.monotonic() - t0 < 1.0
        assert gate.calls == 1  # 64 scrapes waiting, one rendering
    finally:
        gate.open.set()
        for t in scrapes:
            t.join(30)
    assert len(replies) == 64 and {code(r) for r in replies} == {200}
    bodies = {r.partition(b"\r\n\r\n")[2] for r in replies}
    assert len(bodies) == 1 and b"test_gate_renders 1.0" in bodies.pop()
    assert gate.calls == 1
    assert daemon.metrics.value("ipvsctl_metrics_renders_total") >= 1

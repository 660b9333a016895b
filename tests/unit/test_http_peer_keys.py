"""Per peer means per host: an IPv4 address, or an IPv6 /64. The rule as a table, and
kube-proxy's health port (`--healthz-bind-address`) against 64 idle connections from 64
addresses of one /64, in a network namespace of its own (root: skipped otherwise)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import uuid
from collections.abc import Iterator

import pytest

from ipvsctl.healthcheck.proxy import ProxyState
from ipvsctl.healthcheck.proxy_server import ProxyHealthServer
from ipvsctl.kernel.netns import run_in_netns
from ipvsctl.obs.metrics import Metrics


@pytest.mark.parametrize(
    ("peer", "key"),
    [
        ("10.0.0.7", "10.0.0.7"),  # IPv4: each address its own
        ("2001:db8:1:2::7", "2001:db8:1:2::/64"),
        ("2001:db8:1:2:ffff:ffff:ffff:ffff", "2001:db8:1:2::/64"),  # same /64, same share
        ("2001:db8:1:3::7", "2001:db8:1:3::/64"),  # the next /64: another host
        ("::ffff:10.0.0.7", "10.0.0.7"),  # IPv4-mapped: the IPv4 address
        ("fe80::1", "fe80::/64"),
        ("not-an-address", "not-an-address"),
    ],
)
def test_peer_key(peer: str, key: str) -> None:
    from ipvsctl.httpd import peer_key

    assert peer_key(peer) == key


PREFIX = "fd00:a:b:c"  # the crowd's /64
PROBER = "fd00:1b::5"  # a load balancer's address, in another /64


@pytest.fixture
def netns() -> Iterator[str]:
    if os.geteuid() != 0 or not shutil.which("ip"):
        pytest.skip("needs root and ip")
    name = f"ipvsctl-unit-{uuid.uuid4().hex[:8]}"
    if subprocess.run(["ip", "netns", "add", name], capture_output=True).returncode != 0:
        pytest.skip("cannot create a network namespace here")
    try:
        batch = ["link set lo up", f"addr add {PROBER}/64 dev lo nodad"]
        batch += [f"addr add {PREFIX}::{i:x}/64 dev lo nodad" for i in range(1, 66)]
        subprocess.run(
            ["ip", "-n", name, "-batch", "-"], input="\n".join(batch), text=True, check=True
        )
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def _connect(netns: str, source: str, port: int) -> socket.socket:
    def make() -> socket.socket:
        s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        s.settimeout(10)
        s.bind((source, 0))
        s.connect((f"{PREFIX}::1", port))
        return s

    return run_in_netns(netns, make)


def _ask(s: socket.socket, path: str = "/healthz") -> int:
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    data = b""
    while chunk := s.recv(4096):
        data += chunk
    return int(data.split()[1]) if data else 0


def test_a_crowd_from_one_ipv6_64_never_gets_a_load_balancers_probe_refused(netns: str) -> None:
    """Keyed by the exact address, 64 idle connections from 64 addresses of one /64 took
    all 64 slots of the health port, none holding two more than a newcomer: the load
    balancer's probe got 503 and the node left its pool. As one peer the /64 holds 16."""

    def healthy() -> ProxyState:
        return ProxyState(
            now=1.0,
            monotonic=1.0,
            heartbeat=1.0,
            pending_since=None,
            last_updated=None,
            node_eligible=True,
            timeout=60.0,
        )

    metrics = Metrics()
    server = ProxyHealthServer(f"[{PREFIX}::1]:0", healthy, metrics)
    assert run_in_netns(netns, server.open)
    assert server.port is not None and server.http is not None
    crowd: list[socket.socket] = []
    try:
        for i in range(2, 66):  # 64 addresses of the /64, one idle connection each
            crowd.append(_connect(netns, f"{PREFIX}::{i:x}", server.port))
        probes = []
        for _ in range(10):
            probe = _connect(netns, PROBER, server.port)
            probes.append(_ask(probe))
            probe.close()
        assert probes == [200] * 10
        assert server.http.server.connections_of(f"{PREFIX}::2") <= 16
        assert (
            metrics.value(
                "ipvsctl_http_refused_total", {"server": "proxy-health", "reason": "evicted"}
            )
            >= 64 - 16
        )
    finally:
        for s in crowd:
            s.close()
        server.close()

"""The healthCheckNodePort server over real loopback sockets, fed by the real Engine: ports
open and close as Services come and go, answers follow the local endpoints."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable

import pytest

from devkit.builders import endpoint, endpoint_slice, service
from devkit.harness import Harness
from ipvsctl.healthcheck.server import HealthServer
from ipvsctl.obs.metrics import Metrics
from ipvsctl.reconcile.feed import Subscriptions


class Ports:
    """listen() for tests: the Service's port number maps to an ephemeral loopback port."""

    def __init__(self) -> None:
        self.actual: dict[int, int] = {}
        self.refuse: set[int] = set()

    def __call__(self, port: int) -> socket.socket:
        if port in self.refuse:
            raise OSError(98, "Address already in use")
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        s.listen(128)  # as listen_socket
        s.setblocking(False)
        self.actual[port] = s.getsockname()[1]
        return s


def get(port: int, request: bytes = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"):
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(request)
        data = b""
        while chunk := s.recv(4096):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), head.decode(), json.loads(body)


def wait(pred: Callable[[], object], timeout: float = 5.0) -> None:
    done = threading.Event()
    for _ in range(int(timeout / 0.01)):
        if pred():
            return
        done.wait(0.01)
    raise AssertionError("condition not met in time")


def lb(hc: int = 32000, local: bool = True):
    spec = {"externalTrafficPolicy": "Local"} if local else {}
    return service(
        "lb",
        type="LoadBalancer",
        healthCheckNodePort=hc,
        ports=[{"name": "http", "port": 80, "nodePort": 30080}],
        **spec,
    )


@pytest.fixture
def running():
    ports = Ports()
    m = Metrics()
    healthy = {"ok": True}
    hs = HealthServer(
        "node-a", metrics=m, listen=ports, proxy_healthy=lambda: healthy["ok"], retry_interval=0.05
    )
    h = Harness()
    h.feed.subscribe(Subscriptions(service=hs.on_service))
    stop = threading.Event()
    t = threading.Thread(target=hs.run, args=(stop,), daemon=True)
    t.start()
    yield h, hs, ports, m, healthy
    stop.set()
    t.join(5)
    hs.close()


def test_ports_follow_services_and_answers_follow_local_endpoints(running):
    h, hs, ports, m, healthy = running
    h.start([lb(), service("plain")], [endpoint_slice("lb", [endpoint("10.244.1.5", pod="a")])])
    assert hs.ports() == [32000]
    assert m.value("ipvsctl_health_check_node_ports") == 1
    code, head, body = get(ports.actual[32000])
    assert code == 200
    assert "Content-Type: application/json" in head and "X-Content-Type-Options: nosniff" in head
    assert body == {
        "service": {"namespace": "default", "name": "lb"},
        "localEndpoints": 1,
        "serviceProxyHealthy": True,
    }

    h.upsert(endpoint_slice("lb", [endpoint("10.244.1.5", pod="a", ready=False)]))
    code, _, body = get(ports.actual[32000], b"GET / HTTP/1.0\r\n\r\n")  # any path
    assert (code, body["localEndpoints"]) == (503, 0)

    h.upsert(endpoint_slice("lb", [endpoint("10.244.1.5", pod="a")]))
    healthy["ok"] = False  # the proxy itself is unhealthy: 503 whatever the endpoints
    code, _, body = get(ports.actual[32000])
    assert (code, body["localEndpoints"], body["serviceProxyHealthy"]) == (503, 1, False)
    healthy["ok"] = True

    old = ports.actual[32000]
    h.upsert(lb(hc=32001))
    assert hs.ports() == [32001]
    assert get(ports.actual[32001])[0] == 200

    def refused() -> bool:
        try:
            get(old)
        except OSError:
            return True
        return False

    wait(refused)
    h.upsert(lb(local=False))  # Cluster policy: no health check port
    assert hs.ports() == []
    assert m.value("ipvsctl_health_check_node_ports") == 0


def test_a_port_in_use_is_retried_until_it_opens(running, caplog):
    h, hs, ports, m, _ = running
    ports.refuse.add(32000)
    h.start([lb()], [endpoint_slice("lb", [endpoint("10.244.1.5")])])
    assert hs.ports() == []
    wait(lambda: m.value("ipvsctl_health_check_node_port_errors_total") >= 3)
    assert [r.getMessage() for r in caplog.records].count(
        "health check port not opened, retrying"
    ) == 1
    ports.refuse.clear()
    wait(lambda: hs.ports() == [32000])
    assert get(ports.actual[32000])[0] == 200
    # a port nobody wants any more is not retried
    ports.refuse.add(32005)
    h.upsert(lb(hc=32005))
    h.delete(lb())
    n = m.value("ipvsctl_health_check_node_port_errors_total")
    threading.Event().wait(0.3)
    assert m.value("ipvsctl_health_check_node_port_errors_total") == n


def test_a_silent_client_does_not_hold_up_the_others(running):
    h, _, ports, _, _ = running
    h.start([lb()], [endpoint_slice("lb", [endpoint("10.244.1.5")])])
    silent = socket.create_connection(("127.0.0.1", ports.actual[32000]))
    try:
        assert get(ports.actual[32000])[0] == 200
    finally:
        silent.close()


def test_response_headers(running):
    h, _, ports, _, _ = running
    h.start([lb()], [endpoint_slice("lb", [endpoint("10.244.1.5")])])
    code, head, _ = get(ports.actual[32000])
    assert code == 200
    for line in (
        "Content-Type: application/json",
        "X-Content-Type-Options: nosniff",
        "Connection: close",
    ):
        assert line in head.split("\r\n")


def test_idle_flood_and_slow_clients_are_bounded(running):
    """500 idle connections hold no thread each; a probe still gets its answer, and the
    refusals are counted."""
    h, hs, ports, m, _ = running
    hs.http.trusted = lambda peer: False  # the flood and the probe are strangers here
    h.start([lb()], [endpoint_slice("lb", [endpoint("10.244.1.5")])])
    before = threading.active_count()
    idle = [
        socket.create_connection(
            ("127.0.0.1", ports.actual[32000]), source_address=("127.0.0.2", 0)
        )
        for _ in range(500)
    ]
    try:
        assert get(ports.actual[32000])[0] == 200  # from 127.0.0.1: another peer
        assert threading.active_count() <= before + 2  # the worker pool
        assert (
            m.value("ipvsctl_http_refused_total", {"server": "health", "reason": "evicted"}) >= 400
        )
    finally:
        for s in idle:
            s.close()

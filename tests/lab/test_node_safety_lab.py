"""Node safety on a real kernel: a virtual server another tool made (keepalived's,
on an address of no Kubernetes proxy) is left alone, real servers and all, while one of
kube-router's (its VIP on kube-dummy-if) is taken over in place. The daemon's wiring with
`ipvsctl run`'s ownership rule, a KubeSource against the fake API server."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from devkit.builders import endpoint, endpoint_slice, service
from devkit.fakeapi.server import FakeAPIServer
from devkit.labkit import Node, daemon_get, wait_for
from ipvsctl.kube.client import KubeSource
from ipvsctl.kube.settings import KubeSettings
from ipvsctl.model import Protocol, RealServerKey, ServiceKey, VirtualServer
from tests.lab.test_daemon_lab import metric_sum, weights

pytestmark = pytest.mark.lab

KEEPALIVED = ServiceKey(Protocol.TCP, "198.51.100.50", 80)  # on no proxy's interface
KUBE_ROUTER = ServiceKey(Protocol.TCP, "10.96.0.77", 80)  # on kube-dummy-if


def test_another_tools_virtual_server_is_left_alone_and_a_proxys_is_taken_over(
    node: Node, make_daemon: Callable[..., Any]
) -> None:
    theirs = node.make_pod("10.244.1.9", name="keepalived-backend")
    web = node.make_pod("10.244.1.1", name="web-1")
    node.run("ip", "link", "add", "kube-dummy-if", "type", "dummy")
    node.run("ip", "addr", "add", f"{KUBE_ROUTER.address}/32", "dev", "kube-dummy-if")
    for key, scheduler, weight in ((KEEPALIVED, "wlc", 3), (KUBE_ROUTER, "rr", 1)):
        node.kernel.add_virtual_server(VirtualServer(key, scheduler), False)
        node.kernel.add_real_server(key, RealServerKey(theirs.ip, 8080), weight)

    with FakeAPIServer() as api:
        externals = [KEEPALIVED.address, KUBE_ROUTER.address]
        api.add(service("web", cluster_ip="10.96.0.10", externalIPs=externals))
        api.add(endpoint_slice("web", [endpoint(web.ip, pod=web.name)]))
        source = KubeSource.from_config(
            apiserver=api.url, settings=KubeSettings(backoff_initial=0.05, backoff_max=0.5)
        )
        d = make_daemon(node, source, real_ownership=True)
        wait_for(lambda: d.engine.started, timeout=180, what="the daemon's first sync")
        table = weights(node)
        # keepalived's: as it was (scheduler, real server, weight); the Service skips it
        assert table[str(KEEPALIVED)] == {f"{theirs.ip}:8080": 3}
        assert node.ipvsadm()[str(KEEPALIVED)].scheduler == "wlc"
        # kube-router's: taken over in place (never re-created): the Service's real server
        # added, the old one drained (idle here: deleted at the first drain check)
        assert table[str(KUBE_ROUTER)][f"{web.ip}:8080"] == 1
        assert table["10.96.0.10:80/TCP"] == {f"{web.ip}:8080": 1}
        wait_for(
            lambda: weights(node)[str(KUBE_ROUTER)] == {f"{web.ip}:8080": 1},
            what="kube-router's old real server drained",
        )
        metrics = daemon_get(node, d, "/metrics")[1]
        assert metric_sum(metrics, "ipvsctl_foreign_virtual_servers_total") == 1

        api.delete("Service", "default", "web")
        wait_for(lambda: "10.96.0.10:80/TCP" not in weights(node), what="the Service's table gone")
        assert weights(node)[str(KEEPALIVED)] == {f"{theirs.ip}:8080": 3}


def tenant_service(i: int, created: str) -> list[dict[str, Any]]:
    """A Service of 2 ports on its cluster IP and its slice of 2 endpoints: 6 entries."""
    name = f"svc-{i}"
    svc = service(
        name,
        cluster_ip=f"10.96.1.{i + 1}",
        ports=[{"name": f"p{j}", "port": 80 + j, "protocol": "TCP"} for j in range(2)],
        namespace="tenant",
    )
    svc["metadata"]["creationTimestamp"] = created
    sl = endpoint_slice(
        name,
        [endpoint(f"10.244.{i + 2}.{k + 1}") for k in range(2)],
        ports=[{"name": f"p{j}", "port": 8080 + j, "protocol": "TCP"} for j in range(2)],
        namespace="tenant",
    )
    return [svc, sl]


def test_the_table_holds_the_oldest_services_that_fit_and_lets_a_refused_one_in(
    node: Node, make_daemon: Callable[..., Any]
) -> None:
    """`--max-table-entries` on the real kernel: of four Services of 6 entries under a limit
    of 18, the three oldest are programmed and the newest (first in name order) is not;
    when an admitted one goes, the refused one gets in, and the others are never touched."""
    with FakeAPIServer() as api:
        # names and ages in opposite orders: svc-0 is the newest
        for i in range(4):
            for obj in tenant_service(i, f"2025-01-0{4 - i}T00:00:00Z"):
                api.add(obj)
        source = KubeSource.from_config(
            apiserver=api.url, settings=KubeSettings(backoff_initial=0.05, backoff_max=0.5)
        )
        d = make_daemon(node, source, max_table_entries=18)
        wait_for(lambda: d.engine.started, timeout=180, what="the daemon's first sync")
        table = weights(node)
        admitted = {f"10.96.1.{i + 1}:{80 + j}/TCP" for i in (1, 2, 3) for j in range(2)}
        assert set(table) == admitted
        assert all(set(w.values()) == {1} for w in table.values())
        metrics = daemon_get(node, d, "/metrics")[1]
        assert metric_sum(metrics, "ipvsctl_table_refused_services") == 1
        assert metric_sum(metrics, "ipvsctl_table_entries") == 18
        assert metric_sum(metrics, "ipvsctl_invalid_objects_total", kind="Service") == 1

        api.delete("Service", "tenant", "svc-3")  # the oldest goes: svc-0 fits now
        wait_for(lambda: "10.96.1.1:80/TCP" in weights(node), what="the refused one let in")
        table = weights(node)
        assert {k for k in table if k.startswith("10.96.1.1:")} == {
            "10.96.1.1:80/TCP",
            "10.96.1.1:81/TCP",
        }
        for i in (1, 2):  # never touched: the same real servers at weight 1
            for j in range(2):
                assert table[f"10.96.1.{i + 1}:{80 + j}/TCP"] == {
                    f"10.244.{i + 2}.{k + 1}:{8080 + j}": 1 for k in range(2)
                }

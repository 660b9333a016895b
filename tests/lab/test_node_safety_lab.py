"""Node safety on a real kernel (issue 25.4): a virtual server another tool made (keepalived's,
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

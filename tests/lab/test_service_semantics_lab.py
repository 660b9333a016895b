"""The Service semantics users rely on, on a real kernel, with the real daemon in-process and
real traffic.

`externalTrafficPolicy: Local` with no endpoint on this node (node-a): its only endpoint is
on node-b (a pod netns here, its slice says node-b). kube-proxy's IPVS mode gives the
external, load-balancer and NodePort virtual servers the cluster-wide endpoints, so a pod
and the host on node-a still reach their own load balancer; so must ipvsctl. Also checked
in the kernel: an `ipMode: Proxy` ingress and another proxy's Service get no virtual server.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from devkit.builders import endpoint, endpoint_slice, service
from devkit.labkit import Node, wait_for
from ipvsctl.kernel.netlink import configure_host
from tests.lab import netkit
from tests.lab.netkit import NODE_LAN, HostClient, Outside, ask

pytestmark = pytest.mark.lab

REMOTE = "10.244.0.31"
CLIENT = "10.244.0.41"


def etp_local() -> list[dict[str, Any]]:
    svc = service(
        "lb",
        cluster_ip="10.96.0.30",
        type="LoadBalancer",
        externalTrafficPolicy="Local",
        healthCheckNodePort=32030,
        externalIPs=["203.0.113.30"],
        lb_ips=["198.51.100.30"],
        ports=[{"name": "http", "port": 80, "protocol": "TCP", "nodePort": 30090}],
    )
    sl = endpoint_slice(
        "lb",
        [endpoint(REMOTE, node="node-b", pod="remote-1")],
        ports=[{"name": "http", "port": 8080, "protocol": "TCP"}],
    )
    return [svc, sl]


def not_ours() -> list[dict[str, Any]]:
    proxied = service("proxied", cluster_ip="10.96.0.31", type="LoadBalancer")
    proxied["status"] = {"loadBalancer": {"ingress": [{"ip": "198.51.100.31", "ipMode": "Proxy"}]}}
    other = service("other", cluster_ip="10.96.0.32")
    other["metadata"]["labels"] = {"service.kubernetes.io/service-proxy-name": "someone"}
    return [proxied, other]


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Node, Any, Any, Any]]:
    node = Node()
    outside = None
    try:
        configure_host(kernel=node.kernel)
        remote = node.make_pod(REMOTE, name="remote-1", tcp=())
        netkit.serve_peers(remote, tcp=(8080,))
        client = node.make_pod(CLIENT, name="client", tcp=())
        outside = Outside(node)  # puts NODE_LAN on the node: NodePorts listen there
        tmp = tmp_path_factory.mktemp("semantics")
        manifests = tmp / "m"
        manifests.mkdir()
        netkit.write_manifests(manifests, "lb.yaml", *etp_local())
        netkit.write_manifests(manifests, "others.yaml", *not_ours())
        with netkit.run_daemon(
            node, manifests, tmp / "state", cluster_cidrs=("10.244.0.0/16",)
        ) as d:
            wait_for(lambda: d.engine.started, timeout=120, what="first sync")
            wait_for(
                lambda: "198.51.100.30:80/TCP" in {str(k) for k in d.engine.state.owner},
                timeout=120,
                what="LB virtual server",
            )
            yield node, d, client, HostClient(node)
    finally:
        if outside is not None:
            outside.close()
        node.close()


@pytest.mark.parametrize(
    ("address", "port"),
    [("198.51.100.30", 80), ("203.0.113.30", 80), (NODE_LAN, 30090), ("10.96.0.30", 80)],
)
def test_pod_on_a_node_without_local_endpoints_reaches_its_load_balancer(
    lab, address: str, port: int
) -> None:
    node, _, client, host = lab
    table = node.ipvsadm()
    assert list(table[f"{address}:{port}/TCP"].real_servers) == [f"{REMOTE}:8080"]
    for who in (client, host):
        answered, _ = ask(who, address, port)
        assert answered == "remote-1"


def test_health_check_still_says_no_local_endpoint(lab) -> None:
    _, d, _, _ = lab
    from ipvsctl.healthcheck.state import local_ready_endpoints
    from ipvsctl.model import ServiceRef

    assert local_ready_endpoints(d.engine.state.desired[ServiceRef("default", "lb")], "node-a") == 0


def test_proxy_mode_ingress_and_other_proxies_services_get_no_virtual_server(lab) -> None:
    node, _, _, _ = lab
    table = node.ipvsadm()
    assert "10.96.0.31:80/TCP" in table  # the Service itself is served...
    assert "198.51.100.31:80/TCP" not in table  # ...but not its proxied ingress IP
    assert "10.96.0.32:80/TCP" not in table  # another proxy's Service
    assert "198.51.100.31" not in node.interface_addresses()

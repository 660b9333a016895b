"""Node addresses followed on a real kernel: an address added to the node while the daemon
runs gets the NodePort virtual servers (and answers), a removed one loses them; ClusterIPs are
left alone. The addresses are read the way `ipvsctl run` reads them without --node-ip
(ipvsctl.kernel.addresses.node_addresses), inside the node's netns.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devkit.builders import endpoint, endpoint_slice, service
from devkit.labkit import Node, Pod, wait_for
from ipvsctl.daemon.options import DaemonOptions, DrainOptions, HTTPOptions, NodeIPs, SourceOptions
from ipvsctl.daemon.wiring import Daemon
from ipvsctl.kernel.netlink.addresses import node_addresses
from ipvsctl.kernel.netns import run_in_netns
from ipvsctl.manifests import ManifestSource
from ipvsctl.model import NodeContext
from ipvsctl.reconcile.loop import LoopConfig

pytestmark = pytest.mark.lab

VIP = "10.96.0.10"
# Different subnets: deleting a primary address also deletes the secondaries of its subnet
# (without promote_secondaries), which would take SECOND with FIRST.
FIRST, SECOND = "192.0.2.10", "198.51.100.20"
NODE_PORT = 30080


def read_in(node: Node) -> Callable[[], list[str]]:
    return lambda: run_in_netns(
        node.name, lambda: node_addresses(exclude_interfaces=("kube-ipvs0",))
    )


@pytest.fixture
def daemon(node: Node, tmp_path: Path) -> Iterator[tuple[Daemon, Pod]]:
    node.run("ip", "link", "add", "eth1", "type", "dummy")
    node.run("ip", "link", "set", "eth1", "up")
    node.run("ip", "addr", "add", f"{FIRST}/24", "dev", "eth1")
    pod = node.make_pod("10.244.1.1", name="web-1")
    folder = tmp_path / "m"
    folder.mkdir()
    objs = [
        service(
            "web",
            cluster_ip=VIP,
            type="NodePort",
            ports=[
                {
                    "name": "http",
                    "port": 80,
                    "protocol": "TCP",
                    "targetPort": 8080,
                    "nodePort": NODE_PORT,
                }
            ],
        ),
        endpoint_slice("web", [endpoint(pod.ip, pod=pod.name)]),
    ]
    (folder / "web.yaml").write_text(yaml.safe_dump_all(objs))
    read = read_in(node)
    ips = read()
    assert ips == [FIRST]  # link-local (veths), lo and kube-ipvs0 are not node IPs
    opts = DaemonOptions(
        node=NodeContext("node-a", tuple(ips)),
        source=SourceOptions(manifests=str(folder)),
        drain=DrainOptions(state_dir=str(tmp_path / "state")),
        http=HTTPOptions(listen="0.0.0.0:0"),
        node_ips=NodeIPs(follow=True),
    )
    d: Any = run_in_netns(
        node.name,
        lambda: Daemon(
            opts,
            node.kernel,
            ManifestSource(folder, interval=0.2),
            read_node_ips=read,
            loop_config=LoopConfig(audit_interval=0.5, idle_wakeup=0.1, node_ips_interval=0.5),
        ),
    )
    d.start()
    try:
        yield d, pod
    finally:
        d.shutdown()


def test_node_port_virtual_servers_follow_the_node_addresses(
    node: Node, client: Pod, daemon: tuple[Daemon, Pod]
):
    d, pod = daemon
    first, second = f"{FIRST}:{NODE_PORT}/TCP", f"{SECOND}:{NODE_PORT}/TCP"
    wait_for(lambda: first in node.ipvsadm(), timeout=180, what="the first sync")
    assert client.request(FIRST, NODE_PORT, reset=True) == pod.name

    node.run("ip", "addr", "add", f"{SECOND}/24", "dev", "eth1")
    wait_for(lambda: second in node.ipvsadm(), timeout=60, what="the added address's VS")
    assert first in node.ipvsadm()
    assert client.request(SECOND, NODE_PORT, reset=True) == pod.name

    node.run("ip", "addr", "del", f"{FIRST}/24", "dev", "eth1")
    wait_for(lambda: first not in node.ipvsadm(), timeout=60, what="the removed address's VS")
    table = node.ipvsadm()
    assert set(table) == {f"{VIP}:80/TCP", second}
    assert table[second].real_servers[f"{pod.ip}:8080"].weight == 1
    assert client.request(SECOND, NODE_PORT, reset=True) == pod.name
    with d.loop.lock:
        assert d.engine.config.node.node_ips == (SECOND,)
    assert d.metrics.value("ipvsctl_node_address_errors_total") == 0

"""Node safety counts every address of the node, on a real kernel: with the NodePort
addresses fixed (`--node-ip`), an external IP equal to another interface's address (a
docker0, a second NIC) at port 22 is never a virtual server, and an address added to or
removed from the node while the daemon runs is followed from rtnetlink's notifications
(kernel/netlink/address_watch.py), inside the node's netns.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devkit.builders import endpoint, endpoint_slice, service
from devkit.labkit import Node, Pod, wait_for
from ipvsctl.daemon.options import DaemonOptions, DrainOptions, HTTPOptions, SourceOptions
from ipvsctl.daemon.wiring import Daemon
from ipvsctl.kernel.netlink.address_watch import HostAddressWatch
from ipvsctl.kernel.netns import run_in_netns
from ipvsctl.manifests import ManifestSource
from ipvsctl.model import NodeContext
from ipvsctl.reconcile.loop import LoopConfig

pytestmark = pytest.mark.lab

NODE_IP = "192.0.2.10"  # eth1: the only NodePort address (--node-ip)
DOCKER0 = "172.17.0.1"  # docker0's, there from the start
LATER = "198.51.100.30"  # added to docker0 while the daemon runs, then removed


def ssh_service(name: str, address: str, cluster_ip: str, pod: Pod) -> list[dict[str, Any]]:
    return [
        service(
            name,
            cluster_ip=cluster_ip,
            ports=[{"name": "ssh", "port": 22, "protocol": "TCP", "targetPort": 8080}],
            externalIPs=[address],
        ),
        endpoint_slice(
            name,
            [endpoint(pod.ip, pod=pod.name)],
            ports=[{"name": "ssh", "port": 8080, "protocol": "TCP"}],
        ),
    ]


@pytest.fixture
def daemon(node: Node, tmp_path: Path) -> Iterator[Daemon]:
    node.run("ip", "link", "add", "eth1", "type", "dummy")
    node.run("ip", "link", "set", "eth1", "up")
    node.run("ip", "addr", "add", f"{NODE_IP}/24", "dev", "eth1")
    node.run("ip", "link", "add", "docker0", "type", "bridge")
    node.run("ip", "link", "set", "docker0", "up")
    node.run("ip", "addr", "add", f"{DOCKER0}/16", "dev", "docker0")
    pod = node.make_pod("10.244.1.1", name="grabber")
    folder = tmp_path / "m"
    folder.mkdir()
    objs = [
        *ssh_service("on-docker0", DOCKER0, "10.96.0.20", pod),
        *ssh_service("later", LATER, "10.96.0.21", pod),
    ]
    (folder / "ssh.yaml").write_text(yaml.safe_dump_all(objs))
    watch = HostAddressWatch("kube-ipvs0", netns=node.name).open()
    assert watch.host_addresses() == {NODE_IP, DOCKER0}  # lo, veths' fe80 and kube-ipvs0 not
    opts = DaemonOptions(
        node=NodeContext("node-a", (NODE_IP,)),
        source=SourceOptions(manifests=str(folder)),
        drain=DrainOptions(state_dir=str(tmp_path / "state")),
        http=HTTPOptions(listen="0.0.0.0:0"),
    )
    d: Any = run_in_netns(
        node.name,
        lambda: Daemon(
            opts,
            node.kernel,
            ManifestSource(folder, interval=0.2),
            host_addresses=watch,
            loop_config=LoopConfig(audit_interval=0.5, idle_wakeup=0.1),
        ),
    )
    d.start()
    try:
        yield d
    finally:
        d.shutdown()


def test_an_external_ip_on_any_interface_of_the_node_at_port_22_is_never_a_virtual_server(
    node: Node, daemon: Daemon
) -> None:
    wait_for(lambda: "10.96.0.20:22/TCP" in node.ipvsadm(), timeout=180, what="the first sync")
    table = node.ipvsadm()
    assert f"{DOCKER0}:22/TCP" not in table  # docker0's: refused, though not a --node-ip
    assert f"{LATER}:22/TCP" in table  # not the node's (yet): a virtual server
    assert list(table[f"{LATER}:22/TCP"].real_servers) == ["10.244.1.1:8080"]

    node.run("ip", "addr", "add", f"{LATER}/24", "dev", "docker0")
    wait_for(lambda: f"{LATER}:22/TCP" not in node.ipvsadm(), timeout=60, what="refused")
    assert "10.96.0.21:22/TCP" in node.ipvsadm()  # the Service's cluster IP stays

    node.run("ip", "addr", "del", f"{LATER}/24", "dev", "docker0")
    wait_for(lambda: f"{LATER}:22/TCP" in node.ipvsadm(), timeout=60, what="served again")
    with daemon.loop.lock:
        assert daemon.engine.config.node.node_ips == (NODE_IP,)
        assert daemon.engine.config.node.host_ips == {NODE_IP, DOCKER0}
    assert daemon.metrics.value("ipvsctl_node_address_errors_total") == 0

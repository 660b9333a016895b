"""This node's Node and topology hints on a real kernel, with real traffic: the daemon reads
its Node from the fake API server (one object, by field selector) and a pod on a node of
zone A reaches only zone-A endpoints; when the node's zone changes, traffic follows, the
other zone's endpoints draining at weight 0 as any leaving endpoint does."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from devkit.builders import endpoint, endpoint_slice, service
from devkit.fakeapi import objects
from devkit.fakeapi.server import FakeAPIServer
from devkit.labkit import Node, Pod, wait_for
from ipvsctl.kube.client import KubeSource
from ipvsctl.kube.settings import KubeSettings
from ipvsctl.model import Protocol, ServiceKey

pytestmark = pytest.mark.lab

VIP = "10.96.0.10"
KEY = str(ServiceKey(Protocol.TCP, VIP, 80))


def hinted(pod: Pod, zone: str) -> dict[str, Any]:
    e = endpoint(pod.ip, pod=pod.name, node=f"node-{zone}")
    e["hints"] = {"forZones": [{"name": zone}]}
    return e


@pytest.fixture
def api() -> Iterator[FakeAPIServer]:
    with FakeAPIServer() as server:
        yield server


def test_a_pod_in_zone_a_reaches_only_zone_a_endpoints_and_follows_a_zone_change(
    node: Node, client: Pod, api: FakeAPIServer, make_daemon: Callable[..., Any]
) -> None:
    a = [node.make_pod("10.244.1.1", name="a-1"), node.make_pod("10.244.1.2", name="a-2")]
    b = [node.make_pod("10.244.2.1", name="b-1"), node.make_pod("10.244.2.2", name="b-2")]
    api.add(objects.node("node-a", "zone-a"))
    api.add(objects.node("node-b", "zone-b"))  # not ours: never read
    api.add(service("web", trafficDistribution="PreferClose"))
    api.add(
        endpoint_slice("web", [hinted(p, "zone-a") for p in a] + [hinted(p, "zone-b") for p in b])
    )
    source = KubeSource.from_config(
        apiserver=api.url,
        node_name="node-a",
        settings=KubeSettings(backoff_initial=0.05, backoff_max=0.5, healthy_watch_seconds=0.05),
    )
    d = make_daemon(node, source, node_name="node-a")
    wait_for(lambda: d.engine.started, timeout=180, what="the daemon's first sync")

    # Programmed once, already narrowed: zone B's endpoints never went in.
    table = node.ipvsadm()[KEY].real_servers
    assert {k: r.weight for k, r in table.items()} == {f"{p.ip}:8080": 1 for p in a}
    assert {client.request(VIP, 80) for _ in range(8)} == {p.name for p in a}

    held = client.connect(VIP, 80)  # a live connection to a zone-A pod
    api.update(objects.node("node-a", "zone-b"))
    wait_for(
        lambda: all(
            node.ipvsadm()[KEY].real_servers.get(f"{p.ip}:8080") is not None
            and node.ipvsadm()[KEY].real_servers[f"{p.ip}:8080"].weight == 1
            for p in b
        ),
        what="zone B's endpoints added",
    )
    gone = next(p for p in a if p.name == held.pod)
    assert node.ipvsadm()[KEY].real_servers[f"{gone.ip}:8080"].weight == 0  # draining
    assert {client.request(VIP, 80) for _ in range(8)} == {p.name for p in b}
    assert held.echo("zone A's pod still serves its open connection while it drains")
    held.close()
    assert all(
        r.resource != "nodes" or r.query.get("fieldSelector") == "metadata.name=node-a"
        for r in api.requests
    )

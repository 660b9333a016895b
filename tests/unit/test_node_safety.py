"""Node safety: what a Service may never make of a node, in the daemon's
engine and in `ipvsctl plan` alike: one line, a count, and the other Services go on."""

from __future__ import annotations

import dataclasses
import json
import time
import tracemalloc
from typing import Any

import pytest
from typer.testing import CliRunner

from devkit.builders import endpoint, endpoint_slice, service
from devkit.harness import NODE, Harness, vs
from ipvsctl.cli.app import app
from ipvsctl.model import NodeContext, RealServerKey, ServiceKey
from ipvsctl.reconcile.cluster import plan_objects
from ipvsctl.source.events import ObjectKind

NODE_IP = NODE.node_ips[0]  # 192.0.2.10
GOOD = service("good", cluster_ip="10.96.0.10")
GOOD_SLICE = endpoint_slice("good", [endpoint("10.244.1.5")])


def amplifier(n_ports: int = 450, n_ips: int = 450) -> dict[str, Any]:
    """The audit's shape: a 38 KB Service that is n_ports x n_ips virtual servers."""
    ips = [f"198.18.{i // 250}.{i % 250 + 1}" for i in range(n_ips)]
    ports = [{"name": f"p{i}", "port": 1000 + i, "protocol": "TCP"} for i in range(n_ports)]
    return service("amp", cluster_ip="10.96.0.99", ports=ports, externalIPs=ips)


def kernel_keys(h: Harness) -> set[ServiceKey]:
    return {v.key for v in h.fake.list_virtual_servers()}


def invalid(h: Harness) -> float:
    return h.metrics.value("ipvsctl_invalid_objects_total", {"kind": "Service"})


def test_an_amplifying_service_is_refused_whole_before_its_table_is_built():
    """450 x 450: refused in well under a second and a few MiB (it was 202,950 virtual
    servers, 433 MiB and 16.8 s under the loop lock); the other Service is programmed."""
    h = Harness()
    h.start([GOOD], [GOOD_SLICE])
    h.ops()
    tracemalloc.start()
    try:
        t0 = time.perf_counter()
        h.upsert(amplifier())
        seconds = time.perf_counter() - t0
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert h.ops() == []
    assert not any(k.address.startswith("198.18.") for k in kernel_keys(h))
    assert vs("10.96.0.10") in kernel_keys(h)
    assert invalid(h) == 1
    assert peak < 8 << 20, f"{peak / 2**20:.1f} MiB"
    assert seconds < 2.0, seconds  # generous: shared CPUs; the old path took 10+ s


def test_a_service_at_the_limit_is_served_and_one_past_it_is_not():
    node = dataclasses.replace(NODE, max_virtual_servers=4)
    h = Harness(node=node)
    two_by_two = amplifier(2, 1)  # 2 ports x (cluster IP + 1 external IP) = 4
    h.start([two_by_two], [])
    assert len(kernel_keys(h)) == 4 and invalid(h) == 0
    h.upsert(amplifier(2, 2))  # 6: refused whole, its virtual servers leave the wanted set
    assert invalid(h) == 1
    assert h.engine.state.desired[next(iter(h.engine.state.desired))].virtual_servers == {}


def test_the_refusal_is_logged_once_not_at_every_rebuild(caplog):
    h = Harness()
    h.start([amplifier(), GOOD], [GOOD_SLICE])
    amp_slice = endpoint_slice("amp", [endpoint("10.244.2.1")])
    for i in range(3):  # endpoint changes rebuild the Service
        amp_slice["endpoints"][0]["addresses"] = [f"10.244.2.{i + 1}"]
        h.upsert(amp_slice)
    refused = [r for r in caplog.records if r.getMessage() == "virtual servers refused"]
    assert len(refused) == 1 and invalid(h) == 1
    assert "202950 virtual servers" in refused[0].__dict__["fields"]["reason"]


SPECIAL = [
    "0.0.0.0",
    "127.0.0.1",
    "127.8.9.10",
    "169.254.169.254",
    "224.0.0.251",
    "255.255.255.255",
    "::",
    "::1",
    "fe80::1",
    "ff02::1",
    "::ffff:127.0.0.1",
]


@pytest.mark.parametrize("address", SPECIAL)
@pytest.mark.parametrize("field", ["externalIPs", "lb"])
def test_special_addresses_are_never_a_virtual_server(address, field):
    svc = service(
        "evil",
        cluster_ip="10.96.0.20",
        type="LoadBalancer",
        ipFamilies=["IPv4", "IPv6"],
        **({"externalIPs": [address, "198.51.100.7"]} if field == "externalIPs" else {}),
        **({"lb_ips": [address, "198.51.100.7"]} if field == "lb" else {}),
    )
    h = Harness()
    h.start([svc, GOOD], [GOOD_SLICE])
    keys = {k.address for k in kernel_keys(h)}
    assert "198.51.100.7" in keys and "10.96.0.10" in keys
    assert not keys & {address, "::ffff:7f00:1"}
    assert invalid(h) >= 1
    result, problems = plan_objects({ObjectKind.SERVICE: [svc]}, NODE)
    assert {dvs.vs.key.address for _, dvs in result} == {"10.96.0.20", "198.51.100.7"}
    assert any("never a virtual server" in p.reason and not p.fatal for p in problems)


def test_the_api_servers_address_is_never_an_external_or_lb_ip():
    node = dataclasses.replace(NODE, apiserver_ips=frozenset({"203.0.113.1"}))
    svc = service(
        "evil",
        cluster_ip="10.96.0.20",
        type="LoadBalancer",
        externalIPs=["203.0.113.1"],
        lb_ips=["203.0.113.1", "198.51.100.8"],
    )
    h = Harness(node=node)
    h.start([svc], [])
    assert {k.address for k in kernel_keys(h)} == {"10.96.0.20", "198.51.100.8"}
    assert invalid(h) == 1


@pytest.mark.parametrize(
    ("port", "node_port", "kept"),
    [
        (22, None, False),  # sshd
        (10250, None, False),  # the kubelet
        (30080, None, True),  # inside the NodePort range: a NodePort-shaped address
    ],
)
def test_a_node_address_outside_the_node_port_range_is_never_a_virtual_server(
    port, node_port, kept
):
    svc = service(
        "evil",
        cluster_ip="10.96.0.20",
        ports=[{"name": "p", "port": port, "protocol": "TCP"}],
        externalIPs=[NODE_IP, "198.51.100.9"],
    )
    h = Harness()
    h.start([svc], [])
    keys = kernel_keys(h)
    assert (vs(NODE_IP, port) in keys) is kept
    assert vs("198.51.100.9", port) in keys and vs("10.96.0.20", port) in keys
    assert invalid(h) == (0 if kept else 1)


def test_a_node_port_outside_the_range_is_refused_too():
    """A manifest's nodePort: 22 (the API server would refuse it; `--manifests` has none)."""
    svc = service(
        "evil",
        cluster_ip="10.96.0.20",
        type="NodePort",
        ports=[{"name": "p", "port": 80, "protocol": "TCP", "nodePort": 22}],
    )
    result, problems = plan_objects({ObjectKind.SERVICE: [svc]}, NODE)
    assert [dvs.vs.key for _, dvs in result] == [vs("10.96.0.20")]
    assert problems and "outside the NodePort range" in problems[0].reason


def _write(tmp_path, *objs):
    path = tmp_path / "objs.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objs)}))
    return str(path)


def test_plan_refuses_and_reports_as_the_daemon_would(tmp_path):
    path = _write(tmp_path, amplifier(), GOOD, GOOD_SLICE)
    r = CliRunner().invoke(app, ["plan", "-f", path, "--node-ip", NODE_IP, "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert [v["address"] for v in doc["virtual_servers"]] == ["10.96.0.10"]
    assert "default/amp skipped: would make 202950 virtual servers" in r.stderr
    r = CliRunner().invoke(
        app,
        [
            "plan",
            "-f",
            path,
            "--json",
            "--node-ip",
            NODE_IP,
            "--max-virtual-servers-per-service",
            "300000",
        ],
    )
    assert len(json.loads(r.stdout)["virtual_servers"]) == 202951


def test_plan_takes_the_node_port_range(tmp_path):
    svc = service(
        "np",
        cluster_ip="10.96.0.20",
        ports=[{"name": "p", "port": 2222, "protocol": "TCP"}],
        externalIPs=[NODE_IP],
    )
    path = _write(tmp_path, svc)
    base = ["plan", "-f", path, "--node-ip", NODE_IP, "--json"]
    r = CliRunner().invoke(app, base)
    assert [v["address"] for v in json.loads(r.stdout)["virtual_servers"]] == ["10.96.0.20"]
    r = CliRunner().invoke(app, [*base, "--service-node-port-range", "2000-2999"])
    addresses = [v["address"] for v in json.loads(r.stdout)["virtual_servers"]]
    assert addresses == ["10.96.0.20", NODE_IP]


@pytest.mark.parametrize("bad", ["0", "-1", "many"])
def test_bad_max_virtual_servers_is_exit_2(bad, tmp_path):
    path = _write(tmp_path, GOOD)
    r = CliRunner().invoke(app, ["plan", "-f", path, "--max-virtual-servers-per-service", bad])
    assert r.exit_code == 2


def test_node_context_defaults_are_the_contracts():
    node = NodeContext("n")
    assert node.max_virtual_servers == 1024
    assert (node.node_port_range.start, node.node_port_range.stop - 1) == (30000, 32767)


def test_the_api_servers_host_is_resolved_once_at_start(caplog):
    from ipvsctl.daemon.adapters import with_apiserver_addresses
    from ipvsctl.daemon.options import DaemonOptions
    from ipvsctl.kube.config import host_addresses

    assert host_addresses("https://127.0.0.1:6443") == frozenset({"127.0.0.1"})
    assert host_addresses("http://[::1]:8080") == frozenset({"::1"})
    assert "127.0.0.1" in host_addresses("https://localhost:6443")
    assert host_addresses("https://no-such-host.invalid:6443") == frozenset()
    assert any("not resolved" in r.getMessage() for r in caplog.records)

    class Source:
        host = "https://127.0.0.1:6443"

    o = with_apiserver_addresses(DaemonOptions(node=NODE), Source())  # type: ignore[arg-type]
    assert o.node.apiserver_ips == frozenset({"127.0.0.1"})
    assert with_apiserver_addresses(DaemonOptions(node=NODE), object()).node == NODE  # type: ignore[arg-type]


# --- 25.4: take over only from Kubernetes proxies ------------------------------------------
KEEPALIVED = "198.51.100.50"


def _keepalived(kernel) -> None:
    """Another tool's virtual server (keepalived's), with its own real server."""
    from ipvsctl.model import RealServerKey, VirtualServer

    kernel.add_virtual_server(VirtualServer(vs(KEEPALIVED), "wlc"), False)
    kernel.add_real_server(vs(KEEPALIVED), RealServerKey("10.0.0.99", 80), 3)


def _not_keepalived(key: ServiceKey) -> bool:
    return key.address != KEEPALIVED  # ours or a Kubernetes proxy's, but keepalived's


@pytest.mark.parametrize("at", ["start", "running"])
def test_another_tools_virtual_server_is_left_alone(at, caplog):
    """A Service naming keepalived's address took its virtual server over: drained its real
    server (weight 0) and deleted it when the Service went."""
    h = Harness(may_take_over=_not_keepalived)
    h.engine.owned = _not_keepalived  # keepalived's address is on none of ours
    _keepalived(h.fake)
    h.ops()
    svc = service("web", cluster_ip="10.96.0.30", externalIPs=[KEEPALIVED])
    if at == "start":
        h.start([svc, GOOD], [GOOD_SLICE])
    else:
        h.start([GOOD], [GOOD_SLICE])
        h.upsert(svc)
    h.upsert(endpoint_slice("web", [endpoint("10.244.3.3")]))
    theirs = h.fake.services[vs(KEEPALIVED)]
    assert theirs.vs.scheduler == "wlc" and {str(k): d.weight for k, d in theirs.dests.items()} == {
        "10.0.0.99:80": 3
    }
    assert vs("10.96.0.30") in kernel_keys(h)  # the Service's other virtual servers are served
    assert h.metrics.value("ipvsctl_foreign_virtual_servers_total") == 1
    lines = [r for r in caplog.records if "another tool" in r.getMessage()]
    assert len(lines) == 1
    h.delete(svc)
    h.check(60)
    assert h.fake.services[vs(KEEPALIVED)].dests[RealServerKey("10.0.0.99", 80)].weight == 3


def test_a_kubernetes_proxys_virtual_server_is_taken_over_in_place():
    """kube-router's VIP (on kube-dummy-if) is adopted as it is: its connections live on."""
    h = Harness(may_take_over=lambda key: True)
    _keepalived(h.fake)  # the same shape, but on a proxy's interface this time
    h.fake.set_connections(vs(KEEPALIVED), RealServerKey("10.0.0.99", 80), active=2)
    h.ops()
    svc = service("web", cluster_ip="10.96.0.30", externalIPs=[KEEPALIVED])
    h.start([svc], [endpoint_slice("web", [endpoint("10.244.3.3")])])
    assert "add-vs " + str(vs(KEEPALIVED)) not in " ".join(h.ops())
    assert RealServerKey("10.244.3.3", 8080) in h.fake.services[vs(KEEPALIVED)].dests
    assert h.metrics.value("ipvsctl_foreign_virtual_servers_total") == 0

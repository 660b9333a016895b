"""Node safety counts every address of the node (CONTRACT.md "Node safety"), not only the
NodePort addresses `--node-ip` or `nodePortAddresses` chose: an external IP equal to
docker0's address or a second NIC's, at a port outside the NodePort range, is never a
virtual server. The addresses are followed from rtnetlink notifications
(kernel/netlink/address_watch.py), a change costing O(itself); the lab holds the same on a
real kernel (tests/lab/test_host_addresses_lab.py)."""

from __future__ import annotations

import dataclasses
import queue
import socket
import struct
import time

from devkit.builders import endpoint, endpoint_slice, service
from devkit.harness import NODE, Harness
from ipvsctl.kernel.netlink.address_watch import (
    IFA_ADDRESS,
    IFA_LOCAL,
    IFLA_IFNAME,
    RTM_DELADDR,
    RTM_DELLINK,
    RTM_NEWADDR,
    RTM_NEWLINK,
    AddressState,
)
from ipvsctl.model import NodeContext, ServiceRef, VirtualServerKind
from ipvsctl.plan.guard import refused_address
from ipvsctl.reconcile.loop import Loop, LoopConfig
from ipvsctl.source.events import SourceEvent

NODE_IP = NODE.node_ips[0]  # 192.0.2.10: the only NodePort address (--node-ip)
DOCKER0 = "172.17.0.1"  # another address of the node
SSH = 22


def external(name: str, ip: str, port: int, cluster_ip: str) -> dict:
    return service(
        name,
        cluster_ip=cluster_ip,
        ports=[{"name": "p", "port": port, "protocol": "TCP", "targetPort": 8080}],
        externalIPs=[ip],
    )


# --- the rule ---------------------------------------------------------------------------------
def test_every_address_of_the_node_is_a_node_address_for_the_guard() -> None:
    node = dataclasses.replace(NODE, host_ips=frozenset({NODE_IP, DOCKER0}))
    ext = VirtualServerKind.EXTERNAL_IP
    assert refused_address(ext, NODE_IP, SSH, node)  # as before
    assert refused_address(ext, DOCKER0, SSH, node)  # not a NodePort address: refused too
    assert refused_address(VirtualServerKind.LOAD_BALANCER, DOCKER0, 10250, node)
    assert refused_address(ext, DOCKER0, 30080, node) is None  # in the NodePort range
    assert refused_address(ext, "198.51.100.7", SSH, node) is None  # not the node's
    assert refused_address(ext, DOCKER0, SSH, NODE) is None  # an address it does not hold


# --- the engine -------------------------------------------------------------------------------
def started(host_ips: frozenset[str]) -> Harness:
    h = Harness(node=dataclasses.replace(NODE, host_ips=host_ips))
    h.start(
        [
            external("ssh", DOCKER0, SSH, "10.96.0.20"),
            external("web", "198.51.100.7", 80, "10.96.0.21"),
            service("db", cluster_ip="10.96.0.22"),
        ],
        [
            endpoint_slice("ssh", [endpoint("10.244.1.5")]),
            endpoint_slice("web", [endpoint("10.244.1.6")]),
            endpoint_slice("db", [endpoint("10.244.1.7")]),
        ],
    )
    return h


def keys(h: Harness) -> set[str]:
    return {str(v.key) for v in h.fake.list_virtual_servers()}


def test_an_external_ip_on_another_interface_of_the_node_at_port_22_is_refused() -> None:
    h = started(frozenset({NODE_IP, DOCKER0}))
    assert f"{DOCKER0}:22/TCP" not in keys(h)
    assert "10.96.0.20:22/TCP" in keys(h)  # the Service's others are served
    assert h.metrics.value("ipvsctl_invalid_objects_total", {"kind": "Service"}) == 1


def test_a_node_address_that_comes_or_goes_touches_only_the_services_that_name_it() -> None:
    h = started(frozenset({NODE_IP}))
    assert f"{DOCKER0}:22/TCP" in keys(h)  # not the node's (yet): a virtual server
    h.ops()
    assert h.engine.set_host_ips(frozenset({NODE_IP, DOCKER0}))  # docker0 came up
    assert h.engine.dirty == {ServiceRef("default", "ssh")}
    h.engine.sync()
    assert f"{DOCKER0}:22/TCP" not in keys(h)
    assert not h.engine.set_host_ips(frozenset({NODE_IP, DOCKER0}))  # no change: no work
    assert h.engine.set_host_ips(frozenset({NODE_IP}))  # and went
    assert h.engine.dirty == {ServiceRef("default", "ssh")}
    h.engine.sync()
    assert f"{DOCKER0}:22/TCP" in keys(h)
    assert h.engine.config.node.node_ips == (NODE_IP,)  # the NodePort addresses: untouched


def test_the_address_index_follows_service_changes() -> None:
    h = started(frozenset({NODE_IP}))
    h.upsert(external("ssh", "198.51.100.8", SSH, "10.96.0.20"))  # no longer docker0's
    h.ops()
    h.engine.set_host_ips(frozenset({NODE_IP, DOCKER0}))
    assert h.engine.dirty == set()
    h.upsert(external("web", DOCKER0, SSH, "10.96.0.21"))
    h.engine.set_host_ips(frozenset({NODE_IP}))
    assert h.engine.dirty == {ServiceRef("default", "web")}


# --- the loop ---------------------------------------------------------------------------------
class Followed:
    """HostAddresses as the watch publishes them."""

    def __init__(self, host: set[str], node: list[str]) -> None:
        self.version = 1
        self.host, self.node = frozenset(host), node

    def host_addresses(self) -> frozenset[str]:
        return self.host

    def node_addresses(self) -> list[str]:
        return list(self.node)

    def change(self, host: set[str], node: list[str]) -> None:
        self.host, self.node = frozenset(host), node
        self.version += 1


def test_the_loop_takes_a_change_at_its_next_step_without_a_dump() -> None:
    h = started(frozenset({NODE_IP}))
    followed = Followed({NODE_IP}, [NODE_IP])
    reads: list[int] = []

    def read_node_ips() -> list[str]:
        reads.append(1)
        return followed.node_addresses()

    events: queue.Queue[SourceEvent] = queue.Queue()
    loop = Loop(
        h.engine,
        events,
        LoopConfig(node_ips_interval=3600.0),
        clock=h.clock,
        read_node_ips=read_node_ips,
        host_addresses=followed,
    )
    loop.step()
    assert reads == [] and f"{DOCKER0}:22/TCP" in keys(h)
    followed.change({NODE_IP, DOCKER0}, [NODE_IP, DOCKER0])
    loop.step()
    assert f"{DOCKER0}:22/TCP" not in keys(h)
    assert h.engine.config.node.host_ips == {NODE_IP, DOCKER0}
    # a followed change re-reads the NodePort addresses too, at once, not at the interval
    assert reads == [1] and h.engine.config.node.node_ips == (NODE_IP, DOCKER0)
    loop.step()
    assert reads == [1]  # nothing changed: nothing read


# --- what the messages say --------------------------------------------------------------------
def _nla(kind: int, payload: bytes) -> bytes:
    n = 4 + len(payload)
    return struct.pack("=HH", n, kind) + payload + b"\0" * (-n & 3)


def link(index: int, name: str, kind: int = RTM_NEWLINK) -> tuple[int, bytes]:
    body = struct.pack("=BxHiII", 0, 1, index, 0, 0) + _nla(IFLA_IFNAME, name.encode() + b"\0")
    return kind, struct.pack("=IHHII", 16 + len(body), kind, 0, 0, 0) + body


def addr(index: int, address: str, scope: int = 0, kind: int = RTM_NEWADDR) -> tuple[int, bytes]:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    raw = socket.inet_pton(family, address)
    attrs = _nla(IFA_ADDRESS, raw) + (_nla(IFA_LOCAL, raw) if family == socket.AF_INET else b"")
    body = struct.pack("=BBBBI", family, 24, 0, scope, index) + attrs
    return kind, struct.pack("=IHHII", 16 + len(body), kind, 0, 0, 0) + body


def state_of(*messages: tuple[int, bytes]) -> AddressState:
    s = AddressState("kube-ipvs0")
    for kind, msg in messages:
        s.apply(kind, msg)
    return s


def test_every_interface_counts_but_the_proxies_dummy_ones() -> None:
    s = state_of(
        link(1, "lo"),
        addr(1, "127.0.0.1", scope=254),
        link(2, "eth0"),
        addr(2, NODE_IP),
        link(3, "docker0"),
        addr(3, DOCKER0),
        link(4, "kube-ipvs0"),
        addr(4, "10.96.0.10"),
        link(5, "kube-dummy-if"),
        addr(5, "10.96.0.11"),
        addr(2, "fe80::1", scope=253),
        addr(6, "198.51.100.20"),  # its link not yet named: the node's until known
    )
    assert s.host_addresses() == {NODE_IP, DOCKER0, "198.51.100.20"}
    # as `addresses.node_addresses` (the default --node-ip): global, not lo, not the VIP
    # interface (another proxy's dummy interface is not left out there)
    assert s.node_addresses() == sorted([NODE_IP, DOCKER0, "198.51.100.20", "10.96.0.11"])
    s.apply(*link(6, "kube-dummy-if"))  # named: a proxy's
    assert s.host_addresses() == {NODE_IP, DOCKER0}


def test_a_pods_veth_coming_and_going_changes_nothing() -> None:
    s = state_of(link(2, "eth0"), addr(2, NODE_IP))
    s.changed = False
    for kind, msg in (
        link(40, "veth1a2b"),
        addr(40, "fe80::40", scope=253),
        addr(40, "fe80::40", scope=253, kind=RTM_DELADDR),
        link(40, "veth1a2b", kind=RTM_DELLINK),
    ):
        s.apply(kind, msg)
    assert not s.changed and s.host_addresses() == {NODE_IP}


def test_an_address_removed_or_its_link_gone_leaves_the_sets() -> None:
    s = state_of(link(2, "eth0"), addr(2, NODE_IP), link(3, "eth1"), addr(3, DOCKER0))
    s.changed = False
    s.apply(*addr(2, NODE_IP, kind=RTM_DELADDR))
    assert s.changed and s.host_addresses() == {DOCKER0}
    s.apply(*link(3, "eth1", kind=RTM_DELLINK))
    assert s.host_addresses() == frozenset() and s.node_addresses() == []
    # the same address on two interfaces counts until both are gone
    s = state_of(link(2, "eth0"), addr(2, DOCKER0), link(3, "br0"), addr(3, DOCKER0))
    s.apply(*addr(2, DOCKER0, kind=RTM_DELADDR))
    assert s.host_addresses() == {DOCKER0}


def test_a_node_context_without_followed_addresses_is_as_before() -> None:
    assert NodeContext("n").host_ips == frozenset()


# --- plan, as this machine ------------------------------------------------------------------
def test_plan_as_this_machine_refuses_any_of_its_addresses(tmp_path, monkeypatch) -> None:
    import json

    import yaml
    from typer.testing import CliRunner

    from ipvsctl.cli import app as cli
    from ipvsctl.daemon import options

    anycast = "10.255.0.1"  # on lo: not a NodePort address, still the node's (sshd answers)
    monkeypatch.setattr(options, "read_host_addresses", lambda interface: [NODE_IP])
    monkeypatch.setattr(cli, "_all_addresses", lambda interface: frozenset({NODE_IP, anycast}))
    f = tmp_path / "m.yaml"
    f.write_text(yaml.safe_dump_all([external("grab", anycast, SSH, "10.96.0.30")]))
    r = CliRunner().invoke(cli.app, ["plan", "-f", str(f), "--json"])
    assert r.exit_code == 0, r.output
    assert [v["address"] for v in json.loads(r.stdout)["virtual_servers"]] == ["10.96.0.30"]
    assert f"{anycast}:22 is a node address" in r.stderr
    # with --node-ip, this machine's other addresses are not known: as before
    r = CliRunner().invoke(cli.app, ["plan", "-f", str(f), "--json", "--node-ip", NODE_IP])
    assert len(json.loads(r.stdout)["virtual_servers"]) == 2


# --- the watch on this machine's kernel (reading rtnetlink needs no privilege) ---------------
def test_the_watch_reads_what_the_start_up_read_reads() -> None:
    from ipvsctl.kernel.netlink.address_watch import HostAddressWatch
    from ipvsctl.kernel.netlink.addresses import node_addresses

    watch = HostAddressWatch().open()
    try:
        assert watch.node_addresses() == node_addresses()
        assert set(watch.node_addresses()) <= watch.host_addresses()
        assert watch.version == 1
        assert not watch.poll(0.0)  # nothing changed
    finally:
        watch.close()


def test_a_failing_watch_keeps_the_addresses_and_opens_again(monkeypatch, caplog) -> None:
    import logging
    import threading

    from ipvsctl.kernel.netlink import address_watch
    from ipvsctl.kernel.netlink.address_watch import HostAddressWatch

    monkeypatch.setattr(address_watch, "RETRY_MIN", 0.01)
    errors: list[int] = []
    watch = HostAddressWatch(on_error=lambda: errors.append(1)).open()
    known = watch.host_addresses()

    class Broken:
        def fileno(self) -> int:
            raise OSError(9, "the socket failed")

        def close(self) -> None:
            pass

    watch._sock = Broken()  # type: ignore[assignment]
    stop = threading.Event()
    thread = threading.Thread(target=watch.run, args=(stop,), daemon=True)
    with caplog.at_level(logging.INFO, logger="ipvsctl.kernel"):
        thread.start()
        deadline = time.monotonic() + 10
        while "node addresses followed again" not in caplog.text:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        stop.set()
        thread.join(5)
    assert not thread.is_alive() and errors == [1]
    assert watch.host_addresses() == known
    assert caplog.text.count("node addresses not followed") == 1

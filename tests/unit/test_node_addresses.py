"""Node addresses followed at runtime: NodePort virtual servers move with the node's IPs.

Without --node-ip the loop re-reads the node's addresses every `node_ips_interval`; a change
re-syncs only the Services with a nodePort (never a walk of all Services), a failed read
keeps the addresses in force, and with --node-ip nothing is ever re-read.
"""

from __future__ import annotations

import logging
import queue
from pathlib import Path

import pytest

from devkit.builders import endpoint, endpoint_slice, service
from devkit.harness import Harness, rs, vs
from ipvsctl.daemon.adapters import node_ips_reader
from ipvsctl.daemon.options import DaemonOptions, DrainOptions, HTTPOptions, NodeIPs, SourceOptions
from ipvsctl.daemon.wiring import Daemon
from ipvsctl.kernel.fake import FakeKernel
from ipvsctl.manifests import ManifestSource
from ipvsctl.model import DesiredService, NodeContext, ServiceRef, VirtualServer
from ipvsctl.model.portrange import DEFAULT_NODE_PORT_RANGE
from ipvsctl.reconcile.feed import Subscriptions
from ipvsctl.reconcile.loop import Loop, LoopConfig
from ipvsctl.source.events import ObjectKind, Replace
from tests.unit.test_daemon import wait_for, write

OLD, NEW = "192.0.2.10", "192.0.2.11"  # OLD is the harness's node IP
A, B, C = "10.244.1.5", "10.244.1.6", "10.244.1.7"
WEB, LB, DB = ServiceRef("default", "web"), ServiceRef("default", "lb"), ServiceRef("default", "db")


def node_port(
    name: str, cluster_ip: str, node_port: int, type: str = "NodePort", **spec: object
) -> dict:
    return service(
        name,
        cluster_ip=cluster_ip,
        type=type,
        ports=[
            {
                "name": "http",
                "port": 80,
                "protocol": "TCP",
                "targetPort": 8080,
                "nodePort": node_port,
            }
        ],
        **spec,
    )


def cluster() -> tuple[list[dict], list[dict]]:
    """A NodePort, a LoadBalancer (with a nodePort) and a ClusterIP-only Service."""
    services = [
        node_port("web", "10.96.0.10", 30080),
        node_port("lb", "10.96.0.12", 30443, type="LoadBalancer", lb_ips=["198.51.100.9"]),
        service("db", cluster_ip="10.96.0.11"),
    ]
    slices = [
        endpoint_slice("web", [endpoint(A)]),
        endpoint_slice("lb", [endpoint(B)]),
        endpoint_slice("db", [endpoint(C)]),
    ]
    return services, slices


def started() -> Harness:
    h = Harness()
    h.start(*cluster())
    h.ops()
    return h


# --- the engine ------------------------------------------------------------------------
def test_an_address_change_resyncs_only_node_port_services():
    h = started()
    assert h.engine.set_node_ips([NEW])
    assert h.engine.dirty == {WEB, LB}  # db (ClusterIP only) is not even looked at
    result = h.engine.sync()
    assert result.services == 2 and not result.failed
    ops = h.ops()
    assert sorted(ops) == sorted(
        [
            f"add-vs {NEW}:30080/TCP rr",
            f"add-rs {NEW}:30080/TCP -> {A}:8080 weight 1",
            f"del-vs {OLD}:30080/TCP",
            f"add-vs {NEW}:30443/TCP rr",
            f"add-rs {NEW}:30443/TCP -> {B}:8080 weight 1",
            f"del-vs {OLD}:30443/TCP",
        ]
    )
    # The new address's virtual server comes before the old one goes: no window without.
    assert ops.index(f"add-vs {NEW}:30080/TCP rr") < ops.index(f"del-vs {OLD}:30080/TCP")
    assert vs(OLD, 30080) not in h.fake.services and vs(OLD, 30443) not in h.fake.services
    assert h.fake.weight(vs(NEW, 30080), rs(A)) == 1
    assert h.fake.weight(vs(NEW, 30443), rs(B)) == 1
    # ClusterIPs, the load-balancer IP and db are as they were.
    assert h.fake.weight(vs("10.96.0.11"), rs(C)) == 1
    assert h.fake.weight(vs("198.51.100.9"), rs(B)) == 1
    assert h.engine.config.node.node_ips == (NEW,)
    assert h.engine.intake.node_ips_known == {OLD, NEW}  # a leftover on OLD is still ours


def test_an_added_address_adds_and_keeps_the_old_one():
    h = started()
    assert h.engine.set_node_ips([OLD, NEW])
    h.engine.sync()
    assert sorted(h.ops()) == sorted(
        [
            f"add-vs {NEW}:30080/TCP rr",
            f"add-rs {NEW}:30080/TCP -> {A}:8080 weight 1",
            f"add-vs {NEW}:30443/TCP rr",
            f"add-rs {NEW}:30443/TCP -> {B}:8080 weight 1",
        ]
    )
    assert h.fake.weight(vs(OLD, 30080), rs(A)) == 1


def test_same_addresses_in_another_order_change_nothing():
    h = Harness(node=NodeContext("node-a", (OLD, NEW)))
    h.start(*cluster())
    h.ops()
    assert not h.engine.set_node_ips([NEW, OLD, NEW])
    assert not h.engine.dirty
    assert h.engine.sync().services == 0 and h.ops() == []


def test_the_index_follows_services_becoming_and_leaving_node_port():
    h = started()
    h.upsert(service("web", cluster_ip="10.96.0.10"))  # NodePort -> ClusterIP
    h.delete(node_port("lb", "10.96.0.12", 30443))
    h.upsert(node_port("db", "10.96.0.11", 30053))  # ClusterIP -> NodePort
    h.ops()
    assert h.engine.set_node_ips([NEW])
    assert h.engine.dirty == {DB}
    h.engine.sync()
    assert sorted(h.ops()) == sorted(
        [
            f"add-vs {NEW}:30053/TCP rr",
            f"add-rs {NEW}:30053/TCP -> {C}:8080 weight 1",
            f"del-vs {OLD}:30053/TCP",
        ]
    )


def test_node_port_listeners_see_the_move():
    """Netfilter rules and health checks follow Services through the service listeners:
    they are told about the NodePort Services, with the new address's virtual server."""
    h = started()
    seen: list[tuple[ServiceRef, DesiredService | None, DesiredService | None]] = []
    h.feed.subscribe(Subscriptions(service=lambda ref, old, new: seen.append((ref, old, new))))
    h.engine.set_node_ips([NEW])
    h.engine.sync()
    assert sorted(ref for ref, _, _ in seen) == [LB, WEB]
    for _, old, new in seen:
        assert old is not None and new is not None
        assert {k.address for k in old.virtual_servers} - {
            k.address for k in new.virtual_servers
        } == {OLD}
        assert NEW in {k.address for k in new.virtual_servers}


def test_a_change_before_the_first_sync_is_used_by_it():
    h = Harness()
    assert h.engine.set_node_ips([NEW])
    h.start(*cluster())
    assert vs(NEW, 30080) in h.fake.services and vs(OLD, 30080) not in h.fake.services


def test_the_audit_deletes_a_leftover_on_a_removed_address():
    """Ownership follows the addresses: with the daemon's rule (NodePorts on node IPs), a
    virtual server on an address removed while running is still recognised as ours."""
    h = started()
    e = h.engine
    e.owned = lambda key: (
        key.port in DEFAULT_NODE_PORT_RANGE and key.address in e.intake.node_ips_known
    )
    e.set_node_ips([NEW])
    e.sync()
    h.fake.add_virtual_server(VirtualServer(vs(OLD, 31000), "rr"), False)  # not ipvsctl's doing
    h.ops()
    h.audit()
    assert vs(OLD, 31000) not in h.fake.services


# --- the loop --------------------------------------------------------------------------
class Reader:
    def __init__(self, ips: list[str]) -> None:
        self.ips = ips
        self.calls = 0
        self.error: Exception | None = None

    def __call__(self) -> list[str]:
        self.calls += 1
        if self.error is not None:
            raise self.error
        return list(self.ips)


def make_loop(read: Reader | None) -> tuple[Harness, Loop]:
    h = Harness()
    events: queue.Queue = queue.Queue()
    loop = Loop(
        h.engine, events, LoopConfig(node_ips_interval=10), clock=h.clock, read_node_ips=read
    )
    services, slices = cluster()
    events.put(Replace(ObjectKind.SERVICE, services, 0))
    events.put(Replace(ObjectKind.ENDPOINT_SLICE, slices, 0))
    loop.step()
    assert h.engine.started
    h.ops()
    return h, loop


def test_the_loop_rereads_every_interval_and_syncs_a_change_at_once():
    read = Reader([OLD])
    h, loop = make_loop(read)
    assert read.calls == 0  # the start-up addresses are fresh
    h.clock.advance(9.9)
    loop.step()
    assert read.calls == 0
    h.clock.advance(0.1)
    loop.step()
    assert read.calls == 1 and h.ops() == []  # unchanged: no sync, no kernel op
    read.ips = [NEW]
    h.clock.advance(10)
    loop.step()  # no event arrived: the change alone triggers the sync
    assert read.calls == 2
    ops = h.ops()
    assert len(ops) == 6 and not any("10.96.0.11" in op or C in op for op in ops)
    assert vs(NEW, 30080) in h.fake.services and vs(OLD, 30080) not in h.fake.services
    assert loop._timeout() <= 10


def test_a_failed_read_keeps_the_addresses_and_is_logged_once(caplog):
    read = Reader([OLD])
    h, loop = make_loop(read)
    read.error = OSError("netlink socket closed")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="ipvsctl.loop"):
        for _ in range(3):
            h.clock.advance(10)
            loop.step()
    assert read.calls == 3
    assert h.metrics.value("ipvsctl_node_address_errors_total") == 3
    assert [r.message for r in caplog.records if r.name == "ipvsctl.loop"] == [
        "node addresses unreadable, keeping the current ones"
    ]
    assert h.engine.config.node.node_ips == (OLD,)
    assert h.ops() == [] and vs(OLD, 30080) in h.fake.services
    read.error, read.ips = None, [NEW]
    caplog.clear()
    with caplog.at_level(logging.INFO):
        h.clock.advance(10)
        loop.step()
    assert vs(NEW, 30080) in h.fake.services and vs(OLD, 30080) not in h.fake.services
    messages = [r.message for r in caplog.records]
    assert "node addresses readable again" in messages
    changed = [r for r in caplog.records if r.message == "node addresses changed"]
    assert len(changed) == 1 and changed[0].levelno == logging.INFO


def test_fixed_node_ips_never_poll():
    h, loop = make_loop(None)
    for _ in range(5):
        h.clock.advance(60)
        loop.step()
    assert h.engine.config.node.node_ips == (OLD,) and h.ops() == []
    opts = DaemonOptions(node=NodeContext("node-a", (OLD,)))  # --node-ip given
    assert node_ips_reader(opts) is None
    assert node_ips_reader(DaemonOptions(node=opts.node, node_ips=NodeIPs(follow=True))) is not None


# --- the daemon in-process ---------------------------------------------------------------
@pytest.fixture
def daemon(tmp_path: Path):
    folder = tmp_path / "m"
    folder.mkdir()
    services, slices = cluster()
    write(folder, "all.yaml", *services, *slices)
    read = Reader([OLD])
    opts = DaemonOptions(
        node=NodeContext("node-a", (OLD,)),
        source=SourceOptions(manifests=str(folder)),
        drain=DrainOptions(state_dir=str(tmp_path / "state")),
        http=HTTPOptions(listen="127.0.0.1:0"),
        node_ips=NodeIPs(follow=True),
    )
    kernel = FakeKernel()
    d = Daemon(
        opts,
        kernel,
        ManifestSource(folder, interval=0.05),
        read_node_ips=read,
        loop_config=LoopConfig(idle_wakeup=0.05, node_ips_interval=0.05),
    )
    d.start()
    try:
        yield d, kernel, read
    finally:
        d.shutdown()


def test_the_daemon_follows_the_node_addresses(daemon):
    d, kernel, read = daemon
    wait_for(lambda: d.engine.started and vs(OLD, 30080) in kernel.services)
    with d.loop.lock:
        read.ips = [NEW]
    wait_for(lambda: vs(NEW, 30080) in kernel.services and vs(OLD, 30080) not in kernel.services)
    with d.loop.lock:
        assert d.engine.config.node.node_ips == (NEW,)
        assert kernel.weight(vs("10.96.0.11"), rs(C)) == 1
    assert d.loop.read_node_ips is read

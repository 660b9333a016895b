"""Conntrack: which entries go (plan/conntrack.py, in the style of kube-proxy's
cleanup_test.go: a removed real server's, and the stale ones), when the stale ones are swept
(reconcile/conntrack_sweeper.py), and the netlink adapter's decoding, filters and errors
(kernel/netlink/conntrack.py)."""

from __future__ import annotations

import errno
import logging
import socket
import threading
import time

import pytest
import yaml
from pyroute2 import NetlinkError
from pyroute2.netlink.nfnetlink.nfctsocket import NFCTAttrTuple, nfct_msg

from devkit.builders import endpoint, endpoint_slice, service, terminating
from devkit.harness import Harness
from ipvsctl.daemon.options import DaemonOptions, DrainOptions, HTTPOptions, SourceOptions
from ipvsctl.daemon.wiring import Daemon
from ipvsctl.kernel.fake import FakeKernel
from ipvsctl.kernel.netlink.conntrack import NetlinkConntrack, entry_from_message
from ipvsctl.kernel.port import KernelPermissionDenied, KernelTransient, KernelUnavailable
from ipvsctl.manifests import ManifestSource
from ipvsctl.model import NodeContext, Protocol, RealServerKey, ServiceKey
from ipvsctl.model.conntrack import ConntrackEntry
from ipvsctl.plan.conntrack import (
    newly_served,
    real_server_entries,
    stale_entries,
    sweep_table,
)
from ipvsctl.reconcile.conntrack_sweeper import ConntrackSweeper, SweepConfig, SweepResult
from ipvsctl.reconcile.feed import Subscriptions
from ipvsctl.reconcile.paced import PacedRunner

CLUSTER_IP, CLUSTER_IP6 = "10.96.0.10", "fd96::10"
EXTERNAL_IP, LB_IP, NODE_IP = "203.0.113.5", "198.51.100.7", "192.0.2.10"
EP1, EP2, GONE, CLIENT = "10.244.1.1", "10.244.1.2", "10.244.9.9", "10.0.0.100"
UDP_PORTS = [{"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 5353, "nodePort": 30053}]
SLICE_PORTS = [{"name": "dns", "port": 5353, "protocol": "UDP"}]


def udp_service(
    name: str = "dns", cluster_ip: str | list[str] = CLUSTER_IP, **spec: object
) -> dict:
    spec = {"type": "LoadBalancer", "externalIPs": [EXTERNAL_IP], "lb_ips": [LB_IP], **spec}
    return service(name, cluster_ip, ports=UDP_PORTS, **spec)


def udp_slice(endpoints: list[dict], name: str = "dns", address_type: str = "IPv4") -> dict:
    return endpoint_slice(
        name,
        endpoints,
        ports=SLICE_PORTS,
        address_type=address_type,
        name=f"{name}-{address_type.lower()}",
    )


def entry(
    dst: str,
    reply_src: str,
    dport: int = 53,
    proto: Protocol = Protocol.UDP,
    src: str = CLIENT,
    sport: int = 40000,
    reply_sport: int | None = None,
) -> ConntrackEntry:
    """An entry sent to dst:dport, answered from reply_src: by an endpoint at its port
    (5353), or by the address sent to at the port sent to."""
    if reply_sport is None:
        reply_sport = dport if reply_src == dst else 5353
    return ConntrackEntry(proto, src, sport, dst, dport, reply_src, reply_sport)


def desired(services: list[dict], slices: list[dict]) -> Harness:
    h = Harness()
    h.start(services, slices)
    return h


# --- which entries --------------------------------------------------------------------------
SERVED = ([udp_service()], [udp_slice([endpoint(EP1), endpoint(EP2)])])

CASES = [
    # name, (services, slices), entry, stale
    ("cluster IP answered by a serving endpoint", SERVED, entry(CLUSTER_IP, EP1), False),
    (
        "cluster IP answered by the VIP itself (made with no virtual server)",
        SERVED,
        entry(CLUSTER_IP, CLUSTER_IP),
        True,
    ),
    ("cluster IP answered by an endpoint that is gone", SERVED, entry(CLUSTER_IP, GONE), True),
    ("external IP answered by the VIP", SERVED, entry(EXTERNAL_IP, EXTERNAL_IP), True),
    ("load-balancer IP answered by the VIP", SERVED, entry(LB_IP, LB_IP), True),
    ("load-balancer IP answered by an endpoint", SERVED, entry(LB_IP, EP2), False),
    (
        "node address + NodePort answered by the node",
        SERVED,
        entry(NODE_IP, NODE_IP, dport=30053),
        True,
    ),
    (
        "node address + NodePort answered by an endpoint",
        SERVED,
        entry(NODE_IP, EP1, dport=30053),
        False,
    ),
    ("node address, not the NodePort", SERVED, entry(NODE_IP, NODE_IP, dport=30054), False),
    ("cluster IP, another port", SERVED, entry(CLUSTER_IP, CLUSTER_IP, dport=54), False),
    ("not a Service address", SERVED, entry("10.1.2.3", "10.1.2.3"), False),
    (
        "a TCP entry to a UDP frontend",
        SERVED,
        entry(CLUSTER_IP, CLUSTER_IP, proto=Protocol.TCP),
        False,
    ),
    (
        "a Service with no endpoint is left alone",
        ([udp_service()], [udp_slice([])]),
        entry(CLUSTER_IP, CLUSTER_IP),
        False,
    ),
    (
        "a Service whose only endpoint is not serving is left alone",
        ([udp_service()], [udp_slice([endpoint(EP1, ready=False, serving=False)])]),
        entry(CLUSTER_IP, CLUSTER_IP),
        False,
    ),
    (
        "a terminating endpoint still serving keeps its entries",
        ([udp_service()], [udp_slice([endpoint(EP1), terminating(EP2)])]),
        entry(CLUSTER_IP, EP2),
        False,
    ),
    (
        "an endpoint of another node (Local policy) keeps its entries on the external IP",
        (
            [udp_service(externalTrafficPolicy="Local")],
            [udp_slice([endpoint(EP1), endpoint(EP2, node="node-b")])],
        ),
        entry(EXTERNAL_IP, EP2),
        False,
    ),
    (
        "SCTP too",
        (
            [
                service(
                    "s", ports=[{"name": "s", "port": 99, "protocol": "SCTP", "targetPort": 9999}]
                )
            ],
            [
                endpoint_slice(
                    "s", [endpoint(EP1)], ports=[{"name": "s", "port": 9999, "protocol": "SCTP"}]
                )
            ],
        ),
        entry(CLUSTER_IP, CLUSTER_IP, dport=99, proto=Protocol.SCTP),
        True,
    ),
    (
        "TCP Services are not swept",
        ([service("web")], [endpoint_slice("web", [endpoint(EP1)])]),
        entry(CLUSTER_IP, CLUSTER_IP, dport=80, proto=Protocol.TCP),
        False,
    ),
    (
        "IPv6 cluster IP answered by the VIP",
        (
            [udp_service(cluster_ip=[CLUSTER_IP6], ipFamilies=["IPv6"], externalIPs=[], lb_ips=[])],
            [udp_slice([endpoint("fd00::1")], address_type="IPv6")],
        ),
        entry(CLUSTER_IP6, CLUSTER_IP6, src="fd01::100"),
        True,
    ),
    (
        "IPv6 cluster IP answered by an endpoint",
        (
            [udp_service(cluster_ip=[CLUSTER_IP6], ipFamilies=["IPv6"], externalIPs=[], lb_ips=[])],
            [udp_slice([endpoint("fd00::1")], address_type="IPv6")],
        ),
        entry(CLUSTER_IP6, "fd00::1", src="fd01::100"),
        False,
    ),
]


@pytest.mark.parametrize(
    ("objects", "e", "stale"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_stale_entries(
    objects: tuple[list[dict], list[dict]], e: ConntrackEntry, stale: bool
) -> None:
    h = desired(*objects)
    table = sweep_table(h.engine.state.desired.values())
    assert stale_entries([e], table) == ([e] if stale else [])


def test_dumps_only_what_has_a_swept_frontend() -> None:
    h = desired(*SERVED)
    assert sweep_table(h.engine.state.desired.values()).dumps() == [(Protocol.UDP, False)]
    assert (
        sweep_table(desired([udp_service()], [udp_slice([])]).engine.state.desired.values()).dumps()
        == []
    )


def test_many_entries_one_pass_sorted() -> None:
    h = desired(*SERVED)
    entries = [entry(CLUSTER_IP, EP1, sport=p) for p in range(1000, 1100)]
    stale = [entry(CLUSTER_IP, CLUSTER_IP, sport=p) for p in (2002, 2001)]
    assert stale_entries(entries + stale, sweep_table(h.engine.state.desired.values())) == sorted(
        stale
    )


# --- when -----------------------------------------------------------------------------------
def _desired_of(objects: tuple[list[dict], list[dict]]):
    return next(iter(desired(*objects).engine.state.desired.values()))


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        (None, SERVED, True),  # a new Service with endpoints
        (([udp_service()], [udp_slice([])]), SERVED, True),  # zero serving endpoints -> some
        (SERVED, ([udp_service()], [udp_slice([endpoint(EP1)])]), False),  # some -> fewer
        (SERVED, ([udp_service()], [udp_slice([])]), False),  # some -> none
        (None, ([service("web")], [endpoint_slice("web", [endpoint(EP1)])]), False),  # TCP
        (SERVED, None, False),  # deleted
    ],
    ids=["created", "zero-to-some", "some-to-fewer", "some-to-none", "tcp", "deleted"],
)
def test_newly_served(old, new, expected) -> None:
    assert (
        newly_served(_desired_of(old) if old else None, _desired_of(new) if new else None)
        == expected
    )


class Sweep:
    """An engine on the fake kernel, its conntrack table and a sweeper on one clock."""

    def __init__(self, services: list[dict], slices: list[dict]) -> None:
        self.h = Harness()
        self.fake = self.h.fake
        self.lock = threading.Lock()
        self.sweeper = ConntrackSweeper(
            self.h.view,
            self.fake,
            self.lock,
            self.h.metrics,
            clock=self.h.clock,
            config=SweepConfig(interval=60),
        )
        self.runner = PacedRunner(
            "conntrack",
            self.sweeper,
            self.lock,
            self.sweeper.pace(),
            clock=self.h.clock,
            wake=self.sweeper.wake,
        )
        self.h.feed.subscribe(Subscriptions(service=self.sweeper.on_service))
        self.services, self.slices = services, slices

    def step(self) -> SweepResult | None:
        """One pass of the runner: the sweep's result, None when none was due (or it
        failed)."""
        before = self.sweeper.last
        ran = self.runner.step()
        return self.sweeper.last if ran and self.sweeper.last is not before else None

    def start(self) -> None:
        self.h.start(self.services, self.slices)

    def deleted(self) -> float:
        return self.h.metrics.value("ipvsctl_conntrack_stale_entries_deleted_total")


def test_sweeps_after_the_first_sync_then_only_when_due() -> None:
    s = Sweep(*SERVED)
    stale, live = entry(CLUSTER_IP, CLUSTER_IP), entry(CLUSTER_IP, EP1, sport=40001)
    s.fake.conntrack = {stale, live}
    assert s.step() is None  # not before the first sync
    assert s.fake.conntrack_dumps == []
    assert s.runner.timeout() == 1.0  # the thread polls for it, never spins
    s.start()
    result = s.step()
    assert result is not None and (result.reason, result.examined, result.deleted) == (
        "start-up",
        2,
        1,
    )
    assert s.fake.conntrack == {live}
    assert s.deleted() == 1
    assert s.step() is None  # nothing asked, the periodic sweep not due
    assert s.runner.timeout() == 1.0
    s.h.clock.advance(59.5)
    assert s.step() is None
    s.h.clock.advance(0.5)
    s.fake.conntrack.add(stale)
    result = s.step()
    assert result is not None and (result.reason, result.deleted) == ("periodic", 1)
    assert s.fake.conntrack_dumps == [(Protocol.UDP, False)] * 2
    assert s.h.metrics.value("ipvsctl_conntrack_sweeps_total", {"result": "ok"}) == 2


def test_a_service_getting_its_first_endpoint_asks_for_a_sweep() -> None:
    s = Sweep([udp_service()], [udp_slice([])])
    s.start()
    s.step()  # start-up: no frontend with endpoints, no dump at all
    assert s.fake.conntrack_dumps == []
    stale = entry(CLUSTER_IP, CLUSTER_IP)  # a client sent while there was no endpoint
    s.fake.conntrack = {stale}
    s.h.clock.advance(5)
    s.sweeper.wake.clear()
    s.h.upsert(udp_slice([endpoint(EP1)]))
    assert s.sweeper.wake.is_set()
    result = s.step()
    assert result is not None and (result.reason, result.deleted) == ("endpoints", 1)
    assert s.fake.conntrack == set()
    # another endpoint for an already served Service: no sweep
    s.h.clock.advance(5)
    s.h.upsert(udp_slice([endpoint(EP1), endpoint(EP2)]))
    assert s.step() is None


def test_requests_coalesce_and_respect_the_minimum_interval() -> None:
    s = Sweep([udp_service()], [udp_slice([])])
    s.start()
    assert s.step() is not None  # start-up
    s.h.upsert(udp_slice([endpoint(EP1)]))
    s.h.upsert(udp_slice([]))
    s.h.upsert(udp_slice([endpoint(EP2)]))
    assert s.step() is None  # asked twice, within min_interval of the last sweep
    s.h.clock.advance(1)
    result = s.step()
    assert result is not None and result.reason == "endpoints"  # one sweep for both
    assert s.step() is None


def test_node_address_change_asks_for_a_sweep() -> None:
    s = Sweep(*SERVED)
    # the address poll alone (new NodePorts also ask)
    s.h.feed.unsubscribe(Subscriptions(service=s.sweeper.on_service))
    s.start()
    s.step()
    s.h.clock.advance(5)
    assert s.step() is None
    new_ip = "192.0.2.20"
    s.h.engine.set_node_ips([new_ip])
    s.h.engine.sync()
    stale = entry(new_ip, new_ip, dport=30053)  # sent before its NodePort existed
    s.fake.conntrack = {stale}
    result = s.step()
    assert result is not None and (result.reason, result.deleted) == ("node addresses", 1)


def test_conntrack_unavailable_is_one_line_and_a_metric(caplog) -> None:
    s = Sweep(*SERVED)
    s.start()
    s.fake.conntrack = None
    with caplog.at_level(logging.WARNING, "ipvsctl.conntrack"):
        assert s.step() is None
        s.h.clock.advance(60)
        assert s.step() is None  # retried at the periodic interval, no new line
    assert [r.getMessage() for r in caplog.records if r.name == "ipvsctl.conntrack"] == [
        "conntrack sweep failed; stale UDP entries are not removed"
    ]
    assert s.h.metrics.value("ipvsctl_netlink_errors_total", {"operation": "list_conntrack"}) == 2
    assert s.h.metrics.value("ipvsctl_conntrack_sweeps_total", {"result": "error"}) == 2
    s.fake.conntrack = {entry(CLUSTER_IP, CLUSTER_IP)}
    s.h.clock.advance(30)
    assert s.step() is None  # failures do not make it sweep more often
    s.h.clock.advance(30)
    assert s.step().deleted == 1


def test_the_thread_stops() -> None:
    s = Sweep(*SERVED)
    stop = threading.Event()
    t = threading.Thread(target=s.runner.run, args=(stop,))
    t.start()
    stop.set()
    s.sweeper.wake.set()
    t.join(timeout=30)
    assert not t.is_alive()


# --- a removed real server's entries -------------------------------------------------------
def test_a_removed_real_servers_entries_are_sent_to_its_virtual_server_and_answered_by_it() -> None:
    key, rs = ServiceKey(Protocol.UDP, CLUSTER_IP6, 53), RealServerKey("fd00::1", 5353)
    mine = entry(CLUSTER_IP6, "fd00::1", src="fd01::100")
    others = [
        entry(CLUSTER_IP6, "fd00::2", src="fd01::100"),  # another real server
        entry(CLUSTER_IP6, "fd00::1", src="fd01::100", reply_sport=5354),  # another port
        entry(CLUSTER_IP6, "fd00::1", src="fd01::100", proto=Protocol.TCP),
        entry(CLUSTER_IP6, "fd00::1", src="fd01::100", dport=54),  # another virtual server
        entry("fd96::11", "fd00::1", src="fd01::100"),
        entry(CLUSTER_IP6, CLUSTER_IP6, src="fd01::100"),  # answered by the VIP: stale
    ]
    assert real_server_entries([*others, mine], key, rs) == [mine]


def test_the_fake_kernels_flush_takes_the_real_servers_entries() -> None:
    kernel = FakeKernel()
    key, rs = ServiceKey(Protocol.UDP, CLUSTER_IP, 53), RealServerKey(EP1, 5353)
    mine, other = entry(CLUSTER_IP, EP1), entry(CLUSTER_IP, EP2)
    kernel.conntrack = {mine, other}
    kernel.flush_conntrack(key, rs)
    assert kernel.conntrack == {other} and kernel.take_ops() == [f"flush-conntrack {key} -> {rs}"]


def test_netlink_kernels_flush_deletes_the_real_servers_entries_through_the_table() -> None:
    from devkit.fakenetlink import model_sockets
    from ipvsctl.kernel.netlink import NetlinkKernel

    table = FakeKernel()
    key, rs = ServiceKey(Protocol.UDP, CLUSTER_IP, 53), RealServerKey(EP1, 5353)
    mine = [entry(CLUSTER_IP, EP1, sport=p) for p in (40000, 40001)]
    other = [entry(CLUSTER_IP, EP2), entry(CLUSTER_IP, EP1, dport=54)]
    table.conntrack = {*mine, *other}
    kernel = NetlinkKernel(create_interface=False, sockets=model_sockets(), conntrack=table)
    assert kernel.conntrack_entries(key, rs) == mine
    kernel.flush_conntrack(key, rs)
    assert table.conntrack == set(other)
    assert table.conntrack_dumps == [(Protocol.UDP, False)] * 2
    table.conntrack = None  # no conntrack: the flush's error, for its metric and log line
    with pytest.raises(KernelUnavailable) as err:
        kernel.flush_conntrack(key, rs)
    assert err.value.operation == "flush_conntrack" and str(rs) in str(err.value)


# --- netlink side ---------------------------------------------------------------------------
def _message(orig: NFCTAttrTuple, reply: NFCTAttrTuple) -> nfct_msg:
    m = nfct_msg.create_from(tuple_orig=orig, tuple_reply=reply)
    m.encode()
    decoded = nfct_msg(m.data)
    decoded.decode()
    return decoded


def test_entry_from_message_udp_v4_and_sctp_v6() -> None:
    v4 = _message(
        NFCTAttrTuple(saddr=CLIENT, daddr=CLUSTER_IP, proto=17, sport=40000, dport=53),
        NFCTAttrTuple(saddr=EP1, daddr=CLIENT, proto=17, sport=5353, dport=40000),
    )
    assert entry_from_message(v4) == entry(CLUSTER_IP, EP1)
    v6 = _message(
        NFCTAttrTuple(socket.AF_INET6, "fd01::100", "fd96::10", 132, 40000, 99),
        NFCTAttrTuple(socket.AF_INET6, "fd00::1", "fd01::100", 132, 9999, 40000),
    )
    assert entry_from_message(v6) == ConntrackEntry(
        Protocol.SCTP, "fd01::100", 40000, "fd96::10", 99, "fd00::1", 9999
    )
    icmp = _message(
        NFCTAttrTuple(saddr=CLIENT, daddr=CLUSTER_IP, proto=1),
        NFCTAttrTuple(saddr=CLUSTER_IP, daddr=CLIENT, proto=1),
    )
    assert entry_from_message(icmp) is None


class FakeSocket:
    def __init__(
        self,
        messages: list,
        dump_error: int | None = None,
        delete_errors: dict[int, int] | None = None,
    ) -> None:
        self.messages, self.dump_error = messages, dump_error
        self.delete_errors = delete_errors or {}
        self.dumps: list[object] = []
        self.deleted: list[int] = []
        self.closed = False

    def dump(self, tuple_orig=None):
        self.dumps.append(tuple_orig)
        if self.dump_error is not None:
            raise NetlinkError(self.dump_error)
        return iter(self.messages)

    def entry(self, cmd, tuple_orig):
        code = self.delete_errors.get(tuple_orig.sport)
        if code is not None:
            raise NetlinkError(code)
        self.deleted.append(tuple_orig.sport)

    def close(self) -> None:
        self.closed = True


def test_netlink_dump_is_filtered_by_protocol_in_the_kernel() -> None:
    udp = _message(
        NFCTAttrTuple(saddr=CLIENT, daddr=CLUSTER_IP, proto=17, sport=40000, dport=53),
        NFCTAttrTuple(saddr=EP1, daddr=CLIENT, proto=17, sport=5353, dport=40000),
    )
    sock = FakeSocket([udp])
    ct = NetlinkConntrack(socket_factory=lambda family: sock)
    assert ct.list_conntrack(Protocol.UDP, False) == [entry(CLUSTER_IP, EP1)]
    (f,) = sock.dumps
    assert (f.proto, f.saddr, f.daddr, f.dport) == (17, None, None, None) and sock.closed
    sock.dumps = []
    assert ct.list_conntrack(Protocol.UDP, False, port=53) == [entry(CLUSTER_IP, EP1)]
    (f,) = sock.dumps
    assert (f.proto, f.saddr, f.daddr, f.dport) == (17, None, None, 53)  # and by port


def test_a_kernel_without_the_filter_gets_a_whole_dump_filtered_here() -> None:
    def udp(dport: int) -> object:
        return _message(
            NFCTAttrTuple(saddr=CLIENT, daddr=CLUSTER_IP, proto=17, sport=40000, dport=dport),
            NFCTAttrTuple(saddr=EP1, daddr=CLIENT, proto=17, sport=5353, dport=40000),
        )

    tcp = _message(
        NFCTAttrTuple(saddr=CLIENT, daddr=CLUSTER_IP, proto=6, sport=40000, dport=53),
        NFCTAttrTuple(saddr=EP1, daddr=CLIENT, proto=6, sport=5353, dport=40000),
    )

    class OldKernel(FakeSocket):
        def dump(self, tuple_orig=None):
            if tuple_orig is not None:
                raise NetlinkError(errno.EINVAL)  # before 5.8: no CTA_FILTER
            return super().dump()

    sock = OldKernel([udp(53), udp(54), tcp])
    ct = NetlinkConntrack(socket_factory=lambda family: sock)
    assert ct.list_conntrack(Protocol.UDP, False, port=53) == [entry(CLUSTER_IP, EP1)]
    assert len(ct.list_conntrack(Protocol.UDP, False)) == 2


@pytest.mark.parametrize(
    ("code", "error"),
    [
        (errno.EPERM, KernelPermissionDenied),
        (errno.EOPNOTSUPP, KernelUnavailable),
        (errno.EPROTONOSUPPORT, KernelUnavailable),
        (errno.EBUSY, KernelTransient),
    ],
)
def test_netlink_errors_are_translated(code: int, error: type) -> None:
    def refuse(family: int):
        raise NetlinkError(code)

    with pytest.raises(error):
        NetlinkConntrack(socket_factory=refuse).list_conntrack(Protocol.UDP, False)


def test_netlink_delete_skips_entries_gone_meanwhile() -> None:
    sock = FakeSocket([], delete_errors={40001: errno.ENOENT})
    ct = NetlinkConntrack(socket_factory=lambda family: sock)
    n = ct.delete_conntrack([entry(CLUSTER_IP, CLUSTER_IP, sport=p) for p in (40000, 40001)])
    assert (n, sock.deleted) == (1, [40000])
    sock.delete_errors = {40000: errno.EPERM}
    with pytest.raises(KernelPermissionDenied):
        ct.delete_conntrack([entry(CLUSTER_IP, CLUSTER_IP)])


# --- the daemon ----------------------------------------------------------------------------
def test_the_daemon_sweeps_at_start_up_on_its_own_thread(tmp_path) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "dns.yaml").write_text(yaml.safe_dump_all([*SERVED[0], *SERVED[1]]))
    kernel = FakeKernel()
    stale, live = entry(CLUSTER_IP, CLUSTER_IP), entry(CLUSTER_IP, EP1, sport=40001)
    kernel.conntrack = {stale, live}
    opts = DaemonOptions(
        node=NodeContext("node-a", (NODE_IP,)),
        source=SourceOptions(manifests=str(folder)),
        drain=DrainOptions(state_dir=str(tmp_path / "state")),
        http=HTTPOptions(listen="127.0.0.1:0"),
    )
    d = Daemon(opts, kernel, ManifestSource(folder, interval=0.05), conntrack=kernel)
    d.start()
    try:
        deadline = time.monotonic() + 30
        while d.metrics.value("ipvsctl_conntrack_stale_entries_deleted_total") < 1:
            assert time.monotonic() < deadline, "no sweep"
            time.sleep(0.02)
        assert kernel.conntrack == {live}
        assert "conntrack" in [t.name for t in d.threads]
    finally:
        d.shutdown()
    assert all(not t.is_alive() for t in d.threads)

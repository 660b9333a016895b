"""NetlinkKernel against a real IPVS kernel, with real traffic from client to pods through
virtual IPs on kube-ipvs0. Counts are read back from the kernel, and `ipvsadm -Ln`,
`conntrack -L` and `ip addr` act as independent witnesses."""

from __future__ import annotations

import ctypes
import os
import socket
import threading
from collections.abc import Callable

import pytest

from devkit.labkit import Node, Pod, wait_for
from ipvsctl.kernel import (
    KernelError,
    KernelExists,
    KernelNotFound,
    KernelPermissionDenied,
    KernelUnavailable,
)
from ipvsctl.kernel.fake import FakeKernel
from ipvsctl.kernel.netlink import NetlinkKernel, configure_host, read_host_statuses, wire
from ipvsctl.kernel.netlink.codec import IPVSTimeouts
from ipvsctl.kernel.netns import run_in_netns
from ipvsctl.kernel.procfs.sysctl import wanted_sysctls
from ipvsctl.model import Protocol, RealServerKey, RealServerStatus, ServiceKey, VirtualServer

pytestmark = pytest.mark.lab

VIP = "10.96.0.10"
VIP6 = "fd96::10"


def status(kernel: NetlinkKernel, key: ServiceKey, rs: RealServerKey) -> RealServerStatus:
    return next(s for s in kernel.list_real_servers(key) if s.key == rs)


def backend(
    node: Node,
    key: ServiceKey,
    *pods: Pod,
    port: int = 8080,
    family: int = 4,
    scheduler: str = "rr",
    persistent: int = 0,
) -> VirtualServer:
    vs = VirtualServer(key, scheduler, persistent)
    node.kernel.add_virtual_server(vs, bind_address=True)
    for pod in pods:
        node.kernel.add_real_server(key, RealServerKey(pod.address(family), port), 1)
    return vs


# --- virtual servers ------------------------------------------------------------------------
def test_dummy_interface_is_created_and_constructor_errors(node: Node) -> None:
    assert "dummy" in node.run("ip", "-d", "link", "show", "kube-ipvs0")
    assert node.kernel.bound_addresses() == []
    with pytest.raises(KernelUnavailable, match="not found"):
        NetlinkKernel(netns="no-such-netns")
    # a restarted daemon finds the interface there and reuses it
    with NetlinkKernel(netns=node.name) as again:
        assert again.ensure_interface() == node.kernel.ensure_interface()


def test_virtual_server_add_set_delete_every_protocol_and_family(node: Node) -> None:
    k = node.kernel
    cases = [(proto, addr) for proto in Protocol for addr in (VIP, VIP6)]
    added = []
    for i, (proto, addr) in enumerate(cases):
        vs = VirtualServer(ServiceKey(proto, addr, 1000 + i), "sh", 300)
        k.add_virtual_server(vs, bind_address=True)
        added.append(vs)
        assert vs in k.list_virtual_servers(), vs
        seen = node.ipvsadm()[str(vs.key)]
        assert (seen.scheduler, seen.flags) == ("sh", "persistent 300"), vs
        with pytest.raises(KernelExists):
            k.add_virtual_server(vs, bind_address=True)

        plain = VirtualServer(vs.key, "rr", 0)
        k.update_virtual_server(plain)
        assert plain in k.list_virtual_servers(), plain
        seen = node.ipvsadm()[str(vs.key)]
        assert (seen.scheduler, seen.flags) == ("rr", ""), plain
        persistent = VirtualServer(vs.key, "wrr", 60)
        k.update_virtual_server(persistent)
        assert persistent in k.list_virtual_servers(), persistent
        assert node.ipvsadm()[str(vs.key)].flags == "persistent 60"

    assert sorted(k.list_virtual_servers(), key=lambda v: v.key) == sorted(
        (VirtualServer(v.key, "wrr", 60) for v in added), key=lambda v: v.key
    )  # in the kernel's order
    assert k.bound_addresses() == sorted([VIP, VIP6])

    for vs in added:
        k.delete_virtual_server(vs.key, bind_address=True)
        with pytest.raises(KernelNotFound):
            k.delete_virtual_server(vs.key, bind_address=True)
        with pytest.raises(KernelNotFound):
            k.update_virtual_server(vs)
        with pytest.raises(KernelNotFound):
            k.list_real_servers(vs.key)
    assert k.list_virtual_servers() == []
    assert node.ipvsadm() == {}
    assert k.bound_addresses() == []
    assert node.interface_addresses() == set()


def test_unknown_scheduler_is_not_found_and_leaves_no_address(node: Node) -> None:
    with pytest.raises(KernelNotFound, match="modprobe ip_vs_nope"):
        node.kernel.add_virtual_server(
            VirtualServer(ServiceKey(Protocol.TCP, VIP, 80), "nope"), bind_address=True
        )
    assert node.kernel.list_virtual_servers() == []
    assert node.interface_addresses() == set()


def test_vip_addresses_follow_the_virtual_servers_in_the_kernel(node: Node) -> None:
    tcp = VirtualServer(ServiceKey(Protocol.TCP, VIP, 80))
    udp = VirtualServer(ServiceKey(Protocol.UDP, VIP, 53))
    v6 = VirtualServer(ServiceKey(Protocol.TCP, VIP6, 80))
    unbound = VirtualServer(ServiceKey(Protocol.TCP, "10.96.0.11", 80))  # e.g. a NodePort
    for vs in (tcp, udp, v6):
        node.kernel.add_virtual_server(vs, bind_address=True)
    node.kernel.add_virtual_server(unbound, bind_address=False)
    assert node.kernel.bound_addresses() == sorted([VIP, VIP6])
    assert node.interface_addresses() == {VIP, VIP6}

    # a restarted daemon (a new NetlinkKernel) decides from the kernel, not from a counter
    with NetlinkKernel(netns=node.name) as k:
        k.delete_virtual_server(tcp.key, bind_address=True)
        assert node.interface_addresses() == {VIP, VIP6}  # the UDP one still uses VIP
        k.delete_virtual_server(udp.key, bind_address=True)
        assert node.interface_addresses() == {VIP6}
        k.delete_virtual_server(v6.key, bind_address=True)
        assert node.interface_addresses() == set()

        # an already-deleted virtual server still has its unused address removed
        k.bind_address("10.96.0.12")
        with pytest.raises(KernelNotFound):
            k.delete_virtual_server(ServiceKey(Protocol.TCP, "10.96.0.12", 80), True)
        assert node.interface_addresses() == set()

        # the interface deleted under the daemon is created again on the next bind
        node.run("ip", "link", "del", "kube-ipvs0")
        k.bind_address(VIP)
        assert node.interface_addresses() == {VIP}
        assert k.bound_addresses() == [VIP]


# --- real servers ---------------------------------------------------------------------------
def test_real_server_add_set_delete_and_errors(node: Node) -> None:
    k = node.kernel
    key = ServiceKey(Protocol.TCP, VIP, 80)
    k.add_virtual_server(VirtualServer(key), bind_address=True)
    rs1, rs2 = RealServerKey("10.244.1.1", 8080), RealServerKey("10.244.1.2", 8080)
    k.add_real_server(key, rs1, 1)
    k.add_real_server(key, rs2, 5)
    assert k.list_real_servers(key) == [RealServerStatus(rs1, 1), RealServerStatus(rs2, 5)]
    seen = node.ipvsadm()[str(key)].real_servers
    assert {str(rs): (s.forward, s.weight) for rs, s in seen.items()} == {
        str(rs1): ("Masq", 1),
        str(rs2): ("Masq", 5),
    }  # NAT, never pyroute2's default (Route)
    with pytest.raises(KernelExists):
        k.add_real_server(key, rs1, 1)

    k.set_real_server_weight(key, rs2, 0)
    assert status(k, key, rs2).weight == 0
    assert node.ipvsadm()[str(key)].real_servers[str(rs2)].weight == 0

    missing = RealServerKey("10.244.1.9", 8080)
    with pytest.raises(KernelNotFound):
        k.set_real_server_weight(key, missing, 1)
    with pytest.raises(KernelNotFound):
        k.delete_real_server(key, missing)
    with pytest.raises(KernelNotFound):
        k.add_real_server(ServiceKey(Protocol.TCP, VIP, 81), rs1, 1)

    k.delete_real_server(key, rs1)
    assert k.list_real_servers(key) == [RealServerStatus(rs2, 0)]
    assert list(node.ipvsadm()[str(key)].real_servers) == [str(rs2)]


def test_a_batch_of_real_server_adds_reports_each_ones_error(node: Node) -> None:
    """One send of many NEW_DEST messages, only the last asking for an ACK: the kernel
    answers each failed one, so an add that exists (EEXIST) or does not fit the virtual
    server (an IPv6 real server on an IPv4 one) fails alone; the others are in the table,
    NAT, as ipvsadm shows them."""
    k = node.kernel
    key = ServiceKey(Protocol.TCP, VIP, 80)
    k.add_virtual_server(VirtualServer(key), bind_address=True)
    rss = [RealServerKey(f"10.244.{2 + i // 250}.{i % 250 + 1}", 8080) for i in range(300)]
    k.add_real_server(key, rss[5], 3)
    mixed = [*rss[:150], RealServerKey("fd00:244::1", 8080), *rss[150:]]
    got = k.add_real_servers(key, mixed, 1)
    failed = {str(rs): type(e).__name__ for rs, e in zip(mixed, got, strict=True) if e}
    assert failed.keys() == {str(rss[5]), "[fd00:244::1]:8080"}
    assert failed[str(rss[5])] == "KernelExists"
    seen = node.ipvsadm()[str(key)].real_servers
    assert {str(rs): (s.forward, s.weight) for rs, s in seen.items()} == {
        str(rs): ("Masq", 3 if rs == rss[5] else 1) for rs in rss
    }
    missing = ServiceKey(Protocol.TCP, VIP, 81)
    assert all(isinstance(e, KernelNotFound) for e in k.add_real_servers(missing, rss[:3], 1))


def test_a_batch_whose_answers_overflow_the_socket_fails_alone_and_promptly(
    node: Node,
) -> None:
    """A receive buffer too small for a batch's answers: the kernel drops the rest and
    says ENOBUFS once, and while what it queued is unread, drops more without a word. The
    batch reports what it knows and each add it does not as failed; what was queued is
    read away, so the next batch's end is not dropped (it was: a 30 s wait, then a
    'Connection timed out' for adds the kernel had made)."""
    lost: list[int] = []
    k = NetlinkKernel(netns=node.name, create_interface=False, on_answers_lost=lost.append)
    try:
        key = ServiceKey(Protocol.TCP, VIP, 80)
        k.add_virtual_server(VirtualServer(key), bind_address=True)
        sock = k._sockets.ipvs().asyncore.socket
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)  # the kernel's least
        rss = [RealServerKey(f"10.244.1.{i}", 8080) for i in range(1, 121)]
        got = k.add_real_servers(ServiceKey(Protocol.TCP, VIP, 81), rss, 1)
        assert all(isinstance(e, KernelError) for e in got)
        assert lost and lost[0] > 0  # some answers came (ESRCH), the others are unknown
        assert all(isinstance(e, KernelNotFound) or "No buffer space" in str(e) for e in got)
        assert k.add_real_servers(key, rss, 1) == [None] * len(rss)
        assert len(lost) == 1
        assert len(node.ipvsadm()[str(key)].real_servers) == len(rss)
    finally:
        k.close()


def test_nat_traffic_and_weight_zero_drain(node: Node, client: Pod) -> None:
    a, b = node.make_pod("10.244.1.1"), node.make_pod("10.244.1.2")
    key = ServiceKey(Protocol.TCP, VIP, 80)
    backend(node, key, a, b)
    assert {client.request(VIP, 80) for _ in range(4)} == {a.name, b.name}

    held = client.connect(VIP, 80)
    drained, other = (a, b) if held.pod == a.name else (b, a)
    rs = RealServerKey(drained.ip, 8080)
    wait_for(lambda: status(node.kernel, key, rs).active_conns >= 1, what="ActiveConn")
    assert node.ipvsadm()[str(key)].real_servers[str(rs)].active >= 1

    node.kernel.set_real_server_weight(key, rs, 0)
    # new connections go elsewhere, the established one keeps working and keeps counting
    assert [client.request(VIP, 80) for _ in range(6)] == [other.name] * 6
    assert held.echo("still served")
    st = status(node.kernel, key, rs)
    assert st.weight == 0 and st.active_conns >= 1
    witness = node.ipvsadm()[str(key)].real_servers[str(rs)]
    assert witness.weight == 0 and witness.active >= 1

    # changes happen in place ("set"; pyroute2's "update" would delete): the scheduler
    # changes and the weight comes back without resetting the established connection
    node.kernel.update_virtual_server(VirtualServer(key, "wrr"))
    node.kernel.set_real_server_weight(key, rs, 1)
    assert held.echo("after set")
    st = status(node.kernel, key, rs)
    assert st.weight == 1 and st.active_conns >= 1
    assert node.ipvsadm()[str(key)].scheduler == "wrr"
    wait_for(lambda: client.request(VIP, 80) == drained.name, what="back in rotation")

    held.close()
    wait_for(lambda: status(node.kernel, key, rs).active_conns == 0, what="drained")
    # a closed connection lingers as InActConn (FIN_WAIT/TIME_WAIT, NOTES §3)


def test_deleted_real_server_gets_no_new_connections(node: Node, client: Pod) -> None:
    a, b = node.make_pod("10.244.1.1"), node.make_pod("10.244.1.2")
    key = ServiceKey(Protocol.TCP, VIP, 80)
    backend(node, key, a, b)
    node.kernel.delete_real_server(key, RealServerKey(a.ip, 8080))
    assert [client.request(VIP, 80) for _ in range(4)] == [b.name] * 4
    assert list(node.ipvsadm()[str(key)].real_servers) == [f"{b.ip}:8080"]


def test_ipv6_traffic(node: Node, client: Pod) -> None:
    a = node.make_pod("10.244.1.1", "fd00::1")
    b = node.make_pod("10.244.1.2", "fd00::2")
    key = ServiceKey(Protocol.TCP, VIP6, 80)
    backend(node, key, a, b, family=6)
    assert {client.request(VIP6, 80) for _ in range(4)} == {a.name, b.name}
    with client.connect(VIP6, 80) as held:
        pod = a if held.pod == a.name else b
        rs = RealServerKey(pod.ip6 or "", 8080)
        wait_for(lambda: status(node.kernel, key, rs).active_conns >= 1, what="ActiveConn")
        assert node.ipvsadm()[str(key)].real_servers[f"[{pod.ip6}]:8080"].active >= 1
        assert held.echo()


def test_persistence_keeps_a_client_and_quiescent_templates_expire(node: Node, client: Pod) -> None:
    a, b = node.make_pod("10.244.1.1"), node.make_pod("10.244.1.2")
    key = ServiceKey(Protocol.TCP, VIP, 80)
    backend(node, key, a, b, persistent=300)
    first = client.request(VIP, 80)
    assert [client.request(VIP, 80) for _ in range(5)] == [first] * 5
    # expire_quiescent_template=1 (configure_host): weight 0 ends the affinity for new
    # connections, instead of pinning clients to a draining pod (kubernetes#71809)
    pinned = a if first == a.name else b
    node.kernel.set_real_server_weight(key, RealServerKey(pinned.ip, 8080), 0)
    other = b if pinned is a else a
    wait_for(lambda: client.request(VIP, 80) == other.name, what="rescheduled")
    assert [client.request(VIP, 80) for _ in range(3)] == [other.name] * 3


def test_sctp_traffic(node: Node, client: Pod) -> None:
    try:
        a = node.make_pod("10.244.1.1", tcp=(), sctp=(9999,))
    except OSError as exc:
        pytest.skip(f"no SCTP sockets in this kernel: {exc}")
    key = ServiceKey(Protocol.SCTP, VIP, 99)
    backend(node, key, a, port=9999)
    assert client.request(VIP, 99, proto="sctp") == a.name


# --- conntrack ------------------------------------------------------------------------------
@pytest.mark.parametrize("family", [4, 6])
def test_udp_conntrack_flush(node: Node, client: Pod, family: int) -> None:
    a = node.make_pod("10.244.1.1", "fd00::1", tcp=(), udp=(5353,))
    b = node.make_pod("10.244.1.2", "fd00::2", tcp=(), udp=(5353,))
    vip = VIP6 if family == 6 else VIP
    key = ServiceKey(Protocol.UDP, vip, 53)
    backend(node, key, a, b, port=5353, family=family)
    sock = client.udp_socket(family)  # one source port: every datagram is one flow
    first = wait_for(lambda: client.udp(vip, 53, sock), what="UDP answer")
    gone, other = (a, b) if first == a.name else (b, a)
    rs = RealServerKey(gone.address(family), 5353)

    def entries() -> list[str]:
        out = node.conntrack("-f", "ipv6" if family == 6 else "ipv4", "-p", "udp")
        return [
            line
            for line in out.splitlines()
            if f"dst={vip} " in line and f"src={rs.address} " in line
        ]

    wait_for(entries, what="conntrack entry")
    assert node.kernel.conntrack_entries(key, rs)  # pyroute2 sees what conntrack -L sees

    node.kernel.delete_real_server(key, rs)
    node.kernel.flush_conntrack(key, rs)
    assert entries() == []
    assert node.kernel.conntrack_entries(key, rs) == []
    # the same flow now reaches the live pod (the first datagram may be dropped while the
    # IPVS entry to the deleted real server expires: expire_nodest_conn)
    wait_for(lambda: client.udp(vip, 53, sock) == other.name, what="moved to live pod")
    sock.close()


# --- host set-up ----------------------------------------------------------------------------
def test_configure_host_sysctls_and_timeouts(make_node: Callable[..., Node]) -> None:
    node = make_node(configure=False)
    assert node.netns.sysctl("net.ipv4.vs.expire_nodest_conn") == "0"
    assert node.kernel.get_timeouts() == IPVSTimeouts(tcp=900, tcpfin=120, udp=300)

    wanted = wanted_sysctls()
    before = {name: node.netns.sysctl(name) for name in wanted}
    changed = configure_host(tcp_timeout=600, tcpfin_timeout=30, udp_timeout=0, kernel=node.kernel)
    assert changed == {
        **{name: value for name, value in wanted.items() if before[name] != value},
        "ipvs.timeout.tcp": "600",
        "ipvs.timeout.tcpfin": "30",
    }
    assert "net.ipv4.vs.conntrack" in changed  # 0 in a fresh namespace
    for name, value in wanted.items():
        assert node.run("sysctl", "-n", name).strip() == value, name
    assert node.kernel.get_timeouts() == IPVSTimeouts(tcp=600, tcpfin=30, udp=300)
    assert "600 30 300" in node.run("ipvsadm", "-L", "--timeout")
    assert configure_host(tcp_timeout=600, tcpfin_timeout=30, kernel=node.kernel) == {}
    # per network namespace: the VM's own namespace is untouched
    with open("/proc/sys/net/ipv4/vs/expire_nodest_conn") as f:
        assert f.read().strip() == "0"


def test_permission_denied_without_cap_net_admin(node: Node) -> None:
    def without_capabilities() -> NetlinkKernel:
        # capabilities are per thread: empty this (short-lived) thread's effective set
        class Header(ctypes.Structure):
            _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

        class Data(ctypes.Structure):
            _fields_ = [
                ("effective", ctypes.c_uint32),
                ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32),
            ]

        libc = ctypes.CDLL(None, use_errno=True)
        header, data = Header(0x20080522, 0), (Data * 2)()  # _LINUX_CAPABILITY_VERSION_3
        assert libc.capget(ctypes.byref(header), data) == 0
        data[0].effective = data[1].effective = 0
        assert libc.capset(ctypes.byref(header), data) == 0, os.strerror(ctypes.get_errno())
        return NetlinkKernel(create_interface=False)

    with pytest.raises(KernelPermissionDenied, match="CAP_NET_ADMIN"):
        run_in_netns(node.name, without_capabilities)


# --- reading ---------------------------------------------------------------------------------
def test_other_threads_get_their_own_sockets(node: Node) -> None:
    vs = VirtualServer(ServiceKey(Protocol.UDP, VIP, 53))
    node.kernel.add_virtual_server(vs, bind_address=True)
    seen: list[object] = []
    t = threading.Thread(target=lambda: seen.append(node.kernel.list_virtual_servers()))
    t.start()
    t.join()
    assert seen == [[vs]]


def test_dump_matches_the_fake_kernel(node: Node) -> None:
    """Same calls, same dump: engine lab tests can compare FakeKernel and the real one."""
    fake = FakeKernel()
    tcp = VirtualServer(ServiceKey(Protocol.TCP, VIP, 80), "rr", 0)
    udp6 = VirtualServer(ServiceKey(Protocol.UDP, VIP6, 53), "sh", 120)
    for k in (fake, node.kernel):
        k.add_virtual_server(tcp, True)
        k.add_virtual_server(udp6, True)
        k.add_real_server(tcp.key, RealServerKey("10.244.1.2", 8080), 1)
        k.add_real_server(tcp.key, RealServerKey("10.244.1.1", 8080), 3)
        k.add_real_server(udp6.key, RealServerKey("fd00::1", 5353), 1)
        k.set_real_server_weight(tcp.key, RealServerKey("10.244.1.2", 8080), 0)
    assert node.kernel.dump() == fake.dump()
    table = read_host_statuses(netns=node.name)
    assert [t.vs for t in table] == [tcp, udp6]
    assert [len(t.real_servers) for t in table] == [2, 1]


def test_every_packed_message_kind_on_the_real_kernel(node: Node) -> None:
    """The hand-packed messages (kernel/netlink/wire.py; byte-equal to pyroute2's in the unit tests)
    do what they say on 6.1: every kind, both families, every protocol, persistence and
    scheduler flags, read back by dumps and by ipvsadm; errors come back translated."""
    k, fake = node.kernel, FakeKernel()
    both = []
    for i, (proto, addr) in enumerate((p, a) for p in Protocol for a in (VIP, VIP6)):
        family = 6 if ":" in addr else 4
        key = ServiceKey(proto, addr, 2000 + i)
        vs = VirtualServer(key, "sh", 60 if i % 2 else 0, 0x18 if i % 3 else 0)  # NEW_SERVICE
        rs1 = RealServerKey("10.244.9.1" if family == 4 else "fd00:244::9:1", 8080)
        rs2 = RealServerKey("10.244.9.2" if family == 4 else "fd00:244::9:2", 65535)
        for kernel in (k, fake):
            kernel.add_virtual_server(vs, bind_address=True)
            kernel.add_real_server(key, rs1, 1)  # NEW_DEST
            kernel.add_real_server(key, rs2, 5)
            kernel.set_real_server_weight(key, rs1, 0)  # SET_DEST
            kernel.delete_real_server(key, rs2)  # DEL_DEST
        changed = VirtualServer(key, "wrr", 0 if i % 2 else 30)
        for kernel in (k, fake):
            kernel.update_virtual_server(changed)  # SET_SERVICE
        both.append((changed, rs1))
        with pytest.raises(KernelExists):
            k.add_real_server(key, rs1, 1)
        with pytest.raises(KernelNotFound):
            k.delete_real_server(key, rs2)

    def by_key(found: list[VirtualServer]) -> list[VirtualServer]:
        return sorted(found, key=lambda v: v.key)  # each in its own order

    assert by_key(k.list_virtual_servers()) == by_key(fake.list_virtual_servers())
    assert k.dump() == fake.dump()  # dest dumps (or the table file) and the format
    seen = node.ipvsadm()
    for vs, rs in both:
        assert seen[str(vs.key)].scheduler == "wrr"
        assert k.list_real_servers(vs.key) == [RealServerStatus(rs, 0)]  # GET_DEST dump
        assert seen[str(vs.key)].real_servers[str(rs)].weight == 0
        assert seen[str(vs.key)].real_servers[str(rs)].forward == "Masq"
    missing = ServiceKey(Protocol.TCP, VIP, 1)
    with pytest.raises(KernelNotFound):
        k.list_real_servers(missing)  # empty dump, then GET_SERVICE: ESRCH
    with pytest.raises(KernelNotFound):
        k.update_virtual_server(VirtualServer(missing))
    for vs, _rs in both:
        k.delete_virtual_server(vs.key, bind_address=True)  # DEL_SERVICE
    assert k.list_virtual_servers() == [] and node.ipvsadm() == {}
    assert k.bound_addresses() == []


def test_batched_dest_dumps_read_the_draining_counts_ipvsadm_shows(node: Node, client: Pod) -> None:
    """The drain check's batched dumps (`dump_real_servers`, only the draining real servers
    parsed, found by address in the receive buffer) read the counts `ipvsadm -Ln` shows and
    the other two reads give, over 300 virtual servers with 5 real servers each, IPv4 and
    IPv6, real connections held on a few, a missing virtual server among them."""
    a, b = node.make_pod("10.244.1.1", "fd00::1"), node.make_pod("10.244.1.2", "fd00::2")
    served = ServiceKey(Protocol.TCP, VIP, 80)
    backend(node, served, a, b)
    held = [client.connect(VIP, 80) for _ in range(4)]  # rr: two on each pod
    served6 = ServiceKey(Protocol.TCP, VIP6, 80)
    backend(node, served6, a, family=6)
    held.append(client.connect(VIP6, 80))
    keys = [served, served6]
    for i in range(300):
        key = ServiceKey(Protocol.TCP if i % 2 else Protocol.UDP, f"10.97.{i // 200}.{i % 200}", 53)
        node.kernel.add_virtual_server(VirtualServer(key), bind_address=False)
        for j in range(5):
            node.kernel.add_real_server(key, RealServerKey(f"10.245.{j}.{i % 200}", 53), 1)
        keys.append(key)
    draining = {
        served: {RealServerKey(a.ip, 8080), RealServerKey(b.ip, 8080)},
        served6: {RealServerKey("fd00::1", 8080)},
        **{k: {RealServerKey(f"10.245.{n % 5}.{n % 200}", 53)} for n, k in enumerate(keys[2:])},
    }
    for key, servers in draining.items():
        for rs in servers:
            node.kernel.set_real_server_weight(key, rs, 0)
    gone = ServiceKey(Protocol.TCP, "10.97.9.9", 80)
    wait_for(
        lambda: sum(s.active_conns for s in node.kernel.list_real_servers(served)) >= 4,
        what="ActiveConn",
    )
    asked = [*keys, gone]
    batched = node.kernel.dump_real_servers(asked, draining)
    table = node.kernel.read_real_servers(asked, draining)
    one_each = {
        k: [s for s in node.kernel.list_real_servers(k) if s.key in draining[k]] for k in keys
    }
    witness = node.ipvsadm()

    def in_order(reading: dict) -> dict:  # the table file lists real servers in its own order
        return {k: v if v is None else sorted(v, key=lambda s: s.key) for k, v in reading.items()}

    assert batched == in_order(table) == {**one_each, gone: None}
    assert sum(s.active_conns for s in batched[served]) >= 4  # type: ignore[union-attr]
    assert batched[served6][0].active_conns >= 1  # type: ignore[index]
    for key in keys:
        got = batched[key]
        assert isinstance(got, list) and len(got) == len(draining[key])
        for s in got:
            seen = witness[str(key)].real_servers[str(s.key)]
            assert (s.weight, s.active_conns, s.inactive_conns) == (0, seen.active, seen.inactive)
            assert seen.weight == 0
    # the kernel's dest layout is learned and then read with one unpack (wire._dest_fixed)
    answer = node.kernel._calls._send(wire.dump_dests(served))
    wire.parse_dest(answer[0], served)
    order = list(wire._attrs(answer[0], 24))  # the attribute types, in the kernel's order
    assert len(answer) == 2
    assert all(wire._dest_fixed(m, served) is not None for m in answer), order
    for h in held:
        assert h.echo("still served")
        h.close()

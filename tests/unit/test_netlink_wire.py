"""The hand-packed IPVS messages (kernel/netlink/wire.py) are byte-for-byte what pyroute2 sends for
the same call: every message kind ipvsctl sends, over IPv4/IPv6, TCP/UDP/SCTP, persistence,
scheduler flags and names. pyroute2's own request path (IPVS.service/IPVS.dest building the
message from codec.py's specs, then NetlinkRequest's header and encode) is the oracle.
ipvsctl never sends fwmark services, so none are here."""

from __future__ import annotations

import itertools
import logging
import time
import types
from typing import Any

import pytest
from pyroute2.ipvs import AsyncIPVS

from devkit.fakenetlink import (
    IPVS_FAMILY,
    Answer,
    IPVSModel,
    ModelKernelSocket,
    dest_message,
    done,
    error,
    model_sockets,
)
from ipvsctl.kernel.netlink import wire
from ipvsctl.kernel.netlink.codec import dest_spec, service_key_spec, service_spec
from ipvsctl.kernel.netlink.ipvs_calls import IPVSCalls
from ipvsctl.kernel.netlink.raw import BATCH_ANSWER_WAIT
from ipvsctl.kernel.port import KernelExists, KernelNotFound
from ipvsctl.model import Protocol, RealServerKey, ServiceKey, VirtualServer

FAMILY, SEQ, PID = 0x1C, 0x01000007, 4242


def pyroute2_bytes(kind: str, command: str, **kw: Any) -> bytes:
    """What pyroute2's IPVS.<kind>(command, **kw) puts on the socket (seq/pid fixed)."""
    sent: list[bytes] = []

    async def do_request(msg: Any, msg_flags: int) -> list[Any]:
        # what NetlinkRequest does before sending (nlsocket.py)
        msg["header"]["type"] = FAMILY
        msg["header"]["flags"] = msg_flags
        msg["header"]["sequence_number"] = SEQ
        msg["header"]["pid"] = PID
        msg.reset()
        msg.encode()
        sent.append(bytes(msg.data))
        return []

    coro = getattr(AsyncIPVS, kind)(types.SimpleNamespace(_do_request=do_request), command, **kw)
    with pytest.raises(StopIteration):
        coro.send(None)
    (data,) = sent
    return data


def ours(request: wire.Request) -> bytes:
    return wire.message(FAMILY, request, SEQ, PID)


ADDRESSES = {4: ("10.96.0.10", "10.244.1.1"), 6: ("fd00:96::10", "fd00:244::1:1")}
KEYS = [
    ServiceKey(proto, ADDRESSES[fam][0], port)
    for fam, proto, port in itertools.product((4, 6), Protocol, (1, 80, 65535))
]
VIRTUAL_SERVERS = [
    VirtualServer(key, scheduler, timeout, flags)
    for key in KEYS
    for scheduler, timeout, flags in (
        ("rr", 0, 0),
        ("wrr", 10800, 0),
        ("sh", 0, 0x18),
        ("mh", 60, 0x38),
        ("lblcr", 1, 0x8),
        ("twos", 0, 0),
    )
]
DESTS = [
    (key, RealServerKey(ADDRESSES[key.family][1], port), weight)
    for key in KEYS
    for port, weight in ((8080, 1), (1, 0), (65535, 65535))
]


@pytest.mark.parametrize("vs", VIRTUAL_SERVERS, ids=str)
def test_service_add_and_set(vs: VirtualServer) -> None:
    assert ours(wire.new_service(vs)) == pyroute2_bytes("service", "add", service=service_spec(vs))
    assert ours(wire.set_service(vs)) == pyroute2_bytes("service", "set", service=service_spec(vs))


@pytest.mark.parametrize("key", KEYS, ids=str)
def test_service_del_get_and_the_dumps(key: ServiceKey) -> None:
    assert ours(wire.del_service(key)) == pyroute2_bytes(
        "service", "del", service=service_key_spec(key)
    )
    assert ours(wire.get_service(key)) == pyroute2_bytes(
        "service", "get", service=service_key_spec(key)
    )
    assert ours(wire.dump_dests(key)) == pyroute2_bytes(
        "dest", "dump", service=service_key_spec(key)
    )
    assert ours(wire.dump_services()) == pyroute2_bytes("service", "dump")


@pytest.mark.parametrize(("key", "rs", "weight"), DESTS, ids=str)
def test_dest_add_set_del(key: ServiceKey, rs: RealServerKey, weight: int) -> None:
    spec = service_key_spec(key)
    assert ours(wire.new_dest(key, rs, weight)) == pyroute2_bytes(
        "dest", "add", service=spec, dest=dest_spec(rs, weight)
    )
    assert ours(wire.set_dest(key, rs, weight)) == pyroute2_bytes(
        "dest", "set", service=spec, dest=dest_spec(rs, weight)
    )
    assert ours(wire.del_dest(key, rs)) == pyroute2_bytes(
        "dest", "del", service=spec, dest=dest_spec(rs)
    )


def test_the_oracle_sees_a_difference() -> None:
    # the comparison is of real bytes: a changed weight or scheduler shows
    key, rs, _ = DESTS[0]
    assert ours(wire.set_dest(key, rs, 2)) != pyroute2_bytes(
        "dest", "set", service=service_key_spec(key), dest=dest_spec(rs, 1)
    )
    vs = VIRTUAL_SERVERS[0]
    other = VirtualServer(vs.key, "wrr")
    assert ours(wire.new_service(other)) != pyroute2_bytes(
        "service", "add", service=service_spec(vs)
    )


def test_answers_are_split_and_errors_read() -> None:
    ack = wire._HEADER.pack(36, wire.NLMSG_ERROR, 0, SEQ, 0) + (0).to_bytes(4, "little") + bytes(16)
    err = (
        wire._HEADER.pack(36, wire.NLMSG_ERROR, 0, SEQ + 1, 0)
        + (-17).to_bytes(4, "little", signed=True)
        + bytes(16)
    )
    (a, b) = wire.split(ack + err)
    assert (a[0], a[2], wire.error_code(a[3])) == (wire.NLMSG_ERROR, SEQ, 0)
    assert (b[2], wire.error_code(b[3])) == (SEQ + 1, 17)
    assert wire.split(b"\0" * 15) == []


# --- the raw request path, against a modelled kernel ----------------------------------------
def calls_on(answer: Answer) -> tuple[IPVSCalls, ModelKernelSocket]:
    """IPVSCalls on a kernel that answers each request with `answer`, and its socket."""
    sockets = model_sockets(answer=answer)
    return IPVSCalls(sockets), sockets.ipvs().asyncore.socket


def test_writes_go_out_as_packed_and_acks_and_errors_come_back_translated() -> None:
    key, rs, _ = DESTS[0]
    codes = {wire.NEW_DEST: 0, wire.SET_DEST: 17, wire.DEL_DEST: 2}
    calls, model = calls_on(
        lambda req: [
            error(req.seq + 1, 0),  # a stray answer (another sequence number) is skipped
            error(req.seq, codes[req.cmd]),
        ]
    )
    calls.add_dest(key, rs, 1)
    with pytest.raises(KernelExists, match=r"set_real_server_weight .*File exists"):
        calls.set_dest(key, rs, 0)
    with pytest.raises(KernelNotFound):
        calls.delete_dest(key, rs)
    seqs = [wire.split(d)[0][2] for d in model.sent]
    assert [d[20:] for d in model.sent] == [
        ours(wire.new_dest(key, rs, 1))[20:],
        ours(wire.set_dest(key, rs, 0))[20:],
        ours(wire.del_dest(key, rs))[20:],
    ]  # pid aside (ours is 0), the packed bytes
    assert len(set(seqs)) == 3 and all(s > 0xFFFF for s in seqs)  # never pyroute2's


def test_a_dest_dump_is_read_to_its_end_and_decoded() -> None:
    key = KEYS[0]
    a, b = RealServerKey("10.244.1.1", 8080), RealServerKey("10.244.1.2", 8080)
    calls, model = calls_on(
        lambda req: [
            dest_message(b.address, b.port, 0, 3, 0, seq=req.seq)
            + dest_message(a.address, a.port, 1, 0, 0, seq=req.seq),
            done(req.seq),
        ]
    )
    got = calls.list_real_servers(key)
    assert [(r.key, r.weight, r.active_conns) for r in got] == [(a, 1, 0), (b, 0, 3)]
    assert model.sent[0][20:] == ours(wire.dump_dests(key))[20:]


def test_an_empty_dest_dump_asks_whether_the_service_exists() -> None:
    calls, model = calls_on(
        lambda req: [done(req.seq) if req.cmd == wire.GET_DEST else error(req.seq, 3)]
    )  # ESRCH
    with pytest.raises(KernelNotFound, match="list_real_servers"):
        calls.list_real_servers(KEYS[0])
    assert [d[16] for d in model.sent] == [wire.GET_DEST, wire.GET_SERVICE]


def test_the_model_kernel_keeps_the_table_the_calls_make() -> None:
    """The IPVS commands against devkit's model kernel, as the real one answers them."""
    model = IPVSModel()
    calls = IPVSCalls(model_sockets(model))
    vs, v6 = VIRTUAL_SERVERS[7], VIRTUAL_SERVERS[-1]
    calls.add_service(vs)
    calls.add_service(v6)
    with pytest.raises(KernelExists):
        calls.add_service(vs)
    with pytest.raises(KernelNotFound, match="modprobe ip_vs_nope"):
        calls.add_service(VirtualServer(KEYS[0], "nope"))
    rs = RealServerKey(ADDRESSES[4][1], 8080)
    calls.add_dest(vs.key, rs, 1)
    calls.set_dest(vs.key, rs, 0)
    # in the kernel's order (not sorted: the audit reads it in steps, kernel/table.py sorts)
    assert sorted(calls.list_virtual_servers(), key=lambda v: v.key) == sorted(
        [vs, v6], key=lambda v: v.key
    )
    assert [(r.key, r.weight) for r in calls.list_real_servers(vs.key)] == [(rs, 0)]
    assert calls.list_real_servers(v6.key) == []  # empty, and there: the get finds it
    calls.delete_dest(vs.key, rs)
    calls.delete_service(vs.key)
    with pytest.raises(KernelNotFound):
        calls.list_real_servers(vs.key)
    with pytest.raises(KernelNotFound):
        calls.delete_service(vs.key)
    assert list(model.table.services) == [v6.key]


def pyroute2_addr_bytes(command: str, index: int, address: str) -> tuple[int, bytes]:
    """(message type, bytes) of pyroute2's IPRoute.addr(command, ...) as ipvsctl called it,
    with our sequence number and pid put in the header for the comparison."""
    import struct

    from pyroute2 import IPRoute

    sent: list[bytes] = []

    class Capture:
        def handle(self, msg: Any) -> bytes:
            sent.append(bytes(msg.data))
            seq = msg["header"]["sequence_number"]
            return struct.pack("=IHHIIi", 36, 2, 0x100, seq, 0, 0) + bytes(16)

    ipr = IPRoute()
    try:
        ipr.asyncore.request_proxy = Capture()
        ipr.addr(command, index=index, address=address, prefixlen=128 if ":" in address else 32)
    finally:
        ipr.close()
    (data,) = sent
    length, kind, flags = struct.unpack_from("=IHH", data)
    return kind, struct.pack("=IHHII", length, kind, flags, SEQ, PID) + data[16:]


@pytest.mark.parametrize(
    "address",
    [
        "10.96.0.10",
        "0.0.0.1",
        "255.255.255.255",
        "fd00::10",
        "2001:db8::1:0:0:1",
        "::ffff:10.1.2.3",
    ],
)
@pytest.mark.parametrize("index", [1, 7, 2**31 + 5])
def test_address_add_and_del(address: str, index: int) -> None:
    for command, kind, request in (
        ("add", wire.RTM_NEWADDR, wire.new_addr(index, address)),
        ("del", wire.RTM_DELADDR, wire.del_addr(index, address)),
    ):
        assert pyroute2_addr_bytes(command, index, address) == (
            kind,
            wire.message(kind, request, SEQ, PID),
        )


def test_a_batch_of_dest_adds_is_one_send_and_each_failure_comes_back() -> None:
    """A virtual server's new real servers go in one send, only the last asking for an ACK;
    the kernel (the model, as the real one) answers a failed one whatever its flags, so
    each add's own error comes back, and the ones after a failure are still made."""
    model = IPVSModel()
    calls = IPVSCalls(model_sockets(model))
    vs = VIRTUAL_SERVERS[0]
    calls.add_service(vs)
    rss = [RealServerKey(f"10.244.1.{i}", 8080) for i in range(1, 6)]
    calls.add_dest(vs.key, rss[2], 1)  # already there: EEXIST in the batch
    sock = calls.sockets.ipvs().asyncore.socket
    sent = len(sock.sent)
    got = calls.add_dests(vs.key, rss, 1)
    assert [type(e).__name__ if e else None for e in got] == [
        None,
        None,
        "KernelExists",
        None,
        None,
    ]
    assert "10.244.1.3" in str(got[2]) and "add_real_server" in str(got[2])
    (datagram,) = sock.sent[sent:]  # one send
    messages = wire.split(datagram)
    assert [m[0] for m in messages] == [FAMILY] * 5
    assert [bool(m[1] & wire.NLM_F_ACK) for m in messages] == [False] * 4 + [True]
    assert [r.key for r in model.table.list_real_servers(vs.key)] == sorted(rss)
    # a missing virtual server: every add fails, each with its own error
    missing = VIRTUAL_SERVERS[6].key
    assert all(isinstance(e, KernelNotFound) for e in calls.add_dests(missing, rss, 1))


def test_a_batch_longer_than_one_send_is_split() -> None:
    from ipvsctl.kernel.netlink.ipvs_calls import BATCH_SIZE

    model = IPVSModel()
    calls = IPVSCalls(model_sockets(model))
    vs = VIRTUAL_SERVERS[0]
    calls.add_service(vs)
    n = BATCH_SIZE * 2 + 3
    rss = [RealServerKey(f"10.244.{i // 250}.{i % 250 + 1}", 8080) for i in range(n)]
    sock = calls.sockets.ipvs().asyncore.socket
    sent = len(sock.sent)
    assert calls.add_dests(vs.key, rss, 1) == [None] * n
    assert [len(wire.split(d)) for d in sock.sent[sent:]] == [BATCH_SIZE, BATCH_SIZE, 3]
    assert len(model.table.list_real_servers(vs.key)) == n


def test_a_real_server_that_cannot_be_packed_fails_alone_in_its_batch() -> None:
    model = IPVSModel()
    calls = IPVSCalls(model_sockets(model))
    vs = VIRTUAL_SERVERS[0]
    calls.add_service(vs)
    good = [RealServerKey("10.244.1.1", 8080), RealServerKey("10.244.1.2", 8080)]
    bad = RealServerKey("10.244.1.999", 8080)  # parsing never lets one through: still one
    got = calls.add_dests(vs.key, [good[0], bad, good[1]], 1)
    assert got[0] is None and got[2] is None
    assert "10.244.1.999" in str(got[1]) and "add_real_server" in str(got[1])
    assert [r.key for r in model.table.list_real_servers(vs.key)] == good


# --- a batch whose answers are lost ---------------------------------------------------------
def _rss(n: int, third: int = 1) -> list[RealServerKey]:
    return [RealServerKey(f"10.244.{third}.{i}", 8080) for i in range(1, n + 1)]


def test_a_batch_whose_answers_overflow_the_buffer_reports_the_unknown_adds_failed() -> None:
    """The kernel queues a batch's answers inside send(); a full receive buffer drops the
    rest and says ENOBUFS once. The answers that came are each add's own; the others are
    unknown, each reported failed (the Service is retried). What was queued is read to the
    end: left there, it took the next batch's end, and that batch waited 30 s for it."""
    model = IPVSModel()
    lost: list[int] = []
    calls = IPVSCalls(model_sockets(model), on_answers_lost=lost.append)
    vs = VIRTUAL_SERVERS[0]
    calls.add_service(vs)
    sock = calls.sockets.ipvs().asyncore.socket
    sock.rcvbuf = 36 * 10  # ten answers fit
    missing = VIRTUAL_SERVERS[6].key
    t0 = time.monotonic()
    got = calls.add_dests(missing, _rss(25), 1)
    assert [type(e).__name__ for e in got] == ["KernelNotFound"] * 10 + ["KernelTransient"] * 15
    assert all("No buffer space" in str(e) for e in got[10:]) and sock.dropped == 15
    assert lost == [15]
    assert calls.add_dests(vs.key, _rss(5, 2), 1) == [None] * 5  # its end was not dropped
    assert time.monotonic() - t0 < 5
    assert len(model.table.list_real_servers(vs.key)) == 5 and lost == [15]


def test_a_batch_whose_answers_never_come_is_bounded_and_fails_its_adds(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No answer at all (not even the end): the wait is BATCH_ANSWER_WAIT, not the 30 s a
    single request may wait, and under the loop's lock; every add is reported failed;
    one warning per streak."""
    model = IPVSModel()
    silent = {"on": True}

    def answer(req: Any) -> Any:
        answers = model(req)
        if silent["on"] and req.kind == IPVS_FAMILY and req.cmd == wire.NEW_DEST:
            return []  # made, but its answer lost
        return answers

    lost: list[int] = []
    calls = IPVSCalls(model_sockets(model, answer=answer), on_answers_lost=lost.append)
    vs = VIRTUAL_SERVERS[0]
    calls.add_service(vs)
    with caplog.at_level(logging.WARNING, logger="ipvsctl.kernel"):
        for _ in range(2):
            t0 = time.monotonic()
            got = calls.add_dests(vs.key, _rss(4), 1)
            assert BATCH_ANSWER_WAIT * 0.9 <= time.monotonic() - t0 < BATCH_ANSWER_WAIT + 2
            assert [type(e).__name__ for e in got] == ["KernelTransient"] * 4
            assert "timed out" in str(got[0]) and "10.244.1.1" in str(got[0])
    assert lost == [4, 4]
    lines = [r for r in caplog.records if "netlink answers lost" in r.getMessage()]
    assert len(lines) == 1  # once per streak, counted every time
    silent["on"] = False  # the retry: the adds that were made are found, the others made
    got = calls.add_dests(vs.key, _rss(5), 1)
    assert [type(e).__name__ if e else None for e in got] == ["KernelExists"] * 4 + [None]

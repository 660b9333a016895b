"""The drain check's batched dest dumps (`dump_real_servers`): one dump per virtual server
back to back on one socket, only the draining real servers parsed (their address compared
in the receive buffer, `wire.may_be_one_of`), errors per virtual server. Against devkit's
netlink model, which answers with the kernel's byte layout (ip_vs_genl_fill_dest, 6.1); the
lab compares the same path with `ipvsadm -Ln` on the real kernel."""

from __future__ import annotations

import errno
import struct
from collections.abc import Iterable

import pytest

from devkit.fakenetlink import (
    IPVSModel,
    Request,
    dest_message,
    done,
    error,
    inet,
    message,
    model_sockets,
    nla,
    stats,
    u16,
    u32,
)
from ipvsctl.kernel.netlink import NetlinkKernel, wire
from ipvsctl.kernel.port import KernelTransient
from ipvsctl.model import Protocol, RealServerKey, ServiceKey, VirtualServer

V4 = ServiceKey(Protocol.TCP, "10.96.0.10", 80)
V6 = ServiceKey(Protocol.UDP, "fd00::a", 53)
GONE = ServiceKey(Protocol.TCP, "10.96.9.9", 80)


def rs(address: str, port: int = 8080) -> RealServerKey:
    return RealServerKey(address, port)


def kernel_with(model: IPVSModel) -> NetlinkKernel:
    k = NetlinkKernel(create_interface=False, sockets=model_sockets(model))
    for key, dests in {
        V4: [rs(f"10.244.{i}.{j}", 8080 + j % 2) for i in range(3) for j in range(1, 5)],
        V6: [rs(f"fd01::{i:x}", 53) for i in range(1, 9)],
    }.items():
        k.add_virtual_server(VirtualServer(key), False)
        for n, d in enumerate(dests):
            k.add_real_server(key, d, n % 3)
    return k


# --- finding the wanted dests in an answer, against the kernel's layout ---------------------
def answer_of(*msgs: bytes) -> bytes:
    """A datagram of these messages, each 4-byte aligned, as the kernel packs a dump's."""
    return b"".join(m + b"\0" * (-len(m) & 3) for m in msgs)


@pytest.mark.parametrize(
    ("address", "others"),
    [
        ("10.244.1.5", ["10.244.1.6", "10.244.1.50", "fd01::1", "1.2.3.4", "5.1.244.10"]),
        ("fd01::5", ["fd01::6", "fd01::5:0", "10.244.1.5", "::"]),
        ("::ffff:a00:1", ["10.0.0.1", "::ffff:a00:2", "::a00:1"]),  # v4-mapped
    ],
)
@pytest.mark.parametrize("nested_flag", [False, True])
def test_a_dest_is_found_exactly_when_its_address_is_wanted(
    address: str, others: list[str], nested_flag: bool
) -> None:
    msgs = [
        dest_message(a, 8080, 0, 3, 4, nested_flag=nested_flag) for a in [*others, address, *others]
    ]
    data = answer_of(*msgs)
    want = msgs[len(others)]
    assert wire.find_dests([data], wire.packed_addresses([rs(address, 1)])) == [want]
    assert wire.parse_dest(want, V4).key.address == address
    assert wire.find_dests([data], frozenset()) == []
    for n, other in enumerate(others):
        found = wire.find_dests([data], wire.packed_addresses([rs(other)]))
        assert found == [msgs[n], msgs[len(others) + 1 + n]]


def test_a_dest_is_found_once_whatever_matches_it_in_order_over_datagrams() -> None:
    a, b = dest_message("10.244.1.5", 8080, 0, 1, 0), dest_message("10.244.1.5", 9090, 0, 2, 0)
    c = dest_message("10.244.1.6", 8080, 0, 1, 0)
    twice = wire.packed_addresses([rs("10.244.1.5", 8080), rs("10.244.1.5", 9090)])
    assert wire.find_dests([answer_of(c, a, c, b)], twice) == [a, b]
    assert wire.find_dests([answer_of(b, c), answer_of(c), answer_of(a)], twice) == [b, a]


def test_the_address_found_anywhere_in_a_message_keeps_it_for_the_parser() -> None:
    # another layout (the address last, another attribute order): still found, parse decides
    odd = message(
        wire.NEW_DEST,
        wire.ATTR_DEST,
        nla(2, struct.pack("!H", 80))
        + nla(11, u16(2))
        + nla(1, bytes([10, 244, 1, 5]) + bytes(12)),
        False,
        7,
    )
    other = dest_message("10.244.1.6", 80, 0, 1, 0)
    wanted = wire.packed_addresses([rs("10.244.1.5", 80)])
    assert wire.find_dests([answer_of(other, odd, other)], wanted) == [odd]
    assert wire.parse_dest(odd, V4).key == rs("10.244.1.5", 80)


# --- the dest layout, learned once and read with one unpack ---------------------------------
def kernel_dest(
    address: str, port: int, weight: int, active: int, inactive: int, order: str
) -> bytes:
    """A dest message in one of the layouts kernels have written: "5.2+" as devkit's model
    (the family second), "family-last" (after the counts), "pre-5.2" (no tunnel
    attributes, no family)."""
    af, raw = inet(address)
    head = [nla(1, raw)]
    family = [nla(11, u16(af))]
    tail = [
        nla(2, struct.pack("!H", port)),
        nla(3, u32(0)),
        nla(4, u32(weight)),
        *([] if order == "pre-5.2" else [nla(13, b"\0"), nla(14, u16(0)), nla(15, u16(0))]),
        nla(5, u32(0)),
        nla(6, u32(0)),
        nla(7, u32(active)),
        nla(8, u32(inactive)),
        nla(9, u32(0)),
    ]
    stats_ = [nla(10 | 0x8000, stats("=I")), nla(12 | 0x8000, stats("=Q"))]
    attrs = {
        "5.2+": head + family + tail + stats_,
        "family-last": head + tail + family + stats_,
        "pre-5.2": head + tail + stats_,
    }[order]
    return message(wire.NEW_DEST, wire.ATTR_DEST, b"".join(attrs), False, 7)


@pytest.mark.parametrize("order", ["5.2+", "family-last", "pre-5.2"])
def test_every_dest_layout_is_learned_and_then_read_with_one_unpack(
    order: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(wire, "_dest_layouts", [])
    cases = [
        ("10.244.1.5", 8080, 1, 0, 0),
        ("10.0.0.1", 1, 0, 4294967295, 7),
        ("fd00::5", 65535, 100, 3, 4294967295),
    ]
    for address, port, weight, active, inactive in cases:
        msg = kernel_dest(address, port, weight, active, inactive, order)
        key = V6 if ":" in address else V4  # pre-5.2 has no family: the service's
        want = (rs(address, port), weight, active, inactive)
        got = wire.parse_dest(msg, key)  # the first of a layout: walked, learned
        assert (got.key, got.weight, got.active_conns, got.inactive_conns) == want
        fixed = wire._dest_fixed(msg, key)
        assert fixed is not None and fixed == got
    assert len(wire._dest_layouts) == 1  # IPv4 and IPv6 dests share it


def test_a_dest_unlike_every_learned_layout_is_walked_not_misread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(wire, "_dest_layouts", [])
    wire.parse_dest(kernel_dest("10.244.1.5", 80, 1, 2, 3, "5.2+"), V4)
    other = kernel_dest("10.244.1.6", 81, 4, 5, 6, "family-last")  # same length, other order
    assert wire._dest_fixed(other, V4) is None  # not read by the learned layout
    got = wire.parse_dest(other, V4)
    assert (got.key, got.weight, got.active_conns, got.inactive_conns) == (
        rs("10.244.1.6", 81),
        4,
        5,
        6,
    )
    assert len(wire._dest_layouts) == 2


# --- the batch through NetlinkKernel --------------------------------------------------------
def test_batched_dumps_read_what_one_dump_each_reads() -> None:
    model = IPVSModel()
    k = kernel_with(model)
    keys = [V4, GONE, V6]
    every = {V4: k.list_real_servers(V4), GONE: None, V6: k.list_real_servers(V6)}
    assert k.dump_real_servers(keys) == every
    only = {
        V4: {
            rs("10.244.1.2", 8080),
            rs("10.244.2.3", 8081),
            rs("10.244.0.1", 9),
        },  # 9: no such port
        V6: {rs("fd01::8", 53), rs("fd01::99", 53)},  # ::99: not in the kernel
    }
    assert k.dump_real_servers(keys, only) == {
        V4: [s for s in every[V4] if s.key in only[V4]],  # sorted, as list_real_servers
        GONE: None,
        V6: [s for s in every[V6] if s.key == rs("fd01::8", 53)],
    }
    assert [s.key for s in k.dump_real_servers([V4], only)[V4]] == [
        rs("10.244.1.2", 8080),
        rs("10.244.2.3", 8081),
    ]
    # a virtual server with no draining real server of its own: [], not None
    assert k.dump_real_servers([V4], {}) == {V4: []}


def test_a_virtual_server_without_real_servers_is_empty_not_gone() -> None:
    model = IPVSModel()
    k = kernel_with(model)
    bare = ServiceKey(Protocol.TCP, "10.96.0.11", 80)
    k.add_virtual_server(VirtualServer(bare), False)
    assert k.dump_real_servers([bare, GONE], {bare: {rs("10.244.0.1")}}) == {bare: [], GONE: None}


def scripted(model: IPVSModel, per_key: dict[ServiceKey, object]) -> NetlinkKernel:
    """A kernel whose dest dumps answer as scripted per virtual server: an errno, or
    (messages, how many a datagram: the last datagram with data may hold NLMSG_DONE too,
    which no kernel sends but is still read as the end)."""

    def answer(req: Request) -> Iterable[bytes]:
        if req.kind == 0x1C and req.cmd == wire.GET_DEST:
            key = wire._parsed_key(wire._nested(req.data, wire.ATTR_SERVICE))
            script = per_key.get(key)  # type: ignore[arg-type]
            if isinstance(script, int):
                return [error(req.seq, script)]
            if script is not None:
                msgs, per = script  # type: ignore[misc]
                # an earlier request's answer, left unread, in a datagram of its own
                stray = answer_of(dest_message("10.244.0.1", 8080, 0, 9, 9, seq=req.seq - 1))
                answers = [*(m(req.seq) for m in msgs), done(req.seq)]
                return [stray] + [
                    answer_of(*answers[i : i + per]) for i in range(0, len(answers), per)
                ]
        return model(req)

    k = NetlinkKernel(create_interface=False, sockets=model_sockets(model, answer))
    return k


@pytest.mark.parametrize("per", [1, 2, 5, 100])
def test_several_dests_a_datagram_other_sequence_numbers_and_errors(per: int) -> None:
    model = IPVSModel()
    kernel_with(model)

    def d(address: str, active: int) -> object:
        return lambda seq: dest_message(address, 8080, 0, active, 1, seq=seq)

    k = scripted(
        model,
        {
            V4: ([d(f"10.244.0.{i}", i) for i in range(1, 8)], per),
            V6: errno.EINVAL,
            GONE: errno.ESRCH,
        },
    )
    keys = [V4, V6, GONE, ServiceKey(Protocol.TCP, "10.96.0.77", 80)]
    got = k.dump_real_servers(keys, {V4: {rs("10.244.0.1"), rs("10.244.0.6")}})
    assert [(s.key.address, s.active_conns) for s in got[V4]] == [  # type: ignore[union-attr]
        ("10.244.0.1", 1),
        ("10.244.0.6", 6),
    ]
    assert isinstance(got[V6], KernelTransient) and "Invalid argument" in str(got[V6])
    assert got[V6].operation == "list_real_servers"  # type: ignore[union-attr]
    assert got[GONE] is None  # a missing service is gone, not an error
    assert got[keys[3]] is None  # the model's empty dump, then ESRCH on the get


def test_a_malformed_wanted_dest_fails_its_virtual_server_only() -> None:
    model = IPVSModel()
    kernel_with(model)
    broken = lambda seq: message(  # noqa: E731
        wire.NEW_DEST, wire.ATTR_DEST, nla(1, bytes(16)) + nla(11, u16(2)), False, seq
    )
    k = scripted(model, {V4: ([broken], 10)})
    got = k.dump_real_servers([V4, V6], {V4: {rs("0.0.0.0")}, V6: {rs("fd01::1", 53)}})
    assert isinstance(got[V4], KernelTransient)
    assert [s.key for s in got[V6]] == [rs("fd01::1", 53)]  # type: ignore[union-attr]


def test_the_sequence_numbers_of_a_batch_are_all_distinct() -> None:
    model = IPVSModel()
    k = kernel_with(model)
    k.dump_real_servers([V4, V6, GONE] * 3)
    seqs = [
        struct.unpack_from("=I", m, 8)[0]
        for m in k._calls._ipvs().asyncore.socket.sent  # the model socket keeps what it got
        if struct.unpack_from("=H", m, 6)[0] & wire.NLM_F_DUMP == wire.NLM_F_DUMP
    ]
    assert len(seqs) == 9 and len(set(seqs)) == 9


def test_a_broken_socket_is_one_kernel_error() -> None:
    model = IPVSModel()
    k = kernel_with(model)
    k._calls._ipvs().asyncore.socket.ours.close()
    with pytest.raises(KernelTransient) as exc:
        k.dump_real_servers([V4])
    assert exc.value.operation == "list_real_servers"

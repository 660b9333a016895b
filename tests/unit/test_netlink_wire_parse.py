"""The dump answers parsed by hand (kernel/netlink/wire.py) read what pyroute2's decoding of
the same bytes gives codec.py's readers, over every shape the kernel sends: IPv4/IPv6, TCP/UDP/SCTP,
fwmark services, persistence, scheduler flags and names, statistics, counts at their limits.
The messages are built as the kernel's ip_vs_genl_fill_service / ip_vs_genl_fill_dest
write them (net/netfilter/ipvs/ip_vs_ctl.c, 6.1), by devkit's netlink model, which answers
with them; the lab runs the same parsers on 6.1."""

from __future__ import annotations

import itertools
import struct

import pytest
from pyroute2.netlink.generic.ipvs import ipvsmsg

from devkit.fakenetlink import (
    dest_message,
    inet,
    message,
    nla,
    service_message,
    stats,
    u16,
    u32,
)
from ipvsctl.kernel.netlink import wire
from ipvsctl.kernel.netlink.codec import (
    real_server_from_message,
    service_stats_from_message,
    virtual_server_from_message,
)
from ipvsctl.kernel.netlink.errors import errors
from ipvsctl.kernel.port import KernelTransient
from ipvsctl.model import Protocol, ServiceKey, ServiceStats


def pyroute2_decoded(data: bytes) -> ipvsmsg:
    m = ipvsmsg(data)
    m.decode()
    return m


SERVICES = [
    dict(
        address=address,
        port=port,
        proto=proto,
        sched=sched,
        flags=flags,
        timeout=timeout,
        nested_flag=nested,
    )
    for (address, port), proto, (sched, flags, timeout), nested in itertools.product(
        [
            ("10.96.0.10", 80),
            ("0.0.0.1", 1),
            ("255.255.255.255", 65535),
            ("fd00::a", 443),
            ("2001:db8::1:0:0:1", 8080),
            ("::ffff:10.1.2.3", 53),
            ("fe80::1", 0),
        ],
        ["TCP", "UDP", "SCTP"],
        [
            ("rr", 0, 0),
            ("wlc", 0, 0),
            ("mh", 0x10, 0),
            ("sh", 0x18, 0),
            ("rr", 0x1, 10800),
            ("lc", 0x1 | 0x8, 1),
            ("", 0, 0),
        ],
        [False, True],
    )
]


@pytest.mark.parametrize("case", SERVICES, ids=lambda c: "-".join(map(str, c.values())))
def test_a_service_parses_as_pyroute2_decodes_it(case):
    data = service_message(**case)
    assert wire.parse_service(data) == virtual_server_from_message(pyroute2_decoded(data))
    assert wire.parse_service(data) is not None


@pytest.mark.parametrize(
    "case",
    [
        dict(address=None, port=0, proto="TCP", sched="rr", flags=0, timeout=0, fwmark=7),
        dict(address="10.0.0.1", port=80, proto=47, sched="rr", flags=0, timeout=0),  # GRE
        dict(address="10.0.0.1", port=80, proto="TCP", sched="rr", flags=0, timeout=0, pe="sip"),
    ],
)
def test_what_ipvsctl_never_programs_parses_as_pyroute2_decodes_it(case):
    data = service_message(**case)
    expected = virtual_server_from_message(pyroute2_decoded(data))
    assert wire.parse_service(data) == expected
    assert (expected is None) == (case.get("pe") is None)


@pytest.mark.parametrize(
    "address, port, weight, active, inactive, nested",
    [
        (address, port, weight, active, inactive, nested)
        for address, (port, weight, (active, inactive)), nested in itertools.product(
            [
                "10.244.1.5",
                "0.0.0.0",
                "255.255.255.254",
                "fd00::5",
                "2001:db8:0:0:1::1",
                "::ffff:10.1.2.3",
            ],
            [(8080, 1, (0, 0)), (1, 0, (1, 0)), (65535, 2**31, (2**32 - 1, 2**32 - 1))],
            [False, True],
        )
    ],
)
def test_a_real_server_parses_as_pyroute2_decodes_it(
    address, port, weight, active, inactive, nested
):
    data = dest_message(address, port, weight, active, inactive, nested)
    key = ServiceKey(Protocol.TCP, "fd00::1" if ":" in address else "10.96.0.1", 80)
    assert wire.parse_dest(data, key) == real_server_from_message(pyroute2_decoded(data))


def test_a_real_server_without_its_family_takes_the_virtual_servers():
    _, raw = inet("10.244.1.5")
    a = nla(1, raw) + nla(2, struct.pack("!H", 8080)) + nla(4, u32(1)) + nla(7, u32(2))
    rs = wire.parse_dest(message(5, 2, a, False), ServiceKey(Protocol.TCP, "10.96.0.1", 80))
    assert (str(rs.key), rs.weight, rs.active_conns, rs.inactive_conns) == (
        "10.244.1.5:8080",
        1,
        2,
        0,
    )


@pytest.mark.parametrize(
    "data",
    [
        message(5, 2, b"", False),  # no attributes
        message(5, 2, nla(1, b"\x0a\x00"), False),  # a short address, no port
        message(5, 2, nla(1, inet("10.0.0.1")[1]) + nla(11, u16(99)) + nla(2, b"\0\x50"), False),
        message(5, 2, nla(1, inet("10.0.0.1")[1])[:10], False),  # truncated attribute
        b"\0" * 20,
    ],
)
def test_a_malformed_real_server_is_a_transient_kernel_error(data):
    with pytest.raises(KernelTransient, match="list_real_servers"), errors("list_real_servers"):
        wire.parse_dest(data, ServiceKey(Protocol.TCP, "10.96.0.1", 80))


@pytest.mark.parametrize(
    "data",
    [
        message(1, 1, b"", False),
        message(1, 1, nla(1, u16(2)) + nla(2, u16(6)) + nla(3, b"\x0a"), False),  # short address
        message(1, 1, nla(1, u16(2)) + nla(2, u16(6)) + nla(3, inet("10.0.0.1")[1]), False),
        b"\0" * 20,
    ],
)
def test_a_service_the_parser_cannot_read_is_skipped(data):
    assert wire.parse_service(data) is None


# --- per-Service traffic counters (IPVS_SVC_ATTR_STATS64, STATS) ------------------------------
COUNTERS = [
    ServiceStats(0, 0, 0, 0, 0),
    ServiceStats(1, 2, 3, 4, 5),
    # past 32 bits: STATS64 carries them whole (STATS truncates counts, the bytes are u64)
    ServiceStats(2**32 + 7, 2**33, 2**40, 2**63 + 1, 2**64 - 1),
]


@pytest.mark.parametrize("counters", COUNTERS, ids=str)
@pytest.mark.parametrize("address", ["10.96.0.10", "fd00::a"])
def test_service_counters_parse_as_pyroute2_decodes_them(counters, address):
    data = service_message(address, 80, "TCP", "rr", 0, 0, counters=counters)
    key, parsed = wire.parse_service_stats(data)
    assert key == ServiceKey(Protocol.TCP, address, 80)
    assert parsed == counters == service_stats_from_message(pyroute2_decoded(data))


def _service_with(stats_attrs: bytes) -> bytes:
    af, raw = inet("10.0.0.1")
    a = nla(1, u16(af)) + nla(2, u16(6)) + nla(3, raw) + nla(4, struct.pack("!H", 80))
    return message(wire.NEW_SERVICE, wire.ATTR_SERVICE, a + stats_attrs)


def test_service_counters_of_a_kernel_without_stats64_are_read_from_stats():
    """Kernels before 4.1 send IPVS_SVC_ATTR_STATS only: u32 counts, u64 bytes."""
    counters = ServiceStats(10, 20, 30, 2**40, 50)
    data = _service_with(nla(10 | 0x8000, stats("=I", counters)))
    assert wire.parse_service_stats(data)[1] == counters
    assert service_stats_from_message(pyroute2_decoded(data)) == counters


def test_service_counters_skip_the_alignment_pad_attribute():
    """nla_put_u64_64bit puts IPVS_STATS_ATTR_PAD (11) before a u64 on architectures that
    need 8-byte alignment: it is no counter."""
    counters = ServiceStats(1, 2, 3, 4, 5)
    body = b"".join(
        nla(11, b"") + nla(i, struct.pack("=Q", v)) for i, v in enumerate((1, 2, 3, 4, 5), 1)
    )
    assert wire.parse_service_stats(_service_with(nla(12 | 0x8000, body)))[1] == counters


def test_a_service_without_counters_reads_as_zero_and_fwmark_services_are_skipped():
    assert wire.parse_service_stats(_service_with(b""))[1] == ServiceStats()
    fwmark = service_message(None, 0, "TCP", "rr", 0, 0, fwmark=7)
    assert wire.parse_service_stats(fwmark) is None


def test_service_counters_in_another_layout_take_the_generic_walk():
    """The fast path reads the kernel's usual layout only: an attribute after STATS64, or
    the identity in another order, is still read right."""
    counters = ServiceStats(1, 2, 3, 4, 5)
    data = service_message("10.0.0.1", 80, "TCP", "rr", 0, 0, counters=counters)
    extra = nla(13, u32(9))  # a future attribute after STATS64
    grown = bytearray(data + extra)
    struct.pack_into("=I", grown, 0, len(grown))
    struct.pack_into("=H", grown, 20, len(grown) - 20)
    assert wire._service_stats_fast(bytes(grown)) is None
    assert wire.parse_service_stats(bytes(grown)) == (
        ServiceKey(Protocol.TCP, "10.0.0.1", 80),
        counters,
    )
    assert wire._service_stats_fast(data) == wire.parse_service_stats(data)
    af, raw = inet("10.0.0.1")
    reordered = nla(2, u16(6)) + nla(1, u16(af)) + nla(3, raw) + nla(4, struct.pack("!H", 80))
    msg = message(wire.NEW_SERVICE, wire.ATTR_SERVICE, reordered + nla(12, stats("=Q", counters)))
    assert wire._service_stats_fast(msg) is None
    assert wire.parse_service_stats(msg)[1] == counters

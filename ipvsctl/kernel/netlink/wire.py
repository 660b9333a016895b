"""The IPVS messages ipvsctl sends, packed by hand, and the dump answers it reads, parsed by
hand (pure: bytes in, bytes out).

pyroute2 spends ~0.3 ms of Python building each of these small fixed messages through its
generic request filters (docs/benchmarks.md, "The netlink hot path"); `struct` does it in
microseconds. The output is kept byte-for-byte equal to what pyroute2 sends for the same
call (`IPVS.service`/`IPVS.dest` with codec.py's specs), attribute order and the defaults it
adds included, by tests/unit/test_netlink_wire.py over every message kind. The same goes for
the answers: pyroute2's generic attribute decoding was most of a dump's cost (the drift
audit, restarts), and `parse_service`/`parse_dest` give what codec.py's readers give from
pyroute2's decoding of the same bytes (tests/unit/test_netlink_wire_parse.py). So are the VIP
interface's address add and delete (RTM_NEWADDR/RTM_DELADDR). pyroute2 still owns the
sockets, the family id, links, address dumps and conntrack.

Layouts: include/uapi/linux/netlink.h, genetlink.h and ip_vs.h.
"""

from __future__ import annotations

import functools
import ipaddress
import operator
import socket
import struct
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any

from ipvsctl.kernel.netlink.codec import FWD_MASQ, SVC_F_PERSISTENT
from ipvsctl.model import (
    Protocol,
    RealServerKey,
    RealServerStatus,
    ServiceKey,
    ServiceStats,
    VirtualServer,
)
from ipvsctl.model.ipvs import SCHED_FLAGS_MASK

# netlink header flags, as pyroute2's NetlinkRequest sets them per request kind
NLM_F_REQUEST, NLM_F_ACK = 0x1, 0x4
NLM_F_REPLACE, NLM_F_EXCL, NLM_F_CREATE, NLM_F_DUMP = 0x100, 0x200, 0x400, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
FLAGS_CREATE = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL  # "add"
FLAGS_CHANGE = NLM_F_REQUEST | NLM_F_ACK | NLM_F_REPLACE  # "set"
FLAGS_REQ = NLM_F_REQUEST | NLM_F_ACK  # "del", "get"
FLAGS_DUMP = NLM_F_REQUEST | NLM_F_DUMP

GENL_VERSION = 1
NEW_SERVICE, SET_SERVICE, DEL_SERVICE, GET_SERVICE = 1, 2, 3, 4
NEW_DEST, SET_DEST, DEL_DEST, GET_DEST = 5, 6, 7, 8
ATTR_SERVICE, ATTR_DEST = 1, 2
SVC_AF, SVC_PROTOCOL, SVC_ADDR, SVC_PORT = 1, 2, 3, 4
SVC_SCHED_NAME, SVC_FLAGS, SVC_TIMEOUT, SVC_NETMASK = 6, 7, 8, 9
SVC_STATS, SVC_STATS64 = 10, 12  # nested IPVS_STATS_ATTR_*
STATS_CONNS, STATS_INPKTS, STATS_OUTPKTS, STATS_INBYTES, STATS_OUTBYTES = 1, 2, 3, 4, 5
DEST_ADDR, DEST_PORT, DEST_FWD_METHOD, DEST_WEIGHT = 1, 2, 3, 4
DEST_U_THRESH, DEST_L_THRESH, DEST_ADDR_FAMILY = 5, 6, 11
DEST_ACTIVE_CONNS, DEST_INACT_CONNS = 7, 8
DEST_TUN_TYPE, DEST_TUN_PORT, DEST_TUN_FLAGS = 13, 14, 15

_HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, seq, pid
_ERROR = struct.Struct("=i")
HEADER, ERROR_CODE = _HEADER, _ERROR  # for raw.py's in-place reads of answers
_U16 = struct.Struct("=H")
_BE16 = struct.Struct("!H")
_U32 = struct.Struct("=I")
_U64 = struct.Struct("=Q")
_FLAGS = struct.Struct("=II")


def _nla(kind: int, payload: bytes) -> bytes:
    n = 4 + len(payload)
    return _U16.pack(n) + _U16.pack(kind) + payload + b"\0" * (-n & 3)


def _genl(cmd: int, attrs: bytes = b"") -> bytes:
    return bytes((cmd, GENL_VERSION, 0, 0)) + attrs


# Constant attributes, packed once.
_NETMASK_V4 = _nla(SVC_NETMASK, _U32.pack(0xFFFFFFFF))
_NETMASK_V6 = _nla(SVC_NETMASK, _U32.pack(128))  # a prefix length for IPv6 (codec.py)
# pyroute2's IPVSService defaults, which it sends in del/get too (the kernel reads only the
# identity there)
_KEY_DEFAULTS = (
    _nla(SVC_TIMEOUT, _U32.pack(0))
    + _nla(SVC_SCHED_NAME, b"wlc\0")
    + _nla(SVC_FLAGS, _FLAGS.pack(0, 0xFFFF))
)
# pyroute2's IPVSDest defaults ahead of the fields we set: tunnel type/port/flags, thresholds
_DEST_DEFAULTS = (
    _nla(DEST_TUN_TYPE, b"\0")
    + _nla(DEST_TUN_PORT, _U16.pack(0))
    + _nla(DEST_TUN_FLAGS, _U16.pack(0))
    + _nla(DEST_U_THRESH, _U32.pack(0))
    + _nla(DEST_L_THRESH, _U32.pack(0))
)
_FLAGS_MASK = SVC_F_PERSISTENT | SCHED_FLAGS_MASK


def _family(address: str) -> int:
    return socket.AF_INET6 if ":" in address else socket.AF_INET


@functools.lru_cache(maxsize=4096)  # a Service's real servers are written one after another
def _identity(key: ServiceKey) -> bytes:
    """af, protocol, addr, port: what dest commands name their service by."""
    af = _family(key.address)
    return (
        _nla(SVC_AF, _U16.pack(af))
        + _nla(SVC_PROTOCOL, _U16.pack(key.protocol.number))
        + _nla(SVC_ADDR, socket.inet_pton(af, key.address))
        + _nla(SVC_PORT, _BE16.pack(key.port))
    )


def _netmask(key: ServiceKey) -> bytes:
    return _NETMASK_V6 if ":" in key.address else _NETMASK_V4


def _service_full(vs: VirtualServer) -> bytes:
    persistent = vs.persistent_timeout > 0
    flags = (SVC_F_PERSISTENT if persistent else 0) | (vs.sched_flags & SCHED_FLAGS_MASK)
    return _nla(
        ATTR_SERVICE,
        _identity(vs.key)
        + _netmask(vs.key)
        + _nla(SVC_SCHED_NAME, vs.scheduler.encode() + b"\0")
        + _nla(SVC_FLAGS, _FLAGS.pack(flags, _FLAGS_MASK))
        + _nla(SVC_TIMEOUT, _U32.pack(vs.persistent_timeout if persistent else 0)),
    )


def _service_key(key: ServiceKey) -> bytes:
    return _nla(ATTR_SERVICE, _KEY_DEFAULTS + _identity(key) + _netmask(key))


@functools.lru_cache(maxsize=4096)
def _service_attr(key: ServiceKey) -> bytes:
    return _nla(ATTR_SERVICE, _identity(key))


# What follows the defaults in a dest attribute, in one pack per family (the initial sync
# writes every real server): address, its family, port (network order, as bytes), forward
# method, weight; each attribute 4-byte aligned as _nla pads it.
_DEST_TAIL: dict[int, struct.Struct] = {
    socket.AF_INET: struct.Struct("=HH4sHHH2xHH2s2xHHIHHI"),
    socket.AF_INET6: struct.Struct("=HH16sHHH2xHH2s2xHHIHHI"),
}
_DEST_HEADER_LEN = 4 + len(_DEST_DEFAULTS)


def _dest(key: ServiceKey, rs: RealServerKey, weight: int) -> bytes:
    af = _family(rs.address)
    raw = socket.inet_pton(af, rs.address)
    tail = _DEST_TAIL[af].pack(
        4 + len(raw),
        DEST_ADDR,
        raw,
        6,
        DEST_ADDR_FAMILY,
        af,
        6,
        DEST_PORT,
        rs.port.to_bytes(2, "big"),
        8,
        DEST_FWD_METHOD,
        FWD_MASQ,
        8,
        DEST_WEIGHT,
        weight,
    )
    return (
        _service_attr(key)
        + _U16.pack(_DEST_HEADER_LEN + len(tail))
        + _U16.pack(ATTR_DEST)
        + _DEST_DEFAULTS
        + tail
    )


# --- requests: (netlink flags, generic netlink payload) -------------------------------------
Request = tuple[int, bytes]


def new_service(vs: VirtualServer) -> Request:
    return FLAGS_CREATE, _genl(NEW_SERVICE, _service_full(vs))


def set_service(vs: VirtualServer) -> Request:
    return FLAGS_CHANGE, _genl(SET_SERVICE, _service_full(vs))


def del_service(key: ServiceKey) -> Request:
    return FLAGS_REQ, _genl(DEL_SERVICE, _service_key(key))


def get_service(key: ServiceKey) -> Request:
    return FLAGS_REQ, _genl(GET_SERVICE, _service_key(key))


def dump_services() -> Request:
    return FLAGS_DUMP, _genl(GET_SERVICE)


def new_dest(key: ServiceKey, rs: RealServerKey, weight: int) -> Request:
    return FLAGS_CREATE, _genl(NEW_DEST, _dest(key, rs, weight))


def set_dest(key: ServiceKey, rs: RealServerKey, weight: int) -> Request:
    return FLAGS_CHANGE, _genl(SET_DEST, _dest(key, rs, weight))


def del_dest(key: ServiceKey, rs: RealServerKey) -> Request:
    return FLAGS_REQ, _genl(DEL_DEST, _dest(key, rs, 0))


def dump_dests(key: ServiceKey) -> Request:
    return FLAGS_DUMP, _genl(GET_DEST, _service_attr(key))


# --- rtnetlink: the VIP interface's addresses ----------------------------------------------
# What pyroute2's IPRoute.addr("add"/"del", index=, address=, prefixlen=/32 or /128) sends:
# an ifaddrmsg, IFA_ADDRESS, and for IPv4 IFA_LOCAL too (tests/unit/test_netlink_wire.py).
RTM_NEWADDR, RTM_DELADDR = 20, 21
IFA_ADDRESS, IFA_LOCAL = 1, 2
_IFADDRMSG = struct.Struct("=BBBBI")  # family, prefixlen, flags, scope, index


def _ifaddr(index: int, address: str) -> bytes:
    af = _family(address)
    raw = socket.inet_pton(af, address)
    if af == socket.AF_INET:
        return _IFADDRMSG.pack(af, 32, 0, 0, index) + _nla(IFA_ADDRESS, raw) + _nla(IFA_LOCAL, raw)
    return _IFADDRMSG.pack(af, 128, 0, 0, index) + _nla(IFA_ADDRESS, raw)


def new_addr(index: int, address: str) -> Request:
    """Put address/32 (/128) on interface `index` (message type RTM_NEWADDR)."""
    return FLAGS_CREATE, _ifaddr(index, address)


def del_addr(index: int, address: str) -> Request:
    """Remove address/32 (/128) from interface `index` (message type RTM_DELADDR)."""
    return FLAGS_REQ, _ifaddr(index, address)


# RTM_GETLINK of one interface by name: the kernel answers that link alone (pyroute2's
# link("get") parses every attribute of the answer, ~0.5 ms of Python where this is none).
RTM_GETLINK = 18
IFLA_IFNAME = 3
_IFINFOMSG = struct.Struct("=BxHiII")  # family, type, index, flags, change


def get_link(name: str) -> Request:
    """The interface named `name` (message type RTM_GETLINK); ENODEV when there is none."""
    return FLAGS_REQ, _IFINFOMSG.pack(0, 0, 0, 0, 0) + _nla(IFLA_IFNAME, name.encode() + b"\0")


def message(family: int, request: Request, seq: int, pid: int = 0) -> bytes:
    """The whole netlink message: header (type = the IPVS family id, or the rtnetlink
    message type) and payload."""
    flags, payload = request
    return _HEADER.pack(16 + len(payload), family, flags, seq, pid) + payload


# --- answers --------------------------------------------------------------------------------
def split(data: bytes) -> list[tuple[int, int, int, bytes]]:
    """The netlink messages in one datagram: (type, flags, seq, whole message)."""
    out = []
    i = 0
    while i + 16 <= len(data):
        length, kind, flags, seq, _pid = _HEADER.unpack_from(data, i)
        if length < 16 or i + length > len(data):
            break
        out.append((kind, flags, seq, data[i : i + length]))
        i += (length + 3) & ~3
    return out


def error_code(msg: bytes) -> int:
    """The (positive) errno of an NLMSG_ERROR message; 0 is an ACK."""
    code: int = _ERROR.unpack_from(msg, 16)[0]
    return -code


# --- dump answers ---------------------------------------------------------------------------
_NLA = struct.Struct("=HH")
_NLA_TYPE_MASK = 0x3FFF  # without NLA_F_NESTED / NLA_F_NET_BYTEORDER
_GENL_ATTRS = 16 + 4  # nlmsghdr, genlmsghdr


def _attrs(data: bytes, start: int = 0, end: int | None = None) -> dict[int, bytes]:
    """The attributes in data[start:end] by type (the last of a type wins, as in pyroute2's
    lookups); a truncated attribute ends the walk."""
    end = len(data) if end is None else end
    out: dict[int, bytes] = {}
    i = start
    while i + 4 <= end:
        length, kind = _NLA.unpack_from(data, i)
        if length < 4 or i + length > end:
            break
        out[kind & _NLA_TYPE_MASK] = data[i + 4 : i + length]
        i += (length + 3) & ~3
    return out


# for the other netlink families' messages (address_watch.py, nftables.py)
attributes, nla = _attrs, _nla


def _address(af: int | None, raw: bytes) -> str | None:
    """The kernel sends a 16-byte union nf_inet_addr; the family says how much is used."""
    if af == socket.AF_INET and len(raw) >= 4:
        return f"{raw[0]}.{raw[1]}.{raw[2]}.{raw[3]}"
    if af == socket.AF_INET6 and len(raw) >= 16:
        return ipaddress.IPv6Address(raw[:16]).compressed
    return None


def _u16(raw: bytes | None) -> int | None:
    return _U16.unpack_from(raw)[0] if raw is not None and len(raw) >= 2 else None


def _u32(raw: bytes | None) -> int:
    return _U32.unpack_from(raw)[0] if raw is not None and len(raw) >= 4 else 0


def _nested(msg: bytes, kind: int) -> dict[int, bytes]:
    top = _attrs(msg, _GENL_ATTRS)
    return _attrs(top[kind]) if kind in top else {}


def _parsed_key(a: dict[int, bytes]) -> ServiceKey | None:
    protocol = Protocol.from_number(_u16(a.get(SVC_PROTOCOL)) or 0)
    raw_port = a.get(SVC_PORT)
    addr = _address(_u16(a.get(SVC_AF)), a.get(SVC_ADDR, b""))
    if addr is None or raw_port is None or len(raw_port) < 2 or protocol is None:
        return None
    return ServiceKey(protocol, addr, _BE16.unpack_from(raw_port)[0])


def parse_service(msg: bytes) -> VirtualServer | None:
    """A service dump message (whole, header included) as a VirtualServer; None for what
    ipvsctl never programs (fwmark services, other protocols)."""
    a = _nested(msg, ATTR_SERVICE)
    key = _parsed_key(a)
    if key is None:
        return None
    raw_flags = a.get(SVC_FLAGS)
    flags = _U32.unpack_from(raw_flags)[0] if raw_flags and len(raw_flags) >= 4 else 0
    timeout = _u32(a.get(SVC_TIMEOUT)) if flags & SVC_F_PERSISTENT else 0
    name = a.get(SVC_SCHED_NAME, b"").split(b"\0", 1)[0].decode("utf-8", "replace")
    return VirtualServer(
        key=key,
        scheduler=name,
        persistent_timeout=timeout,
        sched_flags=flags & SCHED_FLAGS_MASK,
    )


_STATS64_HEAD = struct.Struct("=" + "HHQ" * 5)  # nla_len, nla_type, u64; five times
# (12, CONNS, 12, INPKTS, ...): lengths and types as interleaved in _STATS64_HEAD's values
_STATS64_SHAPE = tuple(x for t in range(1, 6) for x in (12, t))


def _counter(raw: bytes | None) -> int:
    """A stats counter: u64 in IPVS_SVC_ATTR_STATS64 (and for the bytes in STATS), u32
    for the others in STATS; the attribute's length says which."""
    if raw is None:
        return 0
    if len(raw) >= 8:
        value: int = _U64.unpack_from(raw)[0]
        return value
    return _u32(raw)


# The kernel's service message as ip_vs_genl_fill_service lays it out: the identity first
# (af, protocol, the 16-byte address, port, at fixed offsets) and STATS64 last (4 + 10 x 12
# bytes without PAD attributes). A scrape reads every virtual server's message: this shape
# is checked and read with two unpacks and a cached key; any other falls to the generic walk.
_SVC_HEAD = struct.Struct("=HHHHH2xHHH2xHH16sHH2s2x")  # service attr, af, protocol, addr, port
_SVC_HEAD_SHAPE = (SVC_AF, 6, SVC_PROTOCOL, 6, SVC_ADDR, 20, SVC_PORT, 6)  # type, length
_STATS64_LEN = 4 + 10 * 12


@functools.lru_cache(maxsize=16384)
def _key_of(af: int, protocol: int, raw: bytes, port: bytes) -> ServiceKey | None:
    proto = Protocol.from_number(protocol)
    addr = _address(af, raw)
    if proto is None or addr is None:
        return None
    return ServiceKey(proto, addr, _BE16.unpack(port)[0])


def _service_stats_fast(msg: bytes) -> tuple[ServiceKey, ServiceStats] | None:
    n = len(msg)
    if n < _GENL_ATTRS + _SVC_HEAD.size + _STATS64_LEN:
        return None
    h = _SVC_HEAD.unpack_from(msg, _GENL_ATTRS)
    if (
        h[0] != n - _GENL_ATTRS
        or h[1] & _NLA_TYPE_MASK != ATTR_SERVICE
        or (h[3], h[2], h[6], h[5], h[9], h[8], h[12], h[11]) != _SVC_HEAD_SHAPE
    ):
        return None
    tail_len, tail_type = _NLA.unpack_from(msg, n - _STATS64_LEN)
    if tail_len != _STATS64_LEN or tail_type & _NLA_TYPE_MASK != SVC_STATS64:
        return None
    v = _STATS64_HEAD.unpack_from(msg, n - _STATS64_LEN + 4)
    if v[0:15:3] != _STATS64_SHAPE[0::2] or v[1:15:3] != _STATS64_SHAPE[1::2]:
        return None
    key = _key_of(h[4], h[7], h[10], h[13])
    if key is None:
        return None
    return key, ServiceStats(v[2], v[5], v[8], v[11], v[14])


def parse_service_stats(msg: bytes) -> tuple[ServiceKey, ServiceStats] | None:
    """A service dump message's identity and traffic counters (ip_vs_genl_fill_stats64,
    or on kernels before 4.1 ip_vs_genl_fill_stats: u32 counts, u64 bytes); None for what
    ipvsctl never programs. A service without stats reads as all zero."""
    fast = _service_stats_fast(msg)
    if fast is not None:
        return fast
    a = _nested(msg, ATTR_SERVICE)
    key = _parsed_key(a)
    if key is None:
        return None
    raw = a.get(SVC_STATS64)
    if raw is not None and len(raw) >= _STATS64_HEAD.size:
        # The kernel's usual layout (no PAD attributes: x86, arm64): the five counters
        # first, each a 12-byte u64 attribute, unpacked at once (a scrape parses every
        # virtual server's). Anything else takes the generic walk.
        v = _STATS64_HEAD.unpack_from(raw)
        if v[0:15:3] == _STATS64_SHAPE[0::2] and v[1:15:3] == _STATS64_SHAPE[1::2]:
            return key, ServiceStats(v[2], v[5], v[8], v[11], v[14])
    if raw is None:
        raw = a.get(SVC_STATS)
    s = _attrs(raw) if raw is not None else {}  # IPVS_STATS_ATTR_PAD (11) is skipped
    return key, ServiceStats(
        _counter(s.get(STATS_CONNS)),
        _counter(s.get(STATS_INPKTS)),
        _counter(s.get(STATS_OUTPKTS)),
        _counter(s.get(STATS_INBYTES)),
        _counter(s.get(STATS_OUTBYTES)),
    )


class MalformedAnswer(Exception):
    """An answer that does not hold what its kind must (errors.py: a KernelTransient)."""


# A drain check parses one dest message per draining real server. The generic walk builds a
# dict of ~17 attributes each time; instead, the kernel's layout (every dest message from a
# kernel is laid out alike: attribute order and lengths) is learned from the first message
# and then read with one unpack, its lengths and types checked; a message that does not
# match a learned layout takes the walk (and its layout is learned, up to 4).
_DEST_WANTED = (DEST_ADDR, DEST_PORT, DEST_WEIGHT, DEST_ACTIVE_CONNS, DEST_INACT_CONNS)
_VALUE_FORMATS = {1: "B", 2: "H", 4: "I"}
_DEST_SIZES = {
    DEST_ADDR: 20,
    DEST_PORT: 6,
    DEST_WEIGHT: 8,
    DEST_ACTIVE_CONNS: 8,
    DEST_INACT_CONNS: 8,
}


@dataclass(frozen=True, slots=True)
class _DestLayout:
    fixed: struct.Struct  # from the dest attribute's header to the last attribute read
    shape: Callable[[tuple[Any, ...]], Any]  # the unpacked lengths and types ...
    expected: tuple[int, ...]  # ... as learned
    at: dict[int, int]  # attribute type -> the index of its value in the unpacked tuple


_dest_layouts: list[_DestLayout] = []


def _learn_dest_layout(msg: bytes) -> _DestLayout | None:
    top = _NLA.unpack_from(msg, _GENL_ATTRS) if len(msg) >= _GENL_ATTRS + 4 else (0, 0)
    if top[1] & _NLA_TYPE_MASK != ATTR_DEST or top[0] > len(msg) - _GENL_ATTRS:
        return None
    fmt, shape_fields, expected, at = ["=HH"], [0, 1], [top[0], top[1]], {}
    i, end, n = _GENL_ATTRS + 4, _GENL_ATTRS + top[0], 2
    while i + 4 <= end and not all(t in at for t in (*_DEST_WANTED, DEST_ADDR_FAMILY)):
        length, kind = _NLA.unpack_from(msg, i)
        if length < 4 or i + length > end or (kind & _NLA_TYPE_MASK) in at:
            return None
        size = length - 4
        fmt.append("HH" + (_VALUE_FORMATS.get(size, f"{size}s") if kind != DEST_PORT else "2s"))
        fmt.append("x" * (-length & 3))
        shape_fields += [n, n + 1]
        expected += [length, kind]
        at[kind & _NLA_TYPE_MASK] = n + 2
        n += 3
        i += (length + 3) & ~3
    sizes = dict(zip(expected[3::2], expected[2::2], strict=True))  # type -> attribute length
    if (
        any(sizes.get(t) != n for t, n in _DEST_SIZES.items())
        or sizes.get(DEST_ADDR_FAMILY, 6) != 6
    ):
        return None
    if len(msg) < _GENL_ATTRS + struct.calcsize("".join(fmt)):
        return None
    # the dest attribute's own length is checked against the message, not learned
    return _DestLayout(
        struct.Struct("".join(fmt)),
        operator.itemgetter(*shape_fields[2:]),
        tuple(expected[2:]),
        at,
    )


def _dest_fixed(msg: bytes, vs: ServiceKey) -> RealServerStatus | None:
    for layout in _dest_layouts:
        if len(msg) < _GENL_ATTRS + layout.fixed.size:
            continue
        h = layout.fixed.unpack_from(msg, _GENL_ATTRS)
        if h[1] & _NLA_TYPE_MASK != ATTR_DEST or h[0] > len(msg) - _GENL_ATTRS:
            continue
        if layout.shape(h) != layout.expected:
            continue
        at = layout.at
        family = h[at[DEST_ADDR_FAMILY]] if DEST_ADDR_FAMILY in at else _family(vs.address)
        addr = _address(family, h[at[DEST_ADDR]])
        port = h[at[DEST_PORT]]
        if addr is None or len(port) != 2:
            return None
        return RealServerStatus(
            key=RealServerKey(addr, int.from_bytes(port, "big")),
            weight=h[at[DEST_WEIGHT]],
            active_conns=h[at[DEST_ACTIVE_CONNS]],
            inactive_conns=h[at[DEST_INACT_CONNS]],
        )
    if len(_dest_layouts) < 4:
        layout_ = _learn_dest_layout(msg)
        if layout_ is not None and all(
            (k.fixed.format, k.expected) != (layout_.fixed.format, layout_.expected)
            for k in _dest_layouts
        ):
            _dest_layouts.append(layout_)
    return None


def parse_dest(msg: bytes, vs: ServiceKey) -> RealServerStatus:
    """A dest dump message of virtual server `vs` as a RealServerStatus (the virtual
    server's family stands in on kernels that do not send IPVS_DEST_ATTR_ADDR_FAMILY)."""
    fixed = _dest_fixed(msg, vs)
    if fixed is not None:
        return fixed
    a = _nested(msg, ATTR_DEST)
    family = _u16(a.get(DEST_ADDR_FAMILY)) or _family(vs.address)
    addr = _address(family, a.get(DEST_ADDR, b""))
    raw_port = a.get(DEST_PORT)
    if addr is None or raw_port is None or len(raw_port) < 2:
        raise MalformedAnswer("a real server without an address or port")
    return RealServerStatus(
        key=RealServerKey(addr, _BE16.unpack_from(raw_port)[0]),
        weight=_u32(a.get(DEST_WEIGHT)),
        active_conns=_u32(a.get(DEST_ACTIVE_CONNS)),
        inactive_conns=_u32(a.get(DEST_INACT_CONNS)),
    )


# A drain check dumps its virtual servers but needs only their draining real servers (one
# of ~10 each): they are found in the answer's bytes by their address attribute, as every
# kernel's ip_vs_genl_fill_dest writes it (IPVS_DEST_ATTR_ADDR: the 16-byte union
# nf_inet_addr, an IPv4 address in its first 4), with bytes.find; only a message holding it
# is parsed (parse_dest, whose exact key decides). Parsing every dest was most of a read.
_DEST_ADDR_ATTR = _NLA.pack(4 + 16, DEST_ADDR)
_DEST_ADDR_IN_MSG = _GENL_ATTRS + 4  # the address attribute, first in the dest attribute
_NLMSG_MIN_TYPE = 0x10  # below: netlink's own (NOOP, ERROR, DONE, OVERRUN)


def packed_addresses(real_servers: Iterable[RealServerKey]) -> frozenset[bytes]:
    """These real servers' address attributes' leading bytes, as find_dests looks for them."""
    return frozenset(
        _DEST_ADDR_ATTR + socket.inet_pton(_family(r.address), r.address) for r in real_servers
    )


def find_dests(datagrams: Iterable[bytes], wanted: Collection[bytes]) -> list[bytes]:
    """The messages of a dump's answer that hold one of the wanted address attributes
    (packed_addresses), each once, in order. A hit is framed by the kernel's layout (the
    address first in the dest attribute, 24 bytes into its message), checked; a hit that
    does not frame so takes a walk of its datagram's messages."""
    out: list[bytes] = []
    for data in datagrams:
        hits: set[int] = set()
        for pattern in wanted:
            at = data.find(pattern)
            while at >= 0:
                hits.add(at)
                at = data.find(pattern, at + 1)
        if not hits:
            continue
        mine: list[bytes] = []
        for h in sorted(hits):
            start = h - _DEST_ADDR_IN_MSG
            if start >= 0:
                length, kind, _f, _s, _p = _HEADER.unpack_from(data, start)
                nest_len, nest_type = _NLA.unpack_from(data, start + _GENL_ATTRS)
                if (
                    kind >= _NLMSG_MIN_TYPE
                    and start + length <= len(data)
                    and nest_len == length - _GENL_ATTRS
                    and nest_type & _NLA_TYPE_MASK == ATTR_DEST
                ):
                    mine.append(data[start : start + length])
                    continue
            # another layout: every message of the datagram that holds one
            mine = [m for _k, _fl, _sq, m in split(data) if any(p in m for p in wanted)]
            break
        out += mine
    return out


def dump_end(datagrams: list[bytes], seq: int) -> list[bytes] | int | None:
    """The end of dump `seq` inside datagrams that also hold data (raw.py looks for it at
    the head of a datagram, where the kernel puts it): None while not ended, else the
    datagrams cut before it, or the errno of an NLMSG_ERROR."""
    for n, data in enumerate(datagrams):
        at = 0
        for kind, _flags, answer_seq, msg in split(data):
            if answer_seq == seq and kind in (NLMSG_DONE, NLMSG_ERROR):
                code = error_code(msg) if kind == NLMSG_ERROR else 0
                return code or [*datagrams[:n], data[:at]]
            at += (len(msg) + 3) & ~3
    return None


def dump_messages(datagrams: Iterable[bytes]) -> list[bytes]:
    """Every message of a dump's answer (raw.py's datagrams)."""
    return [m for data in datagrams for kind, _f, _s, m in split(data) if kind >= _NLMSG_MIN_TYPE]

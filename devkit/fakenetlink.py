"""The one netlink fake: the kernel's side of ipvsctl's netlink sockets, modelled, so that
NetlinkKernel runs its real request path (wire.py's packed messages out, answers read until
the ACK, error or end of dump, errors translated) with no kernel.

- `ModelKernelSocket(answer)`: a socket whose every request is answered at once, on a
  socketpair (so poll() works as on a netlink socket), by `answer(Request) -> datagrams`.
- `IPVSModel`: such an answer, stateful: IPVS over generic netlink on an in-memory table
  (FakeKernel: the kernel's add/set/del semantics) and the dummy interface's addresses over
  rtnetlink, answering as the kernel's ip_vs_ctl.c does (its errno, dumps, the empty dest
  dump of a missing service). It counts the service dumps it answers.
- `model_sockets(model)`: netlink/sockets.Sockets whose pyroute2 objects are stand-ins
  holding a ModelKernelSocket as their raw socket, for `NetlinkKernel(sockets=...)`.

Answers are packed by hand as the kernel fills them (ip_vs_genl_fill_service,
ip_vs_genl_fill_dest in net/netfilter/ipvs/ip_vs_ctl.c, 6.1);
tests/unit/test_netlink_wire_parse.py holds those shapes against pyroute2's decoding.
Requests are read with wire.py's parsers (a request's attributes are laid out as an
answer's). The timeouts (IPVS_CMD_SET_CONFIG) and links go through pyroute2's own request
path, not modelled here beyond GET_CONFIG's empty reply: the lab tests them.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import struct
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ipvsctl.kernel.fake import FakeKernel
from ipvsctl.kernel.netlink import wire
from ipvsctl.kernel.netlink.errors import NetlinkError
from ipvsctl.kernel.netlink.sockets import Sockets
from ipvsctl.model import Protocol, RealServerStatus, ServiceKey, ServiceStats, VirtualServer
from ipvsctl.model.ipvs import IPVS_SCHEDULERS

IPVS_FAMILY = 0x1C  # the generic netlink family id the model's IPVS socket reports
IFINDEX = 7  # the dummy interface's index in the model
NLM_F_MULTI = 0x2
NESTED = 0x8000


# --- packing, as the kernel does ------------------------------------------------------------
def nla(kind: int, payload: bytes) -> bytes:
    n = 4 + len(payload)
    return struct.pack("=HH", n, kind) + payload + b"\0" * (-n & 3)


def u16(v: int) -> bytes:
    return struct.pack("=H", v)


def u32(v: int) -> bytes:
    return struct.pack("=I", v)


def inet(address: str) -> tuple[int, bytes]:
    """(af, the 16-byte union nf_inet_addr the kernel puts)."""
    af = socket.AF_INET6 if ":" in address else socket.AF_INET
    return af, socket.inet_pton(af, address).ljust(16, b"\0")


def stats(width: str, counters: ServiceStats | None = None) -> bytes:
    """A nested IPVS_*_ATTR_STATS (width "=I") or STATS64 ("=Q") as the kernel fills it
    (ip_vs_genl_fill_stats/_stats64): conns, inpkts, outpkts, inbytes, outbytes, then the
    estimator's five rates. In STATS the bytes are u64 and the rest u32. Without
    `counters`, 1001..1010 (a shape test's recognizable values)."""
    c = counters
    values = (
        [c.conns, c.in_packets, c.out_packets, c.in_bytes, c.out_bytes, 0, 0, 0, 0, 0]
        if c is not None
        else [1000 + i for i in range(1, 11)]
    )
    return b"".join(
        nla(i, struct.pack("=Q", v) if i in (4, 5) or width == "=Q" else u32(v & 0xFFFFFFFF))
        for i, v in enumerate(values, 1)
    )  # the kernel's (u32) casts: STATS truncates counts past 32 bits


def message(
    cmd: int,
    top: int,
    attrs: bytes,
    nested_flag: bool = False,
    seq: int = 7,
    family: int = IPVS_FAMILY,
) -> bytes:
    """One dump answer: a generic netlink message with one nested attribute `top`."""
    body = bytes((cmd, 1, 0, 0)) + nla(top | (NESTED if nested_flag else 0), attrs)
    return struct.pack("=IHHII", 16 + len(body), family, NLM_F_MULTI, seq, 0) + body


def service_message(
    address: str | None,
    port: int,
    proto: str | int,
    sched: str,
    flags: int,
    timeout: int,
    fwmark: int = 0,
    pe: str | None = None,
    nested_flag: bool = False,
    seq: int = 7,
    counters: ServiceStats | None = None,
) -> bytes:
    """A service as ip_vs_genl_fill_service writes it (IPVS_CMD_NEW_SERVICE)."""
    af, raw = inet(address or "0.0.0.0")
    a = nla(1, u16(af))
    if fwmark:
        a += nla(5, u32(fwmark))
    else:
        number = Protocol(proto).number if isinstance(proto, str) else proto
        a += nla(2, u16(number)) + nla(3, raw) + nla(4, struct.pack("!H", port))
    a += nla(6, sched.encode() + b"\0")
    if pe:
        a += nla(11, pe.encode() + b"\0")
    a += nla(7, struct.pack("=II", flags, 0xFFFFFFFF)) + nla(8, u32(timeout))
    a += nla(9, u32(0xFFFFFFFF if af == socket.AF_INET else 128))
    a += nla(10 | NESTED, stats("=I", counters)) + nla(12 | NESTED, stats("=Q", counters))
    return message(wire.NEW_SERVICE, wire.ATTR_SERVICE, a, nested_flag, seq)


def dest_message(
    address: str,
    port: int,
    weight: int,
    active: int,
    inactive: int,
    nested_flag: bool = False,
    seq: int = 7,
) -> bytes:
    """A real server as ip_vs_genl_fill_dest writes it (IPVS_CMD_NEW_DEST)."""
    af, raw = inet(address)
    a = (
        nla(1, raw)
        + nla(11, u16(af))
        + nla(2, struct.pack("!H", port))
        + nla(3, u32(0))
        + nla(4, u32(weight))
        + nla(13, b"\0")
        + nla(14, u16(0))
        + nla(15, u16(0))
        + nla(5, u32(0))
        + nla(6, u32(0))
        + nla(7, u32(active))
        + nla(8, u32(inactive))
        + nla(9, u32(3))
        + nla(10 | NESTED, stats("=I"))
        + nla(12 | NESTED, stats("=Q"))
    )
    return message(wire.NEW_DEST, wire.ATTR_DEST, a, nested_flag, seq)


def virtual_server_answer(
    vs: VirtualServer, seq: int, counters: ServiceStats | None = None
) -> bytes:
    flags = (wire.SVC_F_PERSISTENT if vs.persistent_timeout else 0) | vs.sched_flags | 0x2
    return service_message(
        vs.key.address,
        vs.key.port,
        vs.key.protocol.value,
        vs.scheduler,
        flags,
        vs.persistent_timeout,
        seq=seq,
        counters=counters or ServiceStats(),
    )


def real_server_answer(rs: RealServerStatus, seq: int) -> bytes:
    return dest_message(
        rs.key.address, rs.key.port, rs.weight, rs.active_conns, rs.inactive_conns, seq=seq
    )


def error(seq: int, code: int) -> bytes:
    """NLMSG_ERROR with this errno (0: an ACK)."""
    return (
        struct.pack("=IHHII", 36, wire.NLMSG_ERROR, 0, seq, 0)
        + (-code).to_bytes(4, "little", signed=True)
        + bytes(16)
    )


def ack(seq: int) -> bytes:
    return error(seq, 0)


def done(seq: int) -> bytes:
    """NLMSG_DONE: the end of a dump."""
    return struct.pack("=IHHII", 20, wire.NLMSG_DONE, NLM_F_MULTI, seq, 0) + bytes(4)


# --- the socket -----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Request:
    """One request as the kernel receives it."""

    kind: int  # nlmsg_type: the IPVS family id, or an rtnetlink message type
    flags: int
    seq: int
    data: bytes  # the whole message, header included

    @property
    def cmd(self) -> int:
        """The generic netlink command (IPVS requests)."""
        return self.data[16]

    @property
    def dump(self) -> bool:
        return self.flags & wire.NLM_F_DUMP == wire.NLM_F_DUMP


Answer = Callable[[Request], Iterable[bytes]]


class ModelKernelSocket:
    """The kernel's side of one netlink socket: each request is answered at once, on a
    socketpair, by `answer`. Non-blocking as pyroute2's asyncio transport leaves its
    socket. `rcvbuf` (bytes, None: unbounded) is its receive buffer as the kernel keeps
    it: an answer that does not fit is dropped, and the next receive fails once with
    ENOBUFS before it returns what is queued (netlink_overrun, sock_error); until the
    queue has been read empty (netlink_rcv_wake) the socket stays congested and further
    drops say nothing."""

    def __init__(self, answer: Answer) -> None:
        self.ours, self.kernel = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.ours.setblocking(False)
        self.answer = answer
        self.sent: list[bytes] = []
        self.rcvbuf: int | None = None
        self._queued = 0  # bytes of answers waiting
        self._overrun = False  # ENOBUFS to report
        self._congested = False
        self.dropped = 0  # answers dropped for want of room

    def fileno(self) -> int:
        return self.ours.fileno()

    def send(self, data: bytes) -> int:
        """As the kernel: every message of the datagram in turn, each answered, but a
        done one only when it asks for an ACK (a failure always)."""
        self.sent.append(data)
        for kind, flags, seq, msg in wire.split(data):
            for datagram in self.answer(Request(kind, flags, seq, msg)):
                if not flags & wire.NLM_F_ACK and datagram == ack(seq):
                    continue
                if self.rcvbuf is not None and self._queued + len(datagram) > self.rcvbuf:
                    if not self._congested:
                        self._congested = self._overrun = True
                    self.dropped += 1
                    continue
                self._queued += len(datagram)
                self.kernel.send(datagram)
        return len(data)

    def _error(self) -> None:
        if self._overrun:
            self._overrun = False
            raise OSError(errno.ENOBUFS, os.strerror(errno.ENOBUFS))

    def _read(self, n: int) -> None:
        self._queued -= n
        if not self._queued:
            self._congested = False

    def recv(self, size: int) -> bytes:
        self._error()
        data = self.ours.recv(size)
        self._read(len(data))
        return data

    def recv_into(self, buffer: bytearray) -> int:
        self._error()
        n = self.ours.recv_into(buffer)
        self._read(n)
        return n

    def close(self) -> None:
        self.ours.close()
        self.kernel.close()


# --- pyroute2's objects, as NetlinkKernel uses them -----------------------------------------
class _Core:
    def __init__(self, sock: ModelKernelSocket) -> None:
        self.socket = sock


class _Config:
    """GET_CONFIG's reply with no timeout attribute (the kernel's defaults, unread)."""

    def get_attr(self, name: str) -> None:
        return None


class ModelIPVS:
    """pyroute2's IPVS as NetlinkKernel uses it: `prid`, its socket used raw (`asyncore`),
    and GET_CONFIG (the capability check at open: `config_error` is its errno)."""

    def __init__(
        self, sock: ModelKernelSocket, prid: int = IPVS_FAMILY, config_error: int | None = None
    ) -> None:
        self.prid = prid
        self.asyncore = _Core(sock)
        self.config_error = config_error

    def nlm_request(self, msg: Any, msg_type: int, msg_flags: int) -> list[Any]:
        if self.config_error is not None:
            raise NetlinkError(self.config_error)
        return [_Config()]

    def close(self) -> None:
        self.asyncore.socket.close()


class ModelIPRoute:
    """pyroute2's IPRoute as the dummy interface uses it: the link lookup and the address
    dump through pyroute2's API, the address add/del raw."""

    def __init__(self, sock: ModelKernelSocket, model: IPVSModel) -> None:
        self.asyncore = _Core(sock)
        self.model = model

    def link_lookup(self, ifname: str) -> list[int]:
        return [IFINDEX] if self.model.interface_exists else []

    def link(self, command: str, ifname: str, kind: str) -> None:
        self.model.interface_exists = True

    def get_addr(self, index: int) -> list[dict[str, str]]:
        return [{"IFA_ADDRESS": a} for a in sorted(self.model.addresses)]

    def close(self) -> None:
        self.asyncore.socket.close()


# --- the model ------------------------------------------------------------------------------
def _service_key(req: Request) -> ServiceKey | None:
    vs = wire.parse_service(req.data)
    return vs.key if vs is not None else None


class IPVSModel:
    """IPVS and the dummy interface's addresses, answering netlink requests as the kernel
    does. `table` is the IPVS table (a FakeKernel: inspect it, seed it); thread-safe.
    Opening an IPVS socket fails as pyroute2's does without the ip_vs module (`loaded`
    False: ENOENT, no such generic netlink family), and its first command with
    `config_error` (EPERM: no CAP_NET_ADMIN)."""

    def __init__(self) -> None:
        self.table = FakeKernel()
        self.addresses: set[str] = set()
        self.interface_exists = True
        self.service_dumps = 0
        self.loaded = True
        self.config_error: int | None = None
        self._lock = threading.Lock()

    def open_ipvs(self, answer: Answer | None = None) -> ModelIPVS:
        if not self.loaded:
            raise NetlinkError(errno.ENOENT)
        sock = ModelKernelSocket(answer if answer is not None else self)
        return ModelIPVS(sock, config_error=self.config_error)

    def __call__(self, req: Request) -> list[bytes]:
        with self._lock:
            if req.kind == IPVS_FAMILY:
                return self._ipvs(req)
            if req.kind in (wire.RTM_NEWADDR, wire.RTM_DELADDR):
                return [error(req.seq, self._address(req))]
            return [error(req.seq, errno.EOPNOTSUPP)]

    # IPVS: ip_vs_genl_set_cmd / ip_vs_genl_get_cmd / the dumps
    def _ipvs(self, req: Request) -> list[bytes]:
        t = self.table
        if req.cmd == wire.GET_SERVICE and req.dump:
            self.service_dumps += 1
            return [
                *(virtual_server_answer(svc.vs, req.seq, svc.stats) for svc in t.services.values()),
                done(req.seq),
            ]
        key = _service_key(req)
        if key is None:
            return [error(req.seq, errno.EINVAL)]
        svc = t.services.get(key)
        if req.cmd == wire.GET_DEST:  # a missing service dumps no real server, no error
            found = t.list_real_servers(key) if svc else []
            return [*(real_server_answer(rs, req.seq) for rs in found), done(req.seq)]
        if req.cmd == wire.NEW_SERVICE:
            vs = wire.parse_service(req.data)
            assert vs is not None
            if svc is not None:
                return [error(req.seq, errno.EEXIST)]
            if vs.scheduler not in IPVS_SCHEDULERS:
                return [error(req.seq, errno.ENOENT)]
            t.add_virtual_server(vs, bind_address=False)
            return [ack(req.seq)]
        if svc is None:
            return [error(req.seq, errno.ESRCH)]
        if req.cmd == wire.GET_SERVICE:
            return [virtual_server_answer(svc.vs, req.seq), ack(req.seq)]
        if req.cmd == wire.SET_SERVICE:
            vs = wire.parse_service(req.data)
            assert vs is not None
            if vs.scheduler not in IPVS_SCHEDULERS:
                return [error(req.seq, errno.ENOENT)]
            t.update_virtual_server(vs)
        elif req.cmd == wire.DEL_SERVICE:
            t.delete_virtual_server(key, bind_address=False)
        elif req.cmd in (wire.NEW_DEST, wire.SET_DEST, wire.DEL_DEST):
            dest = wire.parse_dest(req.data, key)
            exists = dest.key in svc.dests
            if req.cmd == wire.NEW_DEST:
                if exists:
                    return [error(req.seq, errno.EEXIST)]
                t.add_real_server(key, dest.key, dest.weight)
            elif not exists:
                return [error(req.seq, errno.ENOENT)]
            elif req.cmd == wire.SET_DEST:
                t.set_real_server_weight(key, dest.key, dest.weight)
            else:
                t.delete_real_server(key, dest.key)
        else:
            return [error(req.seq, errno.EOPNOTSUPP)]
        return [ack(req.seq)]

    # rtnetlink: the dummy interface's addresses
    def _address(self, req: Request) -> int:
        family, _prefix, _flags, _scope, index = struct.unpack_from("=BBBBI", req.data, 16)
        if index != IFINDEX or not self.interface_exists:
            return errno.ENODEV
        i, raw = 24, None
        while i + 4 <= len(req.data):
            length, kind = struct.unpack_from("=HH", req.data, i)
            if kind == wire.IFA_ADDRESS:
                raw = req.data[i + 4 : i + length]
            i += (length + 3) & ~3
        if raw is None:
            return errno.EINVAL
        address = ipaddress.ip_address(socket.inet_ntop(family, raw)).compressed
        if req.kind == wire.RTM_NEWADDR:
            if address in self.addresses:
                return errno.EEXIST
            self.addresses.add(address)
        else:
            if address not in self.addresses:
                return errno.EADDRNOTAVAIL
            self.addresses.discard(address)
        return 0


def model_sockets(model: IPVSModel | None = None, answer: Answer | None = None) -> Sockets:
    """Sockets for `NetlinkKernel(sockets=...)` (or `IPVSCalls`) on the model, one
    ModelKernelSocket per socket and thread as pyroute2 opens them. `answer` replaces the
    model's answers on the IPVS socket (a test's scripted kernel)."""
    m = model if model is not None else IPVSModel()
    return Sockets(
        ipvs_factory=lambda **_: m.open_ipvs(answer),
        iproute_factory=lambda **_: ModelIPRoute(ModelKernelSocket(m), m),
    )

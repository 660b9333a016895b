"""A lean IPVS client for the benchmarks: generic netlink messages packed with `struct` on a
plain socket, one request and one answer per call, no event loop.

It exists for the baselines and as the yardstick of the initial sync. kube-router talks to
IPVS from Go (moby/ipvs, vishvananda/netlink): a call costs it microseconds. This client packs
the same IPVS messages by hand (its own code, not kernel/netlink/wire.py's), with none of the
daemon's bookkeeping, one request and its answer at a time, so the comparison stays about the
algorithm (one Service vs every Service per change) and errs in the baselines' favour. It
implements the same `IPVSKernel` methods, so the baselines can also run on NetlinkKernel or
FakeKernel.

Message layouts: include/uapi/linux/ip_vs.h and linux/genetlink.h.
"""

from __future__ import annotations

import errno
import os
import socket
import struct
from collections.abc import Iterator
from typing import Any

from ipvsctl.kernel.netns import run_in_netns
from ipvsctl.kernel.port import KernelExists, KernelNotFound, KernelTransient
from ipvsctl.kernel.procfs import ipvs as procfs
from ipvsctl.model import (
    Protocol,
    RealServerKey,
    RealServerStatus,
    ServiceKey,
    VirtualServer,
)

NETLINK_ROUTE, NETLINK_GENERIC = 0, 16
NLM_F_REQUEST, NLM_F_ACK, NLM_F_EXCL, NLM_F_CREATE, NLM_F_DUMP = 1, 4, 0x200, 0x400, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
NLA_F_NESTED = 0x8000
GENL_ID_CTRL, CTRL_CMD_GETFAMILY, CTRL_ATTR_FAMILY_ID, CTRL_ATTR_FAMILY_NAME = 0x10, 3, 1, 2
RTM_NEWADDR, RTM_GETADDR, IFA_ADDRESS, IFA_LOCAL = 20, 22, 1, 2

# IPVS commands and attributes
NEW_SERVICE, SET_SERVICE, DEL_SERVICE, GET_SERVICE = 1, 2, 3, 4
NEW_DEST, SET_DEST, DEL_DEST, GET_DEST = 5, 6, 7, 8
ATTR_SERVICE, ATTR_DEST = 1, 2
SVC_AF, SVC_PROTOCOL, SVC_ADDR, SVC_PORT = 1, 2, 3, 4
SVC_SCHED, SVC_FLAGS, SVC_TIMEOUT, SVC_NETMASK = 6, 7, 8, 9
DEST_ADDR, DEST_PORT, DEST_FWD, DEST_WEIGHT, DEST_UTHRESH, DEST_LTHRESH = 1, 2, 3, 4, 5, 6
DEST_ACTIVE, DEST_INACT, DEST_AF = 7, 8, 11
SVC_F_PERSISTENT = 1
PROTO = {Protocol.TCP: 6, Protocol.UDP: 17, Protocol.SCTP: 132}
PROTO_BY_NUMBER = {v: k for k, v in PROTO.items()}


def _nla(kind: int, payload: bytes) -> bytes:
    n = 4 + len(payload)
    return struct.pack("=HH", n, kind) + payload + b"\0" * (-n & 3)


def _attrs(data: bytes) -> Iterator[tuple[int, bytes]]:
    i = 0
    while i + 4 <= len(data):
        n, kind = struct.unpack_from("=HH", data, i)
        if n < 4:
            return
        yield kind & 0x3FFF, data[i + 4 : i + n]
        i += (n + 3) & ~3


def _family(address: str) -> int:
    return socket.AF_INET6 if ":" in address else socket.AF_INET


def _addr(address: str) -> bytes:
    return socket.inet_pton(_family(address), address)


def _service_key(key: ServiceKey) -> bytes:
    af = _family(key.address)
    return (
        _nla(SVC_AF, struct.pack("=H", af))
        + _nla(SVC_PROTOCOL, struct.pack("=H", PROTO[key.protocol]))
        + _nla(SVC_ADDR, _addr(key.address))
        + _nla(SVC_PORT, struct.pack("!H", key.port))
    )


def _service_full(vs: VirtualServer) -> bytes:
    persistent = vs.persistent_timeout > 0
    netmask = 128 if vs.key.family == 6 else 0xFFFFFFFF
    return (
        _service_key(vs.key)
        + _nla(SVC_SCHED, vs.scheduler.encode() + b"\0")
        + _nla(
            SVC_FLAGS, struct.pack("=II", SVC_F_PERSISTENT if persistent else 0, SVC_F_PERSISTENT)
        )
        + _nla(SVC_TIMEOUT, struct.pack("=I", vs.persistent_timeout if persistent else 0))
        + _nla(SVC_NETMASK, struct.pack("=I", netmask))
    )


def _dest(rs: RealServerKey, weight: int) -> bytes:
    return (
        _nla(DEST_ADDR, _addr(rs.address))
        + _nla(DEST_PORT, struct.pack("!H", rs.port))
        + _nla(DEST_FWD, struct.pack("=I", 0))  # NAT (masquerade)
        + _nla(DEST_WEIGHT, struct.pack("=I", weight))
        + _nla(DEST_UTHRESH, struct.pack("=I", 0))
        + _nla(DEST_LTHRESH, struct.pack("=I", 0))
        + _nla(DEST_AF, struct.pack("=H", _family(rs.address)))
    )


def _ip(af: int, raw: bytes) -> str:
    return socket.inet_ntop(af, raw[:4] if af == socket.AF_INET else raw[:16])


class _Socket:
    def __init__(self, proto: int, netns: str | None) -> None:
        self.sock = run_in_netns(
            netns, lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, proto)
        )
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self.sock.bind((0, 0))
        self.seq = 0
        # One receive buffer for every answer: a recv(1 MB) each call allocated and freed
        # 1 MB per request, which took more than half of this client's time per write in
        # the lab VM (a yardstick slower than the adapter it is compared with).
        self.buffer = bytearray(1 << 20)

    def request(self, msg_type: int, flags: int, body: bytes) -> list[bytes]:
        """Send one message; the payloads of the answers (after nlmsghdr). Raises OSError
        with the kernel's errno."""
        self.seq += 1
        seq = self.seq
        self.sock.send(
            struct.pack("=IHHII", 16 + len(body), msg_type, flags | NLM_F_REQUEST, seq, 0) + body
        )
        out: list[bytes] = []
        dump = flags & NLM_F_DUMP == NLM_F_DUMP
        while True:
            data = bytes(memoryview(self.buffer)[: self.sock.recv_into(self.buffer)])
            i = 0
            while i + 16 <= len(data):
                n, kind, _f, s, _pid = struct.unpack_from("=IHHII", data, i)
                payload = data[i + 16 : i + n]
                i += (n + 3) & ~3
                if s != seq:
                    continue
                if kind == NLMSG_DONE:
                    return out
                if kind == NLMSG_ERROR:
                    (code,) = struct.unpack_from("=i", payload)
                    if code:
                        raise OSError(-code, os.strerror(-code))
                    return out
                out.append(payload)
                if not dump:
                    return out

    def close(self) -> None:
        self.sock.close()


class RawIPVS:
    """IPVSKernel over hand-packed generic netlink (one socket, one thread)."""

    def __init__(self, netns: str | None = None, interface: str = "kube-ipvs0") -> None:
        self.netns = netns
        self.genl = _Socket(NETLINK_GENERIC, netns)
        self.rt = _Socket(NETLINK_ROUTE, netns)
        self.family = self._resolve_family()
        self.ifindex = run_in_netns(netns, lambda: socket.if_nametoindex(interface))

    def _resolve_family(self) -> int:
        body = struct.pack("=BBH", CTRL_CMD_GETFAMILY, 1, 0) + _nla(
            CTRL_ATTR_FAMILY_NAME, b"IPVS\0"
        )
        (payload,) = self.genl.request(GENL_ID_CTRL, 0, body)
        for kind, value in _attrs(payload[4:]):
            if kind == CTRL_ATTR_FAMILY_ID:
                return int(struct.unpack("=H", value[:2])[0])
        raise KernelTransient("no IPVS generic netlink family", "open")

    def _ipvs(self, cmd: int, flags: int, *attrs: bytes, op: str) -> list[bytes]:
        body = struct.pack("=BBH", cmd, 1, 0) + b"".join(attrs)
        try:
            return self.genl.request(self.family, flags, body)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ESRCH):
                raise KernelNotFound(str(exc), op) from None
            if exc.errno == errno.EEXIST:
                raise KernelExists(str(exc), op) from None
            raise KernelTransient(str(exc), op) from None

    # --- reads --------------------------------------------------------------------------
    def list_virtual_servers(self) -> list[VirtualServer]:
        out = []
        for payload in self._ipvs(GET_SERVICE, NLM_F_DUMP, op="list_virtual_servers"):
            for kind, nested in _attrs(payload[4:]):
                if kind != ATTR_SERVICE:
                    continue
                a = dict(_attrs(nested))
                if SVC_ADDR not in a:
                    continue  # fwmark service
                af = struct.unpack("=H", a[SVC_AF][:2])[0]
                flags = struct.unpack("=II", a[SVC_FLAGS][:8])[0] if SVC_FLAGS in a else 0
                timeout = struct.unpack("=I", a[SVC_TIMEOUT][:4])[0] if SVC_TIMEOUT in a else 0
                proto = PROTO_BY_NUMBER.get(struct.unpack("=H", a[SVC_PROTOCOL][:2])[0])
                if proto is None:
                    continue
                key = ServiceKey(
                    proto, _ip(af, a[SVC_ADDR]), struct.unpack("!H", a[SVC_PORT][:2])[0]
                )
                out.append(
                    VirtualServer(
                        key,
                        a.get(SVC_SCHED, b"").rstrip(b"\0").decode(),
                        timeout if flags & SVC_F_PERSISTENT else 0,
                    )
                )
        return sorted(out, key=lambda vs: vs.key)

    def get_virtual_server(self, key: ServiceKey) -> VirtualServer | None:
        """One virtual server (IPVS_CMD_GET_SERVICE, not a dump); None if absent."""
        try:
            payloads = self._ipvs(
                GET_SERVICE,
                0,
                _nla(ATTR_SERVICE | NLA_F_NESTED, _service_key(key)),
                op="get_virtual_server",
            )
        except KernelNotFound:
            return None
        for payload in payloads:
            for kind, nested in _attrs(payload[4:]):
                if kind == ATTR_SERVICE:
                    a = dict(_attrs(nested))
                    return VirtualServer(key, a.get(SVC_SCHED, b"").rstrip(b"\0").decode(), 0)
        return None

    def list_real_servers(self, key: ServiceKey) -> list[RealServerStatus]:
        out = []
        payloads = self._ipvs(
            GET_DEST,
            NLM_F_DUMP,
            _nla(ATTR_SERVICE | NLA_F_NESTED, _service_key(key)),
            op="list_real_servers",
        )
        for payload in payloads:
            for kind, nested in _attrs(payload[4:]):
                if kind != ATTR_DEST:
                    continue
                a = dict(_attrs(nested))
                af = (
                    struct.unpack("=H", a[DEST_AF][:2])[0] if DEST_AF in a else _family(key.address)
                )
                out.append(
                    RealServerStatus(
                        RealServerKey(
                            _ip(af, a[DEST_ADDR]), struct.unpack("!H", a[DEST_PORT][:2])[0]
                        ),
                        weight=struct.unpack("=i", a[DEST_WEIGHT][:4])[0],
                        active_conns=struct.unpack("=I", a[DEST_ACTIVE][:4])[0],
                        inactive_conns=struct.unpack("=I", a[DEST_INACT][:4])[0],
                    )
                )
        return sorted(out, key=lambda r: r.key)

    # --- writes -------------------------------------------------------------------------
    def read_real_servers(
        self, keys: Any, only: Any = None
    ) -> dict[ServiceKey, list[RealServerStatus] | None]:
        scan = procfs.read_real_servers(keys, only, netns=self.netns)  # one /proc/net/ip_vs read
        return {k: scan.real_servers.get(k) for k in keys if k not in scan.unreadable}

    def read_connections(self, pairs: Any) -> Any:
        return procfs.read_connections(pairs, netns=self.netns)

    def add_virtual_server(self, vs: VirtualServer, bind_address: bool) -> None:
        if bind_address:
            self.bind_address(vs.key.address)
        self._ipvs(
            NEW_SERVICE,
            NLM_F_ACK,
            _nla(ATTR_SERVICE | NLA_F_NESTED, _service_full(vs)),
            op="add_virtual_server",
        )

    def update_virtual_server(self, vs: VirtualServer) -> None:
        self._ipvs(
            SET_SERVICE,
            NLM_F_ACK,
            _nla(ATTR_SERVICE | NLA_F_NESTED, _service_full(vs)),
            op="update_virtual_server",
        )

    def delete_virtual_server(self, key: ServiceKey, bind_address: bool) -> None:
        self._ipvs(
            DEL_SERVICE,
            NLM_F_ACK,
            _nla(ATTR_SERVICE | NLA_F_NESTED, _service_key(key)),
            op="delete_virtual_server",
        )

    def _dest_op(self, cmd: int, key: ServiceKey, rs: RealServerKey, weight: int, op: str) -> None:
        self._ipvs(
            cmd,
            NLM_F_ACK,
            _nla(ATTR_SERVICE | NLA_F_NESTED, _service_key(key)),
            _nla(ATTR_DEST | NLA_F_NESTED, _dest(rs, weight)),
            op=op,
        )

    def add_real_server(self, key: ServiceKey, rs: RealServerKey, weight: int) -> None:
        self._dest_op(NEW_DEST, key, rs, weight, "add_real_server")

    def set_real_server_weight(self, key: ServiceKey, rs: RealServerKey, weight: int) -> None:
        self._dest_op(SET_DEST, key, rs, weight, "set_real_server_weight")

    def delete_real_server(self, key: ServiceKey, rs: RealServerKey) -> None:
        self._dest_op(DEL_DEST, key, rs, 0, "delete_real_server")

    def flush_conntrack(self, key: ServiceKey, rs: RealServerKey) -> None:
        pass  # the benchmarks use TCP only

    def bind_address(self, address: str) -> None:
        """Address/32 on the dummy interface; nothing if it is there (EEXIST)."""
        af = _family(address)
        raw = _addr(address)
        body = (
            struct.pack("=BBBBI", af, 32 if af == socket.AF_INET else 128, 0, 0, self.ifindex)
            + _nla(IFA_LOCAL, raw)
            + _nla(IFA_ADDRESS, raw)
        )
        try:
            self.rt.request(RTM_NEWADDR, NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL, body)
        except OSError as exc:
            if exc.errno != errno.EEXIST:
                raise KernelTransient(str(exc), "bind_address") from None

    def list_addresses(self) -> list[str]:
        """IPv4 addresses on the dummy interface (one rtnetlink dump)."""
        out = []
        body = struct.pack("=BBBBI", socket.AF_INET, 0, 0, 0, 0)
        for payload in self.rt.request(RTM_GETADDR, NLM_F_DUMP, body):
            _af, _plen, _fl, _scope, index = struct.unpack_from("=BBBBI", payload)
            if index != self.ifindex:
                continue
            for kind, value in _attrs(payload[8:]):
                if kind == IFA_LOCAL:
                    out.append(socket.inet_ntop(socket.AF_INET, value[:4]))
        return out

    def close(self) -> None:
        self.genl.close()
        self.rt.close()

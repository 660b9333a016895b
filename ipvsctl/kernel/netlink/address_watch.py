"""Every address of this node, followed as the kernel changes them (rtnetlink multicast):
one dump when it opens, then each RTM_NEWADDR / RTM_DELADDR as it comes, O(the change).

Node safety needs them all (CONTRACT.md: a node address at a port outside the NodePort range
is never a virtual server), not only the NodePort addresses `--node-ip` or
`nodePortAddresses` chose: an external IP equal to docker0's address or a second NIC's at
port 22 would capture sshd. The proxies' dummy interfaces (kube-ipvs0, kube-dummy-if, the
daemon's `--interface`) hold Service addresses, not the node's: theirs are left out.

The socket is subscribed before it dumps, so no change between the dump and the first
notification is missed (notifications and dump answers come in order on one socket). The
kernel drops notifications a full receive buffer cannot take and says ENOBUFS: then the
whole state is dumped again. Links are followed too (an address names its interface by
index; the name says whether it is a proxy's). Pure parsing in `parse_*`; `HostAddressWatch`
holds the socket, the state and the thread. Readers on other threads read one published
snapshot (`version`, `host_addresses`, `node_addresses`), never the state being changed.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import itertools
import logging
import select
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass

from ipvsctl.kernel.netlink import wire
from ipvsctl.kernel.netlink.addresses import PROXY_INTERFACES
from ipvsctl.kernel.netns import run_in_netns
from ipvsctl.obs.logging import FailureStreaks

log = logging.getLogger("ipvsctl.kernel")

NETLINK_ROUTE = 0
RTMGRP_LINK, RTMGRP_IPV4_IFADDR, RTMGRP_IPV6_IFADDR = 0x1, 0x10, 0x100
RTM_NEWLINK, RTM_DELLINK, RTM_GETLINK = 16, 17, 18
RTM_NEWADDR, RTM_DELADDR, RTM_GETADDR = 20, 21, 22
NLMSG_ERROR, NLMSG_DONE = 2, 3
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
IFLA_IFNAME = 3
IFA_ADDRESS, IFA_LOCAL = 1, 2
SCOPE_UNIVERSE = 0  # rt_scope_t RT_SCOPE_UNIVERSE: a global address

_HEADER = struct.Struct("=IHHII")  # nlmsghdr
_IFINFO = struct.Struct("=BxHiII")  # ifinfomsg: family, type, index, flags, change
_IFADDR = struct.Struct("=BBBBI")  # ifaddrmsg: family, prefixlen, flags, scope, index
RECV_BUFFER = 1 << 16
SOCKET_BUFFER = 1 << 20  # the receive buffer asked for (the kernel caps it at rmem_max)
POLL = 1.0  # seconds between looks at `stop`
POLL_DATAGRAMS = 256  # datagrams read before the state is published
RETRY_MIN, RETRY_MAX = 1.0, 30.0  # seconds before a failed socket is opened again


@dataclass(frozen=True, slots=True)
class Link:
    index: int
    name: str | None  # None: the link is gone


@dataclass(frozen=True, slots=True)
class Address:
    index: int  # its interface's
    address: str  # compressed form
    scope: int
    present: bool  # False: RTM_DELADDR


def parse_link(kind: int, msg: bytes) -> Link | None:
    """An RTM_NEWLINK / RTM_DELLINK message (whole); None when it does not parse."""
    if len(msg) < 16 + _IFINFO.size:
        return None
    index = _IFINFO.unpack_from(msg, 16)[2]
    if kind == RTM_DELLINK:
        return Link(index, None)
    raw = wire.attributes(msg, 16 + _IFINFO.size).get(IFLA_IFNAME)
    name = raw.split(b"\0", 1)[0].decode("utf-8", "replace") if raw is not None else None
    return Link(index, name)


def parse_address(kind: int, msg: bytes) -> Address | None:
    """An RTM_NEWADDR / RTM_DELADDR message (whole); None for a family other than IPv4 and
    IPv6 or one that does not parse. IFA_LOCAL is the address of an IPv4 interface
    (IFA_ADDRESS is the peer's on a point-to-point link), as iproute2 reads it."""
    if len(msg) < 16 + _IFADDR.size:
        return None
    family, _prefix, _flags, scope, index = _IFADDR.unpack_from(msg, 16)
    a = wire.attributes(msg, 16 + _IFADDR.size)
    raw = a.get(IFA_LOCAL) or a.get(IFA_ADDRESS)
    if family == socket.AF_INET and raw is not None and len(raw) >= 4:
        text = socket.inet_ntop(socket.AF_INET, raw[:4])
    elif family == socket.AF_INET6 and raw is not None and len(raw) >= 16:
        text = ipaddress.IPv6Address(raw[:16]).compressed
    else:
        return None
    return Address(index, text, scope, kind == RTM_NEWADDR)


def dump_request(kind: int, seq: int) -> bytes:
    """RTM_GETLINK or RTM_GETADDR of every family, as a dump."""
    body = _IFINFO.pack(0, 0, 0, 0, 0) if kind == RTM_GETLINK else _IFADDR.pack(0, 0, 0, 0, 0)
    return _HEADER.pack(16 + len(body), kind, NLM_F_REQUEST | NLM_F_DUMP, seq, 0) + body


def _counts_for_host(address: str) -> bool:
    """Addresses that are never a virtual server whatever they are (loopback, link-local,
    multicast: source/validate.py refuses them first) are left out: every pod's veth has an
    fe80:: address, and its coming and going changes nothing here."""
    a = ipaddress.ip_address(address)
    return not (a.is_loopback or a.is_link_local or a.is_multicast or a.is_unspecified)


class AddressState:
    """Links and addresses as the messages said, and the two sets that follow from them,
    kept by counts: a message costs O(1) (a link renamed or gone: O(its addresses)), and
    `changed` says whether either set gained or lost a member. Pure."""

    def __init__(self, interface: str) -> None:
        self.interface = interface  # the daemon's VIP interface
        self.excluded = frozenset((interface, *PROXY_INTERFACES))
        self.links: dict[int, str] = {}
        self.by_index: dict[int, dict[str, int]] = {}  # index -> address -> scope
        self._host: dict[str, int] = {}  # address -> interfaces that count it
        self._node: dict[str, int] = {}
        self.changed = False

    def apply(self, kind: int, msg: bytes) -> None:
        """One message (any other kind is ignored)."""
        if kind in (RTM_NEWLINK, RTM_DELLINK):
            link = parse_link(kind, msg)
            if link is not None:
                self._link(link)
        elif kind in (RTM_NEWADDR, RTM_DELADDR):
            addr = parse_address(kind, msg)
            if addr is not None:
                self._address(addr)

    def _link(self, link: Link) -> None:
        old = self.links.get(link.index)
        if old == link.name and link.name is not None:
            return
        held = self.by_index.get(link.index, {})
        for address, scope in held.items():
            self._count(link.index, address, scope, -1)
        if link.name is None:
            self.links.pop(link.index, None)
            self.by_index.pop(link.index, None)  # the kernel says so too, one by one
            return
        self.links[link.index] = link.name
        for address, scope in held.items():
            self._count(link.index, address, scope, 1)

    def _address(self, addr: Address) -> None:
        held = self.by_index.setdefault(addr.index, {})
        old = held.get(addr.address)
        if old is not None:
            if addr.present and old == addr.scope:
                return
            self._count(addr.index, addr.address, old, -1)
            del held[addr.address]
        if addr.present:
            held[addr.address] = addr.scope
            self._count(addr.index, addr.address, addr.scope, 1)
        elif not held:
            del self.by_index[addr.index]

    def _count(self, index: int, address: str, scope: int, delta: int) -> None:
        name = self.links.get(index)  # None: not named yet, the node's until known
        if name not in self.excluded and _counts_for_host(address):
            self._bump(self._host, address, delta)
        if (
            scope == SCOPE_UNIVERSE
            and name not in ("lo", self.interface)
            and not ipaddress.ip_address(address).is_link_local
        ):
            self._bump(self._node, address, delta)

    def _bump(self, counts: dict[str, int], address: str, delta: int) -> None:
        n = counts.get(address, 0) + delta
        if n > 0:
            counts[address] = n
        else:
            counts.pop(address, None)
        if (n > 0) != (n - delta > 0):
            self.changed = True

    def host_addresses(self) -> frozenset[str]:
        """Every address of the node that could be asked for as a virtual server, but the
        proxies' dummy interfaces'."""
        return frozenset(self._host)

    def node_addresses(self) -> list[str]:
        """The default NodePort addresses, as `addresses.node_addresses` reads them: global
        scope, not on lo or the VIP interface, not link-local."""
        return sorted(self._node)


class HostAddressWatch:
    """The node's addresses, followed: `open()` (the dump, at start-up, in the caller's
    thread), then `run(stop)` on a thread of its own. `version` grows with every change;
    `host_addresses()` and `node_addresses()` are the state as of that version.
    `on_error()` is told of each failure (the socket is opened again with backoff; the
    addresses known are kept meanwhile); `netns` opens the socket in that namespace."""

    def __init__(
        self,
        interface: str = "kube-ipvs0",
        *,
        netns: str | None = None,
        on_error: Callable[[], object] = lambda: None,
    ) -> None:
        self.interface = interface
        self.netns = netns
        self.on_error = on_error
        self.version = 0
        self._state = AddressState(interface)
        self._host: frozenset[str] = frozenset()
        self._node: list[str] = []
        self._sock: socket.socket | None = None
        self._seq = itertools.count(1)
        self._failing = FailureStreaks(log)

    # --- what other threads read ----------------------------------------------------------
    def host_addresses(self) -> frozenset[str]:
        return self._host

    def node_addresses(self) -> list[str]:
        return list(self._node)

    # --- the watch's own thread (and open(), before it starts) ----------------------------
    def open(self) -> HostAddressWatch:
        """Subscribe, then dump links and addresses. OSError when rtnetlink cannot be
        opened or read."""
        sock = run_in_netns(self.netns, self._socket)
        try:
            self._state = AddressState(self.interface)
            self._state.changed = True  # published whole, whatever it was before
            for kind in (RTM_GETLINK, RTM_GETADDR):
                self._dump(sock, kind)
        except BaseException:
            sock.close()
            raise
        if self._sock is not None:
            self._sock.close()
        self._sock = sock
        self._publish()
        return self

    def _socket(self) -> socket.socket:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, 0)
        try:
            with contextlib.suppress(OSError):  # room for bursts (an overrun costs a dump)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER)
            sock.bind((0, RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR))
        except BaseException:
            sock.close()
            raise
        return sock

    def _dump(self, sock: socket.socket, kind: int) -> None:
        seq = next(self._seq)
        sock.send(dump_request(kind, seq))
        while True:
            data = sock.recv(RECV_BUFFER)
            done = False
            for msg_kind, _flags, msg_seq, msg in wire.split(data):
                if msg_seq == seq and msg_kind == NLMSG_DONE:
                    done = True
                elif msg_seq == seq and msg_kind == NLMSG_ERROR:
                    code = -struct.unpack_from("=i", msg, 16)[0]
                    raise OSError(code, f"rtnetlink dump: {errno.errorcode.get(code, code)}")
                else:  # the dump's answers and notifications, in the kernel's order
                    self._state.apply(msg_kind, msg)
            if done:
                return

    def _publish(self) -> None:
        """A new snapshot for the readers, only when a set changed (a pod's veth coming
        and going changes neither): O(the addresses) then, O(1) otherwise."""
        state = self._state
        if not state.changed:
            return
        state.changed = False
        host, node = state.host_addresses(), state.node_addresses()
        if host != self._host or node != self._node:
            self._host, self._node = host, node
            self.version += 1

    def poll(self, timeout: float) -> bool:
        """Read what came within `timeout`; whether the addresses changed. An overrun
        (ENOBUFS: notifications dropped) is answered with a fresh dump."""
        sock = self._sock
        if sock is None:
            self.open()
            return True
        before = self.version
        ready, _, _ = select.select([sock], [], [], timeout)
        if not ready:
            return False
        for _ in range(POLL_DATAGRAMS):  # a flood of changes cannot keep it from publishing
            try:
                data = sock.recv(RECV_BUFFER, socket.MSG_DONTWAIT)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno != errno.ENOBUFS:
                    raise
                log.info("node address notifications overran, reading them all again")
                self.open()
                return self.version != before
            for kind, _flags, _seq, msg in wire.split(data):
                self._state.apply(kind, msg)
        self._publish()
        return self.version != before

    def run(self, stop: threading.Event) -> None:
        """Follow the addresses until `stop`; a failure is logged once per streak, counted,
        and the socket opened again (RETRY_MIN doubling to RETRY_MAX)."""
        delay = RETRY_MIN
        while not stop.is_set():
            try:
                self.poll(POLL)
            except Exception as exc:  # never a dead thread: the addresses known stay
                self.on_error()
                self._failing.failed(
                    logging.ERROR,
                    "node addresses not followed, keeping the ones known",
                    error=exc,
                    retry_in=delay,
                )
                self.close()
                if stop.wait(delay):
                    break
                delay = min(delay * 2, RETRY_MAX)
                continue
            if self._failing.recovered("node addresses followed again"):
                delay = RETRY_MIN
        self.close()

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()

"""The real IPVSKernel: Linux IPVS over generic netlink with pyroute2, the only module of
ipvsctl that imports pyroute2.

Besides the IPVSKernel methods it owns what a node proxy does next to IPVS: the virtual IPs
on the dummy interface (`kube-ipvs0`), deleting conntrack entries of removed UDP/SCTP real
servers, the IPVS connection timeouts (a raw IPVS_CMD_SET_CONFIG message: pyroute2 has no
wrapper) and `configure_host()` for start-up. The sysctls themselves live in `host.py`.

pyroute2 traps handled here (NOTES §4, checked on a 6.1 kernel): "update" sends a DELETE,
so only add/set/del/get/dump are used; IPVSDest defaults to direct routing, we send NAT;
IPv6 services need a netmask of 128; a dest dump of a missing service is an empty list,
not an error; a sync pyroute2 object keeps its event loop and socket per thread, so this
class opens one socket per thread, lazily.

`netns=NAME` opens every socket inside /run/netns/NAME (pyroute2 forks a child that enters
the namespace, creates the socket and hands it back); the lab tests drive throwaway
network namespaces that way.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import os
import socket
import struct
import threading
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from pyroute2 import IPVS, IPRoute, IPVSDest, IPVSService, NetlinkError
from pyroute2.netlink import NLM_F_ACK, NLM_F_REQUEST, genlmsg
from pyroute2.netlink.generic import ipvs as genl_ipvs
from pyroute2.netlink.nfnetlink.nfctsocket import NFCTAttrTuple, NFCTSocket

from ipvsctl.kernel import host, procfs
from ipvsctl.kernel.port import (
    IPVSKernel,
    KernelError,
    KernelExists,
    KernelNotFound,
    KernelPermissionDenied,
    KernelTransient,
    KernelUnavailable,
)
from ipvsctl.kernel.proc_codec import ConnScan
from ipvsctl.model import (
    Protocol,
    RealServerKey,
    RealServerStatus,
    ServiceKey,
    VirtualServer,
    VirtualServerStatus,
)
from ipvsctl.model.ipvs import SCHED_FLAGS_MASK

log = logging.getLogger("ipvsctl.kernel")

DEFAULT_INTERFACE = "kube-ipvs0"

IPPROTO_SCTP = 132
PROTOCOL_NUMBERS: dict[Protocol, int] = {
    Protocol.TCP: socket.IPPROTO_TCP,
    Protocol.UDP: socket.IPPROTO_UDP,
    Protocol.SCTP: IPPROTO_SCTP,
}
_PROTOCOLS_BY_NUMBER = {n: p for p, n in PROTOCOL_NUMBERS.items()}

FWD_MASQ = 0  # IP_VS_CONN_F_MASQ: NAT. pyroute2's IPVSDest default is 3 (direct routing)
SVC_F_PERSISTENT = 0x1  # IP_VS_SVC_F_PERSISTENT
# The kernel reads IPVS_SVC_ATTR_NETMASK as a host-order u32; for IPv6 it is a prefix length
# and must be 1..128 (EINVAL otherwise). pyroute2 types it as an IPv4 address, so encode 128
# as the address whose bytes are 128 in host order ("128.0.0.0" on little-endian).
NETMASK_V4 = "255.255.255.255"
NETMASK_V6 = socket.inet_ntoa(struct.pack("=I", 128))

_EADDRNOTAVAIL = errno.EADDRNOTAVAIL


# --- errors ---------------------------------------------------------------------------------
def error_code(exc: BaseException) -> int | None:
    """The errno of a NetlinkError (`.code`) or OSError (`.errno`)."""
    if isinstance(exc, NetlinkError):
        return exc.code
    if isinstance(exc, OSError):
        return exc.errno
    return None


def translate_error(exc: BaseException, operation: str, subject: str = "") -> KernelError:
    """The KernelError for a failed netlink call: ENOENT/ESRCH -> KernelNotFound, EEXIST ->
    KernelExists, EPERM/EACCES -> KernelPermissionDenied, anything else -> KernelTransient."""
    code = error_code(exc)
    reason = os.strerror(code) if code else (str(exc) or type(exc).__name__)
    message = f"{operation} {subject}: {reason}" if subject else f"{operation}: {reason}"
    if code in (errno.ENOENT, errno.ESRCH):
        return KernelNotFound(message, operation)
    if code == errno.EEXIST:
        return KernelExists(message, operation)
    if code in (errno.EPERM, errno.EACCES):
        return KernelPermissionDenied(f"{message} (needs CAP_NET_ADMIN)", operation)
    return KernelTransient(message, operation)


@contextmanager
def _errors(operation: str, subject: object = "", scheduler: str | None = None) -> Iterator[None]:
    try:
        yield
    except KernelError:
        raise
    # RuntimeError: pyroute2 event loop; struct.error/OverflowError: a value that does not
    # fit its netlink field (parsing validates them; this keeps a miss to one Service).
    except (NetlinkError, OSError, RuntimeError, struct.error, OverflowError) as exc:
        err = translate_error(exc, operation, str(subject))
        if scheduler is not None and isinstance(err, KernelNotFound):
            # a new/changed service gets ENOENT only for an unknown scheduler
            err = KernelNotFound(
                f"{err} (scheduler {scheduler!r} not available: modprobe ip_vs_{scheduler})",
                operation,
            )
        raise err from exc


# --- message building and parsing (pure) ----------------------------------------------------
def _family(address: str) -> int:
    return socket.AF_INET6 if ":" in address else socket.AF_INET


def service_key_spec(key: ServiceKey) -> IPVSService:
    """The identity of a virtual server, for del/get and for dest commands."""
    v6 = key.family == 6
    return IPVSService(
        af=_family(key.address),
        protocol=PROTOCOL_NUMBERS[key.protocol],
        addr=key.address,
        port=key.port,
        netmask=NETMASK_V6 if v6 else NETMASK_V4,
    )


def service_spec(vs: VirtualServer) -> IPVSService:
    """A full virtual server for add/set. Only the persistent and scheduler flags are in the
    mask, so a set leaves any other flag (set by hand, e.g. one-packet scheduling) as it is."""
    spec = service_key_spec(vs.key)
    persistent = vs.persistent_timeout > 0
    spec["sched_name"] = vs.scheduler
    spec["flags"] = {
        "flags": (SVC_F_PERSISTENT if persistent else 0) | (vs.sched_flags & SCHED_FLAGS_MASK),
        "mask": SVC_F_PERSISTENT | SCHED_FLAGS_MASK,
    }
    spec["timeout"] = vs.persistent_timeout if persistent else 0
    return spec


def dest_spec(rs: RealServerKey, weight: int = 0) -> IPVSDest:
    return IPVSDest(addr=rs.address, port=rs.port, fwd_method=FWD_MASQ, weight=weight)


def virtual_server_from_message(m: Any) -> VirtualServer | None:
    """A VirtualServer from a service dump message; None for what ipvsctl never programs
    (fwmark services, other protocols)."""
    addr, port = m.get(("service", "addr")), m.get(("service", "port"))
    protocol = _PROTOCOLS_BY_NUMBER.get(m.get(("service", "protocol")) or 0)
    if addr is None or port is None or protocol is None:
        return None
    flags = (m.get(("service", "flags")) or {}).get("flags", 0)
    timeout = int(m.get(("service", "timeout")) or 0) if flags & SVC_F_PERSISTENT else 0
    return VirtualServer(
        key=ServiceKey(protocol, ipaddress.ip_address(addr).compressed, int(port)),
        scheduler=m.get(("service", "sched_name")) or "",
        persistent_timeout=timeout,
        sched_flags=flags & SCHED_FLAGS_MASK,
    )


def real_server_from_message(m: Any) -> RealServerStatus:
    return RealServerStatus(
        key=RealServerKey(
            ipaddress.ip_address(m.get(("dest", "addr"))).compressed,
            int(m.get(("dest", "port"))),
        ),
        weight=int(m.get(("dest", "weight")) or 0),
        active_conns=int(m.get(("dest", "active_conns")) or 0),
        inactive_conns=int(m.get(("dest", "inact_conns")) or 0),
    )


@dataclass(frozen=True, slots=True)
class IPVSTimeouts:
    """IPVS connection timeouts in seconds, as `ipvsadm --set` / kube-proxy's flags."""

    tcp: int
    tcpfin: int
    udp: int


class ipvs_config_msg(genlmsg):  # pyroute2 names message classes in lower case
    """IPVS_CMD_SET_CONFIG with u32 timeouts. A fresh genlmsg subclass: pyroute2's ipvsmsg
    types these attributes as raw hex, and a subclass of it would reuse its compiled table."""

    prefix = "IPVS_CMD_ATTR_"
    nla_map = (
        ("IPVS_CMD_ATTR_UNSPEC", "none"),
        ("IPVS_CMD_ATTR_SERVICE", "hex"),
        ("IPVS_CMD_ATTR_DEST", "hex"),
        ("IPVS_CMD_ATTR_DAEMON", "hex"),
        ("IPVS_CMD_ATTR_TIMEOUT_TCP", "uint32"),
        ("IPVS_CMD_ATTR_TIMEOUT_TCP_FIN", "uint32"),
        ("IPVS_CMD_ATTR_TIMEOUT_UDP", "uint32"),
    )


def timeouts_message(tcp: int = 0, tcpfin: int = 0, udp: int = 0) -> ipvs_config_msg | None:
    """The SET_CONFIG message for the non-zero timeouts (0 leaves the kernel's value, as the
    kernel itself does); None when there is nothing to set."""
    for name, value in (("tcp", tcp), ("tcpfin", tcpfin), ("udp", udp)):
        if value < 0:
            raise ValueError(f"IPVS {name} timeout must be >= 0, not {value}")
    attrs = [
        (nla, value)
        for nla, value in (
            ("IPVS_CMD_ATTR_TIMEOUT_TCP", tcp),
            ("IPVS_CMD_ATTR_TIMEOUT_TCP_FIN", tcpfin),
            ("IPVS_CMD_ATTR_TIMEOUT_UDP", udp),
        )
        if value > 0
    ]
    if not attrs:
        return None
    msg = ipvs_config_msg()
    msg["cmd"] = genl_ipvs.IPVS_CMD_SET_CONFIG
    msg["version"] = genl_ipvs.GENL_VERSION
    msg["attrs"] = attrs
    return msg


def decode_u32(value: Any) -> int:
    """A u32 attribute as pyroute2's ipvsmsg decodes it ("hex": "84:03:00:00"), or an int."""
    if isinstance(value, int):
        return value
    raw = bytes.fromhex(str(value).replace(":", ""))
    return int(struct.unpack("=I", raw[:4])[0])


def timeouts_from_message(m: Any) -> IPVSTimeouts:
    return IPVSTimeouts(
        tcp=decode_u32(m.get_attr("IPVS_CMD_ATTR_TIMEOUT_TCP") or 0),
        tcpfin=decode_u32(m.get_attr("IPVS_CMD_ATTR_TIMEOUT_TCP_FIN") or 0),
        udp=decode_u32(m.get_attr("IPVS_CMD_ATTR_TIMEOUT_UDP") or 0),
    )


@dataclass(frozen=True, slots=True)
class ConntrackTuple:
    """One direction of a conntrack entry."""

    protocol: int
    src: str
    dst: str
    sport: int | None
    dport: int | None


def conntrack_tuple(nla: Any) -> ConntrackTuple | None:
    """A CTA_TUPLE_ORIG/REPLY attribute as plain values (ports for any protocol, SCTP
    included, which pyroute2's own NFCTAttrTuple leaves out)."""
    if nla is None:
        return None
    ip, proto = nla.get_attr("CTA_TUPLE_IP"), nla.get_attr("CTA_TUPLE_PROTO")
    if ip is None or proto is None:
        return None
    src = ip.get_attr("CTA_IP_V4_SRC") or ip.get_attr("CTA_IP_V6_SRC")
    dst = ip.get_attr("CTA_IP_V4_DST") or ip.get_attr("CTA_IP_V6_DST")
    if src is None or dst is None:
        return None
    return ConntrackTuple(
        protocol=int(proto.get_attr("CTA_PROTO_NUM") or 0),
        src=ipaddress.ip_address(src).compressed,
        dst=ipaddress.ip_address(dst).compressed,
        sport=proto.get_attr("CTA_PROTO_SRC_PORT"),
        dport=proto.get_attr("CTA_PROTO_DST_PORT"),
    )


def conntrack_matches(
    orig: ConntrackTuple, reply: ConntrackTuple, key: ServiceKey, rs: RealServerKey
) -> bool:
    """kube-proxy's filter for a removed endpoint: sent to the virtual server (original
    destination) and answered by the real server (reply source)."""
    return (
        orig.protocol == PROTOCOL_NUMBERS[key.protocol]
        and orig.dst == key.address
        and orig.dport == key.port
        and reply.src == rs.address
        and reply.sport == rs.port
    )


# --- the kernel -----------------------------------------------------------------------------
class NetlinkKernel:
    """IPVSKernel on the running kernel (or in network namespace `netns`).

    The constructor checks that IPVS is there and usable: KernelUnavailable without IPVS
    (or without the named netns), KernelPermissionDenied without CAP_NET_ADMIN. With
    create_interface (the daemon), the dummy interface is created if missing; it is left
    down, as kube-proxy leaves kube-ipvs0: its addresses are still local addresses.

    Any thread may call it: each calling thread gets its own netlink sockets on first use,
    kept until close(). Call it from a few long-lived threads, not from one thread per
    request.
    """

    def __init__(
        self,
        interface: str = DEFAULT_INTERFACE,
        *,
        netns: str | None = None,
        create_interface: bool = True,
    ) -> None:
        self.interface = interface
        self.netns = netns
        self._local = threading.local()
        self._opened: list[Any] = []
        self._opened_lock = threading.Lock()
        self._ifindex: int | None = None
        # address -> keys of the kernel's virtual servers on it; see address_in_use()
        self._by_address: dict[str, set[ServiceKey]] | None = None
        self._index_lock = threading.Lock()
        if netns is not None and not os.path.exists(host.netns_path(netns)):
            raise KernelUnavailable(f"network namespace {netns} not found", "open")
        self._ipvs()  # fail now, with a clear message, rather than at the first sync
        if create_interface:
            self.ensure_interface()

    # --- sockets ------------------------------------------------------------------------
    def _socket_kwargs(self) -> dict[str, Any]:
        # flags=0: never create the namespace (pyroute2's default is O_CREAT)
        return {"netns": self.netns, "flags": 0} if self.netns else {}

    def _remember(self, sock: Any) -> Any:
        with self._opened_lock:
            self._opened.append(sock)
        return sock

    def _ipvs(self) -> IPVS:
        sock = getattr(self._local, "ipvs", None)
        if sock is None:
            sock = self._local.ipvs = self._remember(self._open_ipvs())
        return sock

    def _open_ipvs(self) -> IPVS:
        try:
            sock = IPVS(**self._socket_kwargs())
        except NetlinkError as exc:
            if exc.code == errno.ENOENT:  # generic netlink has no "IPVS" family
                raise KernelUnavailable(
                    "IPVS is not available in this kernel: load it with `modprobe ip_vs` "
                    "(and the schedulers, e.g. ip_vs_rr) on the host",
                    "open",
                ) from exc
            raise translate_error(exc, "open", "IPVS") from exc
        except OSError as exc:
            raise translate_error(exc, "open", "IPVS") from exc
        try:
            # every IPVS command needs CAP_NET_ADMIN; GET_CONFIG is the cheapest to try
            self._read_timeouts(sock)
        except NetlinkError as exc:
            sock.close()
            if exc.code in (errno.EPERM, errno.EACCES):
                raise KernelPermissionDenied(
                    "IPVS needs CAP_NET_ADMIN: run as root or with the NET_ADMIN capability",
                    "open",
                ) from exc
            raise translate_error(exc, "open", "IPVS") from exc
        return sock

    def _iproute(self) -> IPRoute:
        ipr = getattr(self._local, "iproute", None)
        if ipr is None:
            with _errors("open", "rtnetlink"):
                ipr = self._local.iproute = self._remember(IPRoute(**self._socket_kwargs()))
        return ipr

    def close(self) -> None:
        with self._opened_lock:
            opened, self._opened = self._opened, []
        for sock in opened:
            try:
                sock.close()
            except Exception:  # closing must not raise
                log.debug("close failed", exc_info=True)
        self._local = threading.local()

    def __enter__(self) -> NetlinkKernel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- IPVSKernel -----------------------------------------------------------------------
    def list_virtual_servers(self) -> list[VirtualServer]:
        with _errors("list_virtual_servers"):
            messages = self._ipvs().service("dump")
        found = (virtual_server_from_message(m) for m in messages)
        table = sorted((vs for vs in found if vs is not None), key=lambda vs: vs.key)
        by_address: dict[str, set[ServiceKey]] = {}
        for vs in table:
            by_address.setdefault(vs.key.address, set()).add(vs.key)
        with self._index_lock:
            self._by_address = by_address  # every full dump refreshes the index
        return table

    def list_real_servers(self, key: ServiceKey) -> list[RealServerStatus]:
        ipvs = self._ipvs()
        with _errors("list_real_servers", key):
            messages = ipvs.dest("dump", service=service_key_spec(key))
            if not messages:  # the kernel answers an empty dump for a missing service too
                ipvs.service("get", service=service_key_spec(key))  # ESRCH if missing
        return sorted((real_server_from_message(m) for m in messages), key=lambda r: r.key)

    def add_virtual_server(self, vs: VirtualServer, bind_address: bool) -> None:
        # address first (as kube-proxy): the virtual server answers as soon as it exists
        if bind_address:
            self.bind_address(vs.key.address)
        try:
            with _errors("add_virtual_server", vs.key, scheduler=vs.scheduler):
                self._ipvs().service("add", service=service_spec(vs))
        except KernelExists:
            self._indexed(vs.key, True)
            raise
        except KernelError:
            if bind_address:
                self._unbind_if_unused_quietly(vs.key.address)
            raise
        self._indexed(vs.key, True)

    def update_virtual_server(self, vs: VirtualServer) -> None:
        with _errors("update_virtual_server", vs.key, scheduler=vs.scheduler):
            self._ipvs().service("set", service=service_spec(vs))

    def delete_virtual_server(self, key: ServiceKey, bind_address: bool) -> None:
        try:
            with _errors("delete_virtual_server", key):
                self._ipvs().service("del", service=service_key_spec(key))
        except KernelNotFound:
            self._indexed(key, False)
            # already gone: still drop an address nothing uses any more (after a restart)
            if bind_address:
                self.unbind_address_if_unused(key.address)
            raise
        self._indexed(key, False)
        if bind_address:
            self.unbind_address_if_unused(key.address)

    def add_real_server(self, key: ServiceKey, rs: RealServerKey, weight: int) -> None:
        with _errors("add_real_server", f"{key} -> {rs}"):
            self._ipvs().dest("add", service=service_key_spec(key), dest=dest_spec(rs, weight))

    def set_real_server_weight(self, key: ServiceKey, rs: RealServerKey, weight: int) -> None:
        with _errors("set_real_server_weight", f"{key} -> {rs}"):
            self._ipvs().dest("set", service=service_key_spec(key), dest=dest_spec(rs, weight))

    def delete_real_server(self, key: ServiceKey, rs: RealServerKey) -> None:
        with _errors("delete_real_server", f"{key} -> {rs}"):
            self._ipvs().dest("del", service=service_key_spec(key), dest=dest_spec(rs))

    def flush_conntrack(self, key: ServiceKey, rs: RealServerKey) -> None:
        """Delete the conntrack entries sent to the virtual server and answered by this real
        server. Nothing to do (and no error) when conntrack is not in use."""
        deleted = self._delete_conntrack(key, rs)
        log.debug("conntrack entries deleted", extra={"vs": str(key), "rs": str(rs),
                                                      "deleted": deleted})

    def read_real_servers(
        self, keys: Collection[ServiceKey]
    ) -> dict[ServiceKey, list[RealServerStatus] | None]:
        scan = procfs.read_table(keys, netns=self.netns)
        return {k: scan.real_servers.get(k) for k in keys if k not in scan.unreadable}

    def read_connections(self, pairs: Collection[tuple[ServiceKey, RealServerKey]]) -> ConnScan:
        return procfs.read_connections(pairs, netns=self.netns)

    # --- more than IPVSKernel -------------------------------------------------------------
    def read_table(self) -> list[VirtualServerStatus]:
        """Every virtual server with its real servers (what `ipvsadm -Ln` shows)."""
        table = []
        for vs in self.list_virtual_servers():
            try:
                real_servers = tuple(self.list_real_servers(vs.key))
            except KernelNotFound:  # deleted between the two dumps
                continue
            table.append(VirtualServerStatus(vs, real_servers))
        return table

    def dump(self) -> str:
        """The table in FakeKernel.dump()'s format, so lab tests can compare the two."""
        lines = []
        for vss in self.read_table():
            lines.append(str(vss.vs))
            for r in vss.real_servers:
                lines.append(
                    f"  -> {r.key} weight {r.weight} active {r.active_conns} "
                    f"inactive {r.inactive_conns}"
                )
        return "\n".join(lines) + ("\n" if lines else "")

    def get_timeouts(self) -> IPVSTimeouts:
        with _errors("get_timeouts"):
            return self._read_timeouts(self._ipvs())

    def set_timeouts(self, tcp: int = 0, tcpfin: int = 0, udp: int = 0) -> None:
        """Set the IPVS connection timeouts in seconds; 0 leaves that one as it is."""
        msg = timeouts_message(tcp, tcpfin, udp)
        if msg is None:
            return
        ipvs = self._ipvs()
        with _errors("set_timeouts"):
            list(ipvs.nlm_request(msg, msg_type=ipvs.prid, msg_flags=NLM_F_REQUEST | NLM_F_ACK))

    @staticmethod
    def _read_timeouts(ipvs: IPVS) -> IPVSTimeouts:
        msg = genl_ipvs.ipvsmsg()
        msg["cmd"] = genl_ipvs.IPVS_CMD_GET_CONFIG
        msg["version"] = genl_ipvs.GENL_VERSION
        replies = list(ipvs.nlm_request(msg, msg_type=ipvs.prid, msg_flags=NLM_F_REQUEST))
        return timeouts_from_message(replies[0])

    # dummy interface and its addresses
    def ensure_interface(self) -> int:
        """The dummy interface's index, creating the interface if it is missing."""
        ipr = self._iproute()
        with _errors("ensure_interface", self.interface):
            found = ipr.link_lookup(ifname=self.interface)
            if not found:
                try:
                    ipr.link("add", ifname=self.interface, kind="dummy")
                except NetlinkError as exc:
                    if exc.code != errno.EEXIST:  # EEXIST: someone else just created it
                        raise
                found = ipr.link_lookup(ifname=self.interface)
        if not found:
            raise KernelTransient(f"interface {self.interface} vanished", "ensure_interface")
        self._ifindex = int(found[0])
        return self._ifindex

    def _with_interface(self, operation: str, fn: Any) -> Any:
        """fn(ifindex), looking the interface up again once if it was deleted under us."""
        for attempt in (1, 2):
            index = self._ifindex if self._ifindex is not None else self.ensure_interface()
            try:
                with _errors(operation, self.interface):
                    return fn(index)
            except KernelError as exc:
                if attempt == 2 or error_code(exc.__cause__ or exc) != errno.ENODEV:
                    raise
                self._ifindex = None
        raise AssertionError("unreachable")

    def bound_addresses(self) -> list[str]:
        """The addresses on the dummy interface (compressed form, sorted): the daemon owns
        the virtual servers on these."""
        ipr = self._iproute()

        def read(index: int) -> list[str]:
            return sorted({
                ipaddress.ip_address(a.get("IFA_ADDRESS")).compressed
                for a in ipr.get_addr(index=index)
                if a.get("IFA_ADDRESS")
            })

        return self._with_interface("bound_addresses", read)

    def bind_address(self, address: str) -> None:
        """Put address/32 (/128) on the dummy interface; nothing if it is there already."""
        ipr = self._iproute()

        def add(index: int) -> None:
            try:
                ipr.addr("add", index=index, address=address, prefixlen=_prefixlen(address))
            except NetlinkError as exc:
                if exc.code != errno.EEXIST:
                    raise

        self._with_interface("bind_address", add)

    def unbind_address(self, address: str) -> None:
        """Remove address from the dummy interface; nothing if it is not there."""
        ipr = self._iproute()

        def delete(index: int) -> None:
            try:
                ipr.addr("del", index=index, address=address, prefixlen=_prefixlen(address))
            except NetlinkError as exc:
                if exc.code not in (_EADDRNOTAVAIL, errno.ENOENT):
                    raise

        self._with_interface("unbind_address", delete)

    def address_in_use(self, address: str) -> bool:
        """Whether any virtual server in the kernel (any protocol or port) has this address.

        Answered from an index of the kernel's virtual servers by address, not from a
        count of our own: it is read from the kernel at first use and on every full dump
        (the drift audit makes one each round, so changes made by other tools are seen),
        and kept up to date by this object's own adds and deletes in between. A dump per
        question made every virtual server deletion cost O(the whole table)."""
        wanted = ipaddress.ip_address(address).compressed
        with self._index_lock:
            index = self._by_address
        if index is None:
            self.list_virtual_servers()
            with self._index_lock:
                index = self._by_address or {}
        with self._index_lock:
            return bool(index.get(wanted))

    def _indexed(self, key: ServiceKey, present: bool) -> None:
        """Record in the address index that `key` now is (or is not) in the kernel."""
        address = ipaddress.ip_address(key.address).compressed  # as dumps spell it
        key = ServiceKey(key.protocol, address, key.port)
        with self._index_lock:
            if self._by_address is None:
                return  # not read yet: the first read sees the kernel as it is
            keys = self._by_address.setdefault(address, set())
            if present:
                keys.add(key)
            else:
                keys.discard(key)
                if not keys:
                    del self._by_address[address]

    def unbind_address_if_unused(self, address: str) -> bool:
        """Remove address from the dummy interface unless a virtual server still uses it;
        True if it was removed (or was not there)."""
        if self.address_in_use(address):
            return False
        self.unbind_address(address)
        return True

    def _unbind_if_unused_quietly(self, address: str) -> None:
        try:
            self.unbind_address_if_unused(address)
        except KernelError:  # a rollback: the original error matters more
            log.debug("address rollback failed", exc_info=True)

    # conntrack
    def conntrack_entries(
        self, key: ServiceKey, rs: RealServerKey
    ) -> list[tuple[ConntrackTuple, ConntrackTuple]]:
        """(original, reply) of the conntrack entries flush_conntrack would delete."""
        with self._conntrack(key) as ct:
            return self._matching_conntrack(ct, key, rs)

    def _delete_conntrack(self, key: ServiceKey, rs: RealServerKey) -> int:
        deleted = 0
        with self._conntrack(key) as ct:
            # collect first: a call on a pyroute2 socket ends its running dump's event loop
            for orig, _reply in self._matching_conntrack(ct, key, rs):
                target = NFCTAttrTuple(
                    family=_family(key.address), saddr=orig.src, daddr=orig.dst,
                    proto=orig.protocol, sport=orig.sport, dport=orig.dport,
                )
                try:
                    with _errors("flush_conntrack", f"{key} -> {rs}"):
                        ct.entry("del", tuple_orig=target)
                    deleted += 1
                except KernelNotFound:  # expired meanwhile
                    pass
        return deleted

    @contextmanager
    def _conntrack(self, key: ServiceKey) -> Iterator[NFCTSocket]:
        # one short-lived socket per call: flushes are rare (UDP/SCTP real server removal)
        with _errors("flush_conntrack", key):
            ct = NFCTSocket(nfgen_family=_family(key.address), **self._socket_kwargs())
        try:
            yield ct
        finally:
            ct.close()

    @staticmethod
    def _matching_conntrack(
        ct: NFCTSocket, key: ServiceKey, rs: RealServerKey
    ) -> list[tuple[ConntrackTuple, ConntrackTuple]]:
        family = _family(key.address)
        proto = PROTOCOL_NUMBERS[key.protocol]
        with _errors("flush_conntrack", f"{key} -> {rs}"):
            # protocol and port filtered in the kernel (CTA_FILTER, Linux >= 5.8), addresses
            # here: on 6.1 a filter on an IPv6 address matches nothing
            try:
                messages = list(ct.dump(tuple_orig=NFCTAttrTuple(
                    family=family, proto=proto, dport=key.port)))
            except NetlinkError as exc:
                if exc.code not in (errno.EOPNOTSUPP, errno.EINVAL):
                    raise
                messages = list(ct.dump())
        found = []
        for m in messages:
            orig = conntrack_tuple(m.get_attr("CTA_TUPLE_ORIG"))
            reply = conntrack_tuple(m.get_attr("CTA_TUPLE_REPLY"))
            if orig and reply and conntrack_matches(orig, reply, key, rs):
                found.append((orig, reply))
        return found


def _prefixlen(address: str) -> int:
    return 128 if ":" in address else 32


# --- start-up and CLI helpers ---------------------------------------------------------------
def configure_host(
    tcp_timeout: int = 0,
    tcpfin_timeout: int = 0,
    udp_timeout: int = 0,
    *,
    kernel: NetlinkKernel | None = None,
    netns: str | None = None,
) -> dict[str, str]:
    """Start-up host set-up: the IPVS sysctls (host.wanted_sysctls) and the IPVS timeouts
    (0 leaves one as it is). Returns what changed, for the start-up log line."""
    changed = host.apply_sysctls(netns=kernel.netns if kernel else netns)
    if tcp_timeout or tcpfin_timeout or udp_timeout:
        own = kernel is None
        k = kernel or NetlinkKernel(netns=netns, create_interface=False)
        try:
            before = k.get_timeouts()
            k.set_timeouts(tcp_timeout, tcpfin_timeout, udp_timeout)
            after = k.get_timeouts()
        finally:
            if own:
                k.close()
        for name in ("tcp", "tcpfin", "udp"):
            if getattr(before, name) != getattr(after, name):
                changed[f"ipvs.timeout.{name}"] = str(getattr(after, name))
    return changed


def read_table(netns: str | None = None) -> list[VirtualServerStatus]:
    """The whole IPVS table, for `ipvsctl status`; touches nothing (no interface)."""
    with NetlinkKernel(netns=netns, create_interface=False) as kernel:
        return kernel.read_table()


_: type[IPVSKernel] = NetlinkKernel  # NetlinkKernel satisfies the interface

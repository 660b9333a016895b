"""The conntrack table over netlink (the ConntrackTable port): list one protocol and family,
delete entries by their original tuple. The one conntrack adapter: the stale-entry sweep
(reconcile/conntrack_sweeper.py) uses it as it is, and NetlinkKernel.flush_conntrack (a
removed UDP/SCTP real server, as kube-proxy's pkg/proxy/conntrack) lists and deletes with
it, the entries chosen by plan/conntrack.py's rule.

A dump is filtered by protocol in the kernel, and by the original destination port when
one is given (CTA_FILTER, Linux >= 5.8; older kernels reject the filter and get an
unfiltered dump, filtered here). Addresses are never filtered in the kernel: a filter holds
one tuple, a sweep looks at every Service address at once, and on 6.1 a filter on an IPv6
address matches nothing. Deletions go one request per entry, by its original tuple, on a
socket of their own once the dump is fully read (a call on a pyroute2 socket ends its
running dump).

A short-lived NFCTSocket per call, opened where the IPVS sockets are (`netns`, never
created): flushes and sweeps are rare, and nothing here shares a socket with the loop.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from typing import Any

from pyroute2 import NetlinkError
from pyroute2.netlink.nfnetlink.nfctsocket import NFCTAttrTuple, NFCTSocket

from ipvsctl.kernel.netlink.errors import error_code, translate_error
from ipvsctl.kernel.port import ConntrackTable, KernelError, KernelUnavailable
from ipvsctl.model import Protocol, normalize_ip
from ipvsctl.model.conntrack import ConntrackEntry

log = logging.getLogger("ipvsctl.kernel")

# No ctnetlink (nf_conntrack_netlink not loaded, no netfilter netlink at all).
_UNAVAILABLE = (errno.ENOENT, errno.EOPNOTSUPP, errno.EPROTONOSUPPORT, errno.EAFNOSUPPORT)
_FAILURES = (NetlinkError, OSError, RuntimeError)

SocketFactory = Callable[[int], Any]  # nfgen_family -> an NFCTSocket-like object


def _error(exc: BaseException, operation: str) -> KernelError:
    """errors.translate_error, except that a missing ctnetlink is KernelUnavailable (a node
    without conntrack: nothing to list or delete), not KernelNotFound."""
    code = error_code(exc)
    if code in _UNAVAILABLE:
        reason = os.strerror(code) if code else str(exc)
        return KernelUnavailable(
            f"{operation}: {reason} (is nf_conntrack_netlink loaded?)", operation
        )
    return translate_error(exc, operation)


def _attrs(nla: Any) -> dict[str, Any]:
    # one pass over the attribute list (get_attr() walks it again for every name; the
    # decoding of a dump is a sweep's main cost), keeping pyroute2's lazily decoded
    # slots: only the attributes read below get decoded
    return {a[0]: a for a in nla["attrs"]} if nla is not None else {}


def _value(attrs: dict[str, Any], *names: str) -> Any:
    for name in names:
        slot = attrs.get(name)
        if slot is not None:
            return slot[1]
    return None


def entry_from_message(m: Any) -> ConntrackEntry | None:
    """A dumped IPCTNL_MSG_CT_NEW as a ConntrackEntry; None for what ipvsctl never names
    (a protocol it does not serve, a tuple without addresses or ports)."""
    top = _attrs(m)
    orig = _attrs(_value(top, "CTA_TUPLE_ORIG"))
    reply = _attrs(_value(top, "CTA_TUPLE_REPLY"))
    o_ip = _attrs(_value(orig, "CTA_TUPLE_IP"))
    o_proto = _attrs(_value(orig, "CTA_TUPLE_PROTO"))
    r_ip = _attrs(_value(reply, "CTA_TUPLE_IP"))
    r_proto = _attrs(_value(reply, "CTA_TUPLE_PROTO"))
    protocol = Protocol.from_number(int(_value(o_proto, "CTA_PROTO_NUM") or 0))
    src = _value(o_ip, "CTA_IP_V4_SRC", "CTA_IP_V6_SRC")
    dst = _value(o_ip, "CTA_IP_V4_DST", "CTA_IP_V6_DST")
    reply_src = _value(r_ip, "CTA_IP_V4_SRC", "CTA_IP_V6_SRC")
    sport = _value(o_proto, "CTA_PROTO_SRC_PORT")
    dport = _value(o_proto, "CTA_PROTO_DST_PORT")
    reply_sport = _value(r_proto, "CTA_PROTO_SRC_PORT")
    if protocol is None or None in (src, dst, reply_src, sport, dport, reply_sport):
        return None
    try:
        return ConntrackEntry(
            protocol=protocol,
            orig_src=normalize_ip(src),
            orig_sport=int(sport),
            orig_dst=normalize_ip(dst),
            orig_dport=int(dport),
            reply_src=normalize_ip(reply_src),
            reply_sport=int(reply_sport),
        )
    except ValueError:  # not an address: not an entry ipvsctl could match
        return None


def _family(ipv6: bool) -> int:
    return socket.AF_INET6 if ipv6 else socket.AF_INET


class NetlinkConntrack:
    """ConntrackTable on the running kernel (or in network namespace `netns`)."""

    def __init__(
        self, netns: str | None = None, socket_factory: SocketFactory | None = None
    ) -> None:
        self.netns = netns
        self._factory = socket_factory or self._open

    def _open(self, family: int) -> Any:
        kwargs: dict[str, Any] = {"netns": self.netns, "flags": 0} if self.netns else {}
        return NFCTSocket(nfgen_family=family, **kwargs)

    @contextmanager
    def _socket(self, family: int, operation: str) -> Iterator[Any]:
        try:
            ct = self._factory(family)
        except _FAILURES as exc:
            raise _error(exc, operation) from exc
        try:
            yield ct
        finally:
            try:
                ct.close()
            except Exception:  # closing must not raise
                log.debug("conntrack socket close failed", exc_info=True)

    def list_conntrack(
        self, protocol: Protocol, ipv6: bool, port: int | None = None
    ) -> list[ConntrackEntry]:
        family, number = _family(ipv6), protocol.number
        with self._socket(family, "list_conntrack") as ct:
            try:
                try:
                    messages = list(
                        ct.dump(tuple_orig=NFCTAttrTuple(family=family, proto=number, dport=port))
                    )
                except NetlinkError as exc:
                    if exc.code not in (errno.EOPNOTSUPP, errno.EINVAL):
                        raise
                    messages = list(ct.dump())  # a kernel without CTA_FILTER
            except _FAILURES as exc:
                raise _error(exc, "list_conntrack") from exc
        found = (entry_from_message(m) for m in messages)
        return [
            e
            for e in found
            if e is not None and e.protocol == protocol and (port is None or e.orig_dport == port)
        ]

    def delete_conntrack(self, entries: Collection[ConntrackEntry]) -> int:
        deleted = 0
        for ipv6 in (False, True):
            batch = [e for e in entries if e.ipv6 == ipv6]
            if not batch:
                continue
            family = _family(ipv6)
            with self._socket(family, "delete_conntrack") as ct:
                for e in batch:
                    target = NFCTAttrTuple(
                        family=family,
                        saddr=e.orig_src,
                        daddr=e.orig_dst,
                        proto=e.protocol.number,
                        sport=e.orig_sport,
                        dport=e.orig_dport,
                    )
                    try:
                        ct.entry("del", tuple_orig=target)
                        deleted += 1
                    except NetlinkError as exc:
                        if exc.code == errno.ENOENT:  # expired meanwhile
                            continue
                        raise _error(exc, "delete_conntrack") from exc
                    except (OSError, RuntimeError) as exc:
                        raise _error(exc, "delete_conntrack") from exc
        return deleted


_: type[ConntrackTable] = NetlinkConntrack  # NetlinkConntrack satisfies the interface

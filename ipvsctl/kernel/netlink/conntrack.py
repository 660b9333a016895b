"""Conntrack for removed UDP/SCTP real servers: delete the entries sent to the virtual
server and answered by that real server, as kube-proxy's pkg/proxy/conntrack does, so
clients move to a live backend. The filter is pure (`conntrack_matches`); the socket is one
short-lived pyroute2 NFCTSocket per call (flushes are rare)."""

from __future__ import annotations

import errno
import ipaddress
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from pyroute2 import NetlinkError
from pyroute2.netlink.nfnetlink.nfctsocket import NFCTAttrTuple, NFCTSocket

from ipvsctl.kernel.netlink.codec import PROTOCOL_NUMBERS, family_of
from ipvsctl.kernel.netlink.errors import errors
from ipvsctl.kernel.port import KernelNotFound
from ipvsctl.model import RealServerKey, ServiceKey
from ipvsctl.obs.logging import fields

log = logging.getLogger("ipvsctl.kernel")


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


class Conntrack:
    """The conntrack entries of (virtual server, real server) pairs; `socket_kwargs` opens
    each socket where the IPVS ones are (netns)."""

    def __init__(self, socket_kwargs: dict[str, Any]) -> None:
        self.socket_kwargs = socket_kwargs

    def entries(
        self, key: ServiceKey, rs: RealServerKey
    ) -> list[tuple[ConntrackTuple, ConntrackTuple]]:
        """(original, reply) of the conntrack entries flush() would delete."""
        with self._socket(key) as ct:
            return self._matching(ct, key, rs)

    def flush(self, key: ServiceKey, rs: RealServerKey) -> int:
        """Delete the matching entries; how many were deleted. Nothing to do (and no
        error) when conntrack is not in use."""
        deleted = 0
        with self._socket(key) as ct:
            # collect first: a call on a pyroute2 socket ends its running dump's event loop
            for orig, _reply in self._matching(ct, key, rs):
                target = NFCTAttrTuple(
                    family=family_of(key.address), saddr=orig.src, daddr=orig.dst,
                    proto=orig.protocol, sport=orig.sport, dport=orig.dport,
                )
                try:
                    with errors("flush_conntrack", f"{key} -> {rs}"):
                        ct.entry("del", tuple_orig=target)
                    deleted += 1
                except KernelNotFound:  # expired meanwhile
                    pass
        log.debug("conntrack entries deleted", extra=fields(vs=key, rs=rs, deleted=deleted))
        return deleted

    @contextmanager
    def _socket(self, key: ServiceKey) -> Iterator[NFCTSocket]:
        with errors("flush_conntrack", key):
            ct = NFCTSocket(nfgen_family=family_of(key.address), **self.socket_kwargs)
        try:
            yield ct
        finally:
            ct.close()

    @staticmethod
    def _matching(
        ct: NFCTSocket, key: ServiceKey, rs: RealServerKey
    ) -> list[tuple[ConntrackTuple, ConntrackTuple]]:
        family = family_of(key.address)
        proto = PROTOCOL_NUMBERS[key.protocol]
        with errors("flush_conntrack", f"{key} -> {rs}"):
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

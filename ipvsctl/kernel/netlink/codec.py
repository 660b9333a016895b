"""IPVS generic netlink messages as pyroute2 builds and parses them (pure: no sockets).

The specs here are what ipvsctl asks of IPVS, in pyroute2's request objects, and the
readers what pyroute2's decoding of a dump gives: the reference that `wire.py`, which packs
and parses the same messages by hand (the only path ipvsctl sends them on), is held to
byte for byte by unit tests. The timeouts' SET_CONFIG message is built here and sent
through pyroute2.

pyroute2 traps handled here (NOTES §4, checked on a 6.1 kernel): "update" sends a DELETE,
so only add/set/del/get/dump are used; IPVSDest defaults to direct routing, we send NAT;
IPv6 services need a netmask of 128.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
from dataclasses import dataclass
from typing import Any

from pyroute2 import IPVSDest, IPVSService
from pyroute2.netlink import genlmsg
from pyroute2.netlink.generic import ipvs as genl_ipvs

from ipvsctl.model import (
    Protocol,
    RealServerKey,
    RealServerStatus,
    ServiceKey,
    ServiceStats,
    VirtualServer,
)
from ipvsctl.model.ipvs import SCHED_FLAGS_MASK

FWD_MASQ = 0  # IP_VS_CONN_F_MASQ: NAT. pyroute2's IPVSDest default is 3 (direct routing)
SVC_F_PERSISTENT = 0x1  # IP_VS_SVC_F_PERSISTENT
# The kernel reads IPVS_SVC_ATTR_NETMASK as a host-order u32; for IPv6 it is a prefix length
# and must be 1..128 (EINVAL otherwise). pyroute2 types it as an IPv4 address, so encode 128
# as the address whose bytes are 128 in host order ("128.0.0.0" on little-endian).
NETMASK_V4 = "255.255.255.255"
NETMASK_V6 = socket.inet_ntoa(struct.pack("=I", 128))


def family_of(address: str) -> int:
    """AF_INET6 for an IPv6 address, AF_INET otherwise."""
    return socket.AF_INET6 if ":" in address else socket.AF_INET


def service_key_spec(key: ServiceKey) -> IPVSService:
    """The identity of a virtual server, for del/get and for dest commands."""
    v6 = key.family == 6
    return IPVSService(
        af=family_of(key.address),
        protocol=key.protocol.number,
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
    protocol = Protocol.from_number(m.get(("service", "protocol")) or 0)
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


def service_stats_from_message(m: Any) -> ServiceStats:
    """A service dump message's counters as pyroute2 decodes them (STATS64, else STATS)."""
    svc = m.get_attr("IPVS_CMD_ATTR_SERVICE")
    nested = svc.get_attr("IPVS_SVC_ATTR_STATS64") or svc.get_attr("IPVS_SVC_ATTR_STATS")
    if nested is None:
        return ServiceStats()

    def read(name: str) -> int:
        return int(nested.get_attr(f"IPVS_STATS_ATTR_{name}") or 0)

    return ServiceStats(
        read("CONNS"), read("INPKTS"), read("OUTPKTS"), read("INBYTES"), read("OUTBYTES")
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

"""Identities: IPVS virtual/real server keys and Kubernetes object references."""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from enum import StrEnum
from typing import Self


class Protocol(StrEnum):
    TCP = "TCP"
    UDP = "UDP"
    SCTP = "SCTP"

    @property
    def connectionless(self) -> bool:
        """UDP and SCTP real servers are deleted at once instead of drained (as kube-proxy)."""
        return self is not Protocol.TCP

    @property
    def number(self) -> int:
        """The IP protocol number (IPPROTO_*), as netlink carries it."""
        return PROTOCOL_NUMBERS[self]

    @staticmethod
    def from_number(number: int) -> Protocol | None:
        """The protocol of an IP protocol number; None: not one a Service uses."""
        return _BY_NUMBER.get(number)


PROTOCOL_NUMBERS: dict[Protocol, int] = {Protocol.TCP: 6, Protocol.UDP: 17, Protocol.SCTP: 132}
_BY_NUMBER = {n: p for p, n in PROTOCOL_NUMBERS.items()}


def normalize_ip(text: str) -> str:
    """The compressed form of an IPv4/IPv6 address; ValueError if it is not one.

    inet_pton/ntop in C: ten times faster than `ipaddress`, which matters at 100,000
    endpoints; `ipaddress` stays the judge of what is valid. An IPv6 zone id (`fe80::1%eth0`)
    is refused: IPVS and nftables have no use for one, and nft rejects the whole batch."""
    text = text.strip()
    if "%" in text:
        raise ValueError(f"{text!r}: an address with a zone id")
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            out = socket.inet_ntop(family, socket.inet_pton(family, text))
        except OSError:
            continue
        if out == text and type(text) is str:
            # The caller's string, not an equal copy: the raw object it came from is still
            # alive while a list is parsed (100,000 addresses, ~6 MB at the list's peak).
            return text
        if family == socket.AF_INET:
            break  # leading zeros and the like: let ipaddress decide
        return out
    return ipaddress.ip_address(text).compressed


def family_of(address: str) -> int:
    """4 or 6."""
    return 6 if ":" in address else 4


def _hostport(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


@dataclass(frozen=True, slots=True, order=True)
class ServiceKey:
    """An IPVS virtual server: protocol, address, port. Orders as the plan JSON is sorted."""

    protocol: Protocol
    address: str
    port: int

    @property
    def family(self) -> int:
        return family_of(self.address)

    def __str__(self) -> str:
        return f"{_hostport(self.address, self.port)}/{self.protocol.value}"


@dataclass(frozen=True, slots=True, order=True)
class RealServerKey:
    """An IPVS real server (destination) inside one virtual server."""

    address: str
    port: int

    @property
    def family(self) -> int:
        return family_of(self.address)

    def __str__(self) -> str:
        return _hostport(self.address, self.port)


@dataclass(frozen=True, slots=True, order=True)
class _NamespacedName:
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"

    @classmethod
    def parse(cls, text: str) -> Self:
        namespace, _, name = text.partition("/")
        return cls(namespace, name)


# Separate classes so a Service and a Pod of the same name never compare equal.
@dataclass(frozen=True, slots=True, order=True)
class ServiceRef(_NamespacedName):
    """namespace/name of a Kubernetes Service."""


@dataclass(frozen=True, slots=True, order=True)
class PodRef(_NamespacedName):
    """A Pod as an endpoint's targetRef names it: namespace/name and its uid. Two pods of
    one name (a StatefulSet's `web-0` deleted and created again) differ by uid, so they are
    two endpoints; "" is an unknown uid (a targetRef without one, an old state file)."""

    uid: str = ""

    @classmethod
    def parse(cls, text: str, uid: str = "") -> PodRef:
        namespace, _, name = text.partition("/")
        return cls(namespace, name, uid)

    def same_pod(self, other: PodRef) -> bool:
        """Whether the two name the same pod: the same name, and the same uid when both
        are known."""
        return (
            self.namespace == other.namespace
            and self.name == other.name
            and (not self.uid or not other.uid or self.uid == other.uid)
        )


def service_order(key: ServiceKey) -> tuple[str, str, int]:
    """The order of `<` as a plain tuple: `sorted(keys, key=service_order)` compares in C,
    several times cheaper than the dataclass's `__lt__` (bench: 67% of an audit's time)."""
    return (key.protocol, key.address, key.port)


def real_server_order(rs: RealServerKey) -> tuple[str, int]:
    """The order of RealServerKey's `<` as a plain tuple (compared in C), as `service_order`."""
    return (rs.address, rs.port)


def by_service(item: tuple[ServiceKey, object]) -> tuple[str, str, int]:
    """`service_order` of a (ServiceKey, value) pair, for sorting a dict's items."""
    k = item[0]
    return (k.protocol, k.address, k.port)


def address_order(address: str) -> tuple[int, int]:
    """An address as people read a list of them: IPv4 before IPv6, then by value (10.96.0.2
    before 10.96.0.10, which a string sort puts after 10.96.0.100)."""
    ip = ipaddress.ip_address(address)
    return (ip.version, int(ip))


def display_order(key: ServiceKey) -> tuple[str, tuple[int, int], int]:
    """`plan`'s order of virtual servers: protocol, address by value, port."""
    return (key.protocol.value, address_order(key.address), key.port)

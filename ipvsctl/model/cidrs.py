"""Addresses against CIDR lists (kube-proxy's `ipvs.excludeCIDRs`, `nodePortAddresses`)."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from functools import lru_cache

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@lru_cache(maxsize=64)
def networks(cidrs: tuple[str, ...]) -> tuple[Network, ...]:
    return tuple(ipaddress.ip_network(c, strict=False) for c in cidrs)


def in_any(address: str, cidrs: tuple[str, ...]) -> bool:
    """Whether `address` is in one of `cidrs` (False for none, or an unparsable address)."""
    if not cidrs:
        return False
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip.version == n.version and ip in n for n in networks(cidrs))


def in_cidrs(addresses: Iterable[str], cidrs: tuple[str, ...]) -> list[str]:
    """The addresses in one of `cidrs`; all of them when `cidrs` is empty."""
    return [a for a in addresses if not cidrs or in_any(a, cidrs)]

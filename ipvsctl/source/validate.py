"""Every field check of the converters (convert.py): every value from a manifest or
the API may have any JSON/YAML shape, and one that escapes here reaches a set, a dict key or
a netlink struct far from the object that carried it (an unhashable name kills the loop; a
timeout above 2^32-1 raises struct.error inside the kernel adapter)."""

from __future__ import annotations

import ipaddress
import reprlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ipvsctl.model import Protocol, normalize_ip

# Kubernetes' own limit (ValidateClientIPAffinityConfig); IPVS takes a u32.
MAX_AFFINITY_TIMEOUT = 86400


class InvalidObject(ValueError):
    """An object ipvsctl cannot use; the message says why."""


@dataclass(slots=True)
class CheckCount:
    """Calls of the general field checks (optional_str, mapping, items, ip), whose callers
    build the error's location text before knowing whether there is an error. The hot loops
    (a slice's endpoints: ~40% of one change's CPU once) check the common shapes
    inline and call none; the cost tests read this to see it. Counted without a lock: a
    measure, not an account."""

    calls: int = 0


GENERAL_CHECKS = CheckCount()


def optional_str(value: Any, where: str) -> str | None:
    """None or a string; InvalidObject for any other shape (a list, a map, a number)."""
    GENERAL_CHECKS.calls += 1
    if value is None or isinstance(value, str):
        return value
    raise InvalidObject(f"{where}: {_short(value)} is not a string")


def affinity_timeout(value: Any, where: str) -> int:
    """sessionAffinityConfig.clientIP.timeoutSeconds: 1..86400 as the API server allows."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not 0 < value <= MAX_AFFINITY_TIMEOUT
    ):
        raise InvalidObject(
            f"{where}: {_short(value)} is not an integer from 1 to {MAX_AFFINITY_TIMEOUT}"
        )
    return value


def cidr(text: str) -> str:
    """A CIDR in compressed form; ValueError if not one. Zone ids are refused: `ipaddress`
    accepts `fe80::%eth0/64`, and nft rejects the whole batch that carries it."""
    if "%" in text:
        raise ValueError(f"{text!r}: a zone id")
    return ipaddress.ip_network(text.strip(), strict=False).compressed


# A bounded repr: YAML aliases make a 300 KB file a list shared a million times over, whose
# full repr() is gigabytes; reprlib stops at a few levels and a few items of each.
_REPR = reprlib.Repr()  # keyword arguments only from Python 3.12
_REPR.maxlevel = 3
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = _REPR.maxfrozenset = 4
_REPR.maxstring = _REPR.maxother = 60
_REPR.maxlong = 40


def short(value: Any) -> str:
    """What an error line shows of a value from an object: at most ~80 characters, at a
    cost bounded whatever its shape (never `repr()` or `str()` of the whole)."""
    try:
        text = _REPR.repr(value)
    except ValueError:  # an int past sys.get_int_max_str_digits() (a 5,000-digit number)
        text = f"<an integer of {value.bit_length()} bits>" if isinstance(value, int) else "<?>"
    return text if len(text) <= 80 else f"{text[:77]}..."


_short = short


def special_address(address: str) -> str | None:
    """Why an address is never a virtual server, whatever an object says (CONTRACT "Node
    safety"), or None. An IPv4-mapped IPv6 address is judged as its IPv4 address."""
    a = ipaddress.ip_address(address)
    if isinstance(a, ipaddress.IPv6Address) and a.ipv4_mapped is not None:
        a = a.ipv4_mapped
    if a.is_unspecified:
        return "an unspecified address"
    if a.is_loopback:
        return "a loopback address"
    if a.is_link_local:
        return "a link-local address"
    if a.is_multicast:
        return "a multicast address"
    if a == ipaddress.IPv4Address("255.255.255.255"):
        return "the broadcast address"
    return None


def object_meta(obj: Mapping[str, Any]) -> tuple[str, str, Mapping[str, Any]]:
    """(namespace, name, metadata) of an object; its namespace "default" when absent."""
    if not isinstance(obj, Mapping):
        raise InvalidObject("not an object")
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str) or not meta["name"]:
        raise InvalidObject("metadata.name is missing")
    namespace = meta.get("namespace") or "default"
    if not isinstance(namespace, str):
        raise InvalidObject("metadata.namespace is not a string")
    return namespace, meta["name"], meta


def mapping(value: Any, where: str) -> Mapping[str, Any]:
    """An object (None: an empty one)."""
    GENERAL_CHECKS.calls += 1
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidObject(f"{where} is not an object")
    return value


def items(value: Any, where: str) -> list[Any]:
    """A list (None: an empty one)."""
    GENERAL_CHECKS.calls += 1
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidObject(f"{where} is not a list")
    return value


def ip(value: Any, where: str) -> str:
    """An IP address, in its normal form."""
    GENERAL_CHECKS.calls += 1
    if not isinstance(value, str):
        raise InvalidObject(f"{where}: {_short(value)} is not an IP address")
    try:
        return normalize_ip(value)
    except ValueError:
        raise InvalidObject(f"{where}: {_short(value)} is not an IP address") from None


def port(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise InvalidObject(f"{where}: {_short(value)} is not a port number")
    return value


def protocol(value: Any, where: str) -> Protocol:
    """A port's protocol (None: TCP, as the API server defaults it)."""
    if value is None:
        return Protocol.TCP
    try:
        return Protocol(value)
    except ValueError:
        raise InvalidObject(f"{where}: unknown protocol {_short(value)}") from None


def condition(conditions: Mapping[str, Any], name: str, default: bool) -> bool:
    """An endpoint condition: absent is `default` (ready, serving: true; terminating:
    false), as kube-proxy reads them."""
    value = conditions.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InvalidObject(f"endpoints[].conditions.{name}: {_short(value)} is not a boolean")
    return value

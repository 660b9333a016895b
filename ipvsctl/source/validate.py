"""Field checks shared by the converters: every value from a manifest or the API may have
any JSON/YAML shape, and one that escapes here reaches a set, a dict key or a netlink struct
far from the object that carried it (an unhashable name kills the loop; a timeout above
2^32-1 raises struct.error inside the kernel adapter)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

# Kubernetes' own limit (ValidateClientIPAffinityConfig); IPVS takes a u32.
MAX_AFFINITY_TIMEOUT = 86400


class InvalidObject(ValueError):
    """An object ipvsctl cannot use; the message says why."""


@dataclass(slots=True)
class CheckCount:
    """Calls of the general field checks (optional_str here; the converters' object, list
    and address checks), whose callers build the error's location text before knowing
    whether there is an error. The hot loops (a slice's endpoints: ~40% of one change's CPU
    once, issue 14) check the common shapes inline and call none; the cost tests read this
    to see it. Counted without a lock: a measure, not an account."""

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
    if (isinstance(value, bool) or not isinstance(value, int)
            or not 0 < value <= MAX_AFFINITY_TIMEOUT):
        raise InvalidObject(
            f"{where}: {_short(value)} is not an integer from 1 to {MAX_AFFINITY_TIMEOUT}")
    return value


def cidr(text: str) -> str:
    """A CIDR in compressed form; ValueError if not one. Zone ids are refused: `ipaddress`
    accepts `fe80::%eth0/64`, and nft rejects the whole batch that carries it."""
    if "%" in text:
        raise ValueError(f"{text!r}: a zone id")
    return ipaddress.ip_network(text.strip(), strict=False).compressed


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."

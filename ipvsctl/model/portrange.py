"""The cluster's NodePort range (`--service-node-port-range`, as the API server's flag)."""

from __future__ import annotations

import re

DEFAULT_NODE_PORT_RANGE = range(30000, 32768)  # the API server's default, 30000-32767

_RANGE = re.compile(r"^\s*(\d{1,5})\s*(?:-\s*(\d{1,5})\s*)?$", re.ASCII)


def parse_port_range(text: str) -> range:
    """`A-B` (inclusive, as the API server writes it) or a single port `A` -> range(A, B+1).
    ValueError unless 1 <= A <= B <= 65535."""
    m = _RANGE.match(text) if isinstance(text, str) else None
    if not m:
        raise ValueError(f"{text!r} is not a port range A-B (e.g. 30000-32767)")
    first = int(m.group(1))
    last = int(m.group(2)) if m.group(2) is not None else first
    if not 1 <= first <= last <= 65535:
        raise ValueError(f"{text!r}: ports must be 1-65535 with A <= B")
    return range(first, last + 1)


def format_port_range(ports: range) -> str:
    return f"{ports.start}-{ports.stop - 1}"

"""Topology hints of EndpointSlice endpoints and a Service's `trafficDistribution`. Pure.

A malformed hint is never a reason to skip an endpoint: the endpoint is kept without hints
(one warning), and since kube-proxy only uses hints when every ready endpoint carries them,
its Service port falls back to all endpoints.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ipvsctl.model import EndpointHints
from ipvsctl.source.validate import short

# The values the API server accepts (PreferClose is PreferSameZone's older name).
TRAFFIC_DISTRIBUTIONS = frozenset({"PreferClose", "PreferSameZone", "PreferSameNode"})

_shared: dict[EndpointHints, EndpointHints] = {}


def _names(value: Any, where: str) -> frozenset[str]:
    if value is None:
        return frozenset()
    if not isinstance(value, list):
        raise ValueError(f"{where} is not a list")
    names = []
    for item in value:
        name = item.get("name") if isinstance(item, Mapping) else None
        if not isinstance(name, str) or not name:
            raise ValueError(f"{where}[].name: {short(item)} has no name")
        names.append(name)
    return frozenset(names)


def parse_hints(value: Any, where: str) -> tuple[EndpointHints | None, str | None]:
    """`endpoints[].hints` -> (hints or None, a warning or None)."""
    if value is None:
        return None, None
    try:
        if not isinstance(value, Mapping):
            raise ValueError(f"{where} is not an object")
        hints = EndpointHints(
            _names(value.get("forZones"), f"{where}.forZones"),
            _names(value.get("forNodes"), f"{where}.forNodes"),
        )
    except ValueError as exc:
        return None, f"{exc}: hints ignored"
    if not hints.zones and not hints.nodes:
        return None, None
    # Most endpoints of a zone carry equal hints: share one value (100,000 endpoints).
    if len(_shared) < 4096:
        hints = _shared.setdefault(hints, hints)
    return hints, None


def parse_traffic_distribution(value: Any) -> tuple[bool, str | None]:
    """`spec.trafficDistribution` -> (whether hints may be used, a warning or None). As
    kube-proxy, hints decide, whatever the (valid) value; an unknown value turns them off."""
    if value is None or value in TRAFFIC_DISTRIBUTIONS:
        return True, None
    return False, (
        f"spec.trafficDistribution: unknown value {short(value)}, topology hints ignored"
    )

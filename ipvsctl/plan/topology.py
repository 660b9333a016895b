"""Topology-aware endpoint selection, as kube-proxy's `CategorizeEndpoints`
(`pkg/proxy/topology.go`). Pure.

Among a Service port's ready endpoints (traffic policy Cluster only):
- node hints first: when every ready endpoint carries `hints.forNodes` and at least one is
  hinted for this node, only those (trafficDistribution PreferSameNode);
- else zone hints: when every ready endpoint carries `hints.forZones` and at least one is
  hinted for this node's zone, only those (PreferSameZone / PreferClose);
- else all of them.
No fallback is needed after that: a mode is only chosen when it keeps an endpoint.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from ipvsctl.model import EndpointInfo

K = TypeVar("K")

SAME_NODE = "PreferSameNode"
SAME_ZONE = "PreferSameZone"


@dataclass(frozen=True, slots=True)
class Topology:
    """Where this node is: its name (node hints) and zone (zone hints, None: unknown)."""

    node_name: str
    zone: str | None = None


def topology_mode(ready: Iterable[K], endpoints: Mapping[K, EndpointInfo], topo: Topology) -> str:
    """kube-proxy's topologyModeFromHints over the ready endpoints (`ready`, keys of
    `endpoints`): "", SAME_NODE or SAME_ZONE."""
    has_ready = for_node = for_zone = False
    all_node = all_zone = True
    for key in ready:
        has_ready = True
        hints = endpoints[key].hints
        if hints is None:
            return ""  # the common case: a Service without hints costs one endpoint
        if not hints.nodes:
            all_node = False
        elif topo.node_name in hints.nodes:
            for_node = True
        if not hints.zones:
            all_zone = False
        elif topo.zone is not None and topo.zone in hints.zones:
            for_zone = True
    if not has_ready:
        return ""
    if all_node and for_node:
        return SAME_NODE
    if all_zone and for_zone:
        return SAME_ZONE
    return ""


def available(ep: EndpointInfo, mode: str, topo: Topology) -> bool:
    """kube-proxy's availableForTopology."""
    if not mode:
        return True
    if ep.hints is None:
        return False
    if mode == SAME_NODE:
        return topo.node_name in ep.hints.nodes
    return topo.zone in ep.hints.zones


def by_topology(
    ready: frozenset[K], endpoints: Mapping[K, EndpointInfo], topo: Topology
) -> frozenset[K]:
    """The ready endpoints this node should use (all of them unless hints say otherwise)."""
    mode = topology_mode(ready, endpoints, topo)
    if not mode:
        return ready
    return frozenset(k for k in ready if available(endpoints[k], mode, topo))

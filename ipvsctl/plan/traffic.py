"""Per-Service traffic series (CONTRACT.md "Metrics"): which virtual servers are summed under
which labels, and which Services the series cap admits. Pure.

A Service's series are one label set per Service port (namespace, service, the port's name,
protocol), each summing the port's virtual servers on this node (cluster IPs, external and
load-balancer IPs, NodePorts): no address is a label, so a Service's series do not multiply
with its addresses or the node's.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from ipvsctl.model import DesiredService, ServiceKey, ServiceStats

# namespace, service, port (the Service port's name), protocol
Labels = tuple[str, str, str, str]
# connections; packets in, out; bytes in, out
SERIES_PER_LABELS = 5


def service_labels(desired: DesiredService) -> dict[ServiceKey, Labels]:
    """The label set each of the Service's virtual servers is summed under."""
    ref = desired.ref
    return {
        key: (ref.namespace, ref.name, dvs.port_name, key.protocol.value)
        for key, dvs in desired.virtual_servers.items()
    }


def admit(
    services: Collection[DesiredService], max_series: int
) -> tuple[dict[ServiceKey, Labels], int]:
    """The virtual servers to read and their labels, and how many Services the cap left
    out. A Service is admitted whole or not at all, in namespace/name order (the same
    Services keep their series from one scrape to the next); the order is only needed, and
    only paid for, when the Services' series do not all fit."""
    per_service = [(d, service_labels(d)) for d in services]
    needed = sum(len(set(labels.values())) * SERIES_PER_LABELS for _, labels in per_service)
    out: dict[ServiceKey, Labels] = {}
    if needed <= max_series:
        for _, labels in per_service:
            out.update(labels)
        return out, 0
    per_service.sort(key=lambda item: (item[0].ref.namespace, item[0].ref.name))
    used = dropped = 0
    for _, labels in per_service:
        cost = len(set(labels.values())) * SERIES_PER_LABELS
        if used + cost > max_series:
            dropped += 1
            continue
        used += cost
        out.update(labels)
    return out, dropped


def group(
    labels: Mapping[ServiceKey, Labels], counters: Mapping[ServiceKey, ServiceStats]
) -> dict[Labels, dict[ServiceKey, ServiceStats]]:
    """Each label set's virtual servers with their counters as read; a label set whose
    virtual servers are not in the kernel (yet) has none and sums to zero."""
    out: dict[Labels, dict[ServiceKey, ServiceStats]] = {}
    for key, lab in labels.items():
        found = out.setdefault(lab, {})
        stats = counters.get(key)
        if stats is not None:
            found[key] = stats
    return out


def went_back(now: ServiceStats, before: ServiceStats) -> bool:
    """The kernel's counters restarted: the virtual server was deleted and made again
    between two reads (counters only grow while it exists)."""
    return (
        now.conns < before.conns
        or now.in_packets < before.in_packets
        or now.out_packets < before.out_packets
        or now.in_bytes < before.in_bytes
        or now.out_bytes < before.out_bytes
    )


class MonotonicSums:
    """Counters that never go backwards while a label set is exported: when a virtual
    server summed under it goes away, or its kernel counters restart (deleted and
    re-created), what it had counted moves into the label set's base. Bounded by what is
    exported: a label set no longer exported is forgotten (if it comes back, it starts
    again from the kernel's counters, which Prometheus reads as a counter reset)."""

    def __init__(self) -> None:
        self._last: dict[Labels, dict[ServiceKey, ServiceStats]] = {}
        self._base: dict[Labels, ServiceStats] = {}

    def update(
        self, current: Mapping[Labels, dict[ServiceKey, ServiceStats]]
    ) -> dict[Labels, ServiceStats]:
        zero = ServiceStats()
        out: dict[Labels, ServiceStats] = {}
        base_now: dict[Labels, ServiceStats] = {}
        for lab, per_vs in current.items():
            base = self._base.get(lab, zero)
            for key, before in self._last.get(lab, {}).items():
                now = per_vs.get(key)
                if now is None or went_back(now, before):
                    base = base + before
            total = base
            for stats in per_vs.values():
                total = total + stats
            out[lab] = total
            base_now[lab] = base
        self._last = dict(current)
        self._base = base_now
        return out

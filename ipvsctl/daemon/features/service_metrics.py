"""Per-Service traffic series (--service-metrics; reconcile/service_traffic.py): the
kernel's IPVS counters summed per Service port, read at scrape time by a collector. It hears
which Services opted in, O(1) each. With --service-metrics none, or a kernel that cannot
read the counters, the collector is there and empty (the families keep their HELP)."""

from __future__ import annotations

from ipvsctl.daemon.feature import Feature, Parts
from ipvsctl.kernel.port import ServiceStatsReader
from ipvsctl.obs.metrics import ServiceTrafficCollector
from ipvsctl.reconcile.feed import Subscriptions
from ipvsctl.reconcile.service_traffic import ServiceMetricsMode, ServiceTraffic


def feature(p: Parts) -> Feature:
    o = p.options.metrics
    if o.service_metrics is ServiceMetricsMode.NONE or not isinstance(p.kernel, ServiceStatsReader):
        return Feature("service-metrics", collectors=(ServiceTrafficCollector(),))
    metrics = p.metrics
    traffic = ServiceTraffic(
        p.kernel,
        o.service_metrics,
        o.max_series,
        on_error=lambda exc: metrics.netlink_errors.labels(
            exc.operation or "read_service_stats"
        ).inc(),
    )
    return Feature(
        "service-metrics",
        part=traffic,
        hears=Subscriptions(service=traffic.on_service),
        collectors=(ServiceTrafficCollector(traffic.read),),
    )

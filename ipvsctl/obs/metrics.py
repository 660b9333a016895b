"""Every metric ipvsctl exports, on one registry per daemon (tests make their own).

Labels never carry an IP, and a Service's name only in the opt-in per-Service traffic
series (`--service-metrics`, bounded by `--service-metrics-max-series`): other per-object
detail belongs to /status."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Protocol

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
)
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from ipvsctl import __version__
from ipvsctl.obs.degraded import Degraded

# No `_created` series: one more per counter and histogram child, which nobody queries.
disable_created_metrics()

# Event-to-kernel latencies: netlink changes take ~100 us, Python under load a few ms;
# the tail up to tens of seconds is what kube-router's full resyncs cost.
_LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
)

# kube-proxy's network programming buckets (pkg/proxy/metrics): 0.25 s, 0.5 s, 1..59 s,
# 60..115 s by 5, 2..5 min by 30 s, so the SLI is comparable bucket for bucket.
_PROGRAMMING_BUCKETS = (
    0.25,
    0.5,
    *range(1, 60),
    *range(60, 120, 5),
    *range(120, 301, 30),
)


class TrafficCounts(Protocol):
    """A series' counters (model.ServiceStats)."""

    @property
    def conns(self) -> int: ...
    @property
    def in_packets(self) -> int: ...
    @property
    def out_packets(self) -> int: ...
    @property
    def in_bytes(self) -> int: ...
    @property
    def out_bytes(self) -> int: ...


# (namespace, service, port, protocol) and the counters; how many Services the cap left out
TrafficRead = Callable[[], tuple[Iterable[tuple[Sequence[str], TrafficCounts]], int]]
_SERVICE_LABELS = ["namespace", "service", "port", "protocol"]


class ServiceTrafficCollector:
    """The per-Service traffic series, made at scrape time by `read` (the daemon's
    service-metrics feature gives reconcile/service_traffic.py's; with --service-metrics
    none, none: the families are described, with no series)."""

    def __init__(self, read: TrafficRead = lambda: ((), 0)) -> None:
        self.read = read

    def _families(self) -> tuple[CounterMetricFamily, ...]:
        return (
            CounterMetricFamily(
                "ipvsctl_service_connections",
                "Connections scheduled to a Service port's virtual servers on this node "
                "(opted-in Services, --service-metrics).",
                labels=_SERVICE_LABELS,
            ),
            CounterMetricFamily(
                "ipvsctl_service_packets",
                "Packets through a Service port's virtual servers on this node, by direction "
                "(in: from clients, out: replies).",
                labels=[*_SERVICE_LABELS, "direction"],
            ),
            CounterMetricFamily(
                "ipvsctl_service_bytes",
                "Bytes through a Service port's virtual servers on this node, by direction.",
                labels=[*_SERVICE_LABELS, "direction"],
            ),
        )

    def _dropped(self, value: float) -> GaugeMetricFamily:
        return GaugeMetricFamily(
            "ipvsctl_service_metrics_dropped",
            "Services opted in to per-Service traffic metrics but left out by "
            "--service-metrics-max-series (at the last scrape).",
            value=value,
        )

    def describe(self) -> list[Metric]:
        return [*self._families(), self._dropped(0)]

    def collect(self) -> Iterator[Metric]:
        rows, dropped = self.read()
        conns, packets, octets = self._families()
        for labels, c in rows:
            lab = list(labels)
            conns.add_metric(lab, c.conns)
            packets.add_metric([*lab, "in"], c.in_packets)
            packets.add_metric([*lab, "out"], c.out_packets)
            octets.add_metric([*lab, "in"], c.in_bytes)
            octets.add_metric([*lab, "out"], c.out_bytes)
        yield from (conns, packets, octets, self._dropped(dropped))


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.virtual_servers = Gauge(
            "ipvsctl_virtual_servers", "Virtual servers ipvsctl has programmed.", registry=r
        )
        self.real_servers = Gauge(
            "ipvsctl_real_servers",
            "Real servers ipvsctl has programmed, by state.",
            ["state"],
            registry=r,
        )
        self.drain_queue_length = Gauge(
            "ipvsctl_drain_queue_length",
            "Real servers at weight 0 waiting to be deleted.",
            registry=r,
        )
        self.real_server_deletions = Counter(
            "ipvsctl_real_server_deletions",
            "Real servers deleted, by why.",
            ["reason"],
            registry=r,
        )
        self.event_to_kernel = Histogram(
            "ipvsctl_event_to_kernel_seconds",
            "Time from a watch event's arrival to its netlink changes being done.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.watch_restarts = Counter(
            "ipvsctl_watch_restarts",
            "Watch streams restarted, by resource and why.",
            ["resource", "reason"],
            registry=r,
        )
        self.netlink_errors = Counter(
            "ipvsctl_netlink_errors",
            "Failed kernel operations, by operation.",
            ["operation"],
            registry=r,
        )
        self.netlink_answers_lost = Counter(
            "ipvsctl_netlink_answers_lost",
            "Real server adds of a batch whose answer was lost (a full receive buffer, or "
            "none in time): each reported failed, its Service retried.",
            registry=r,
        )
        self.invalid_objects = Counter(
            "ipvsctl_invalid_objects",
            "Objects skipped (or fields ignored) as invalid, by kind.",
            ["kind"],
            registry=r,
        )
        self.sync_duration = Histogram(
            "ipvsctl_sync_duration_seconds",
            "Time to sync one batch of changed Services.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.kernel_ops = Counter(
            "ipvsctl_kernel_ops",
            "Kernel operations applied, by operation and result.",
            ["operation", "result"],
            registry=r,
        )
        self.drift_repairs = Counter(
            "ipvsctl_drift_repairs",
            "Differences between kernel and applied state put right.",
            ["kind"],
            registry=r,
        )
        self.state_write_errors = Counter(
            "ipvsctl_state_write_errors",
            "Failed writes of the drain queue state file.",
            registry=r,
        )
        self.state_load_errors = Counter(
            "ipvsctl_state_load_errors",
            "Drain state files found unreadable or corrupt at start-up (queue rebuilt).",
            registry=r,
        )
        self.state_entries_set_aside = Counter(
            "ipvsctl_state_entries_set_aside",
            "Entries of the drain state file that could not be read at start-up, set aside"
            " alone (the others loaded).",
            registry=r,
        )
        self.last_sync_timestamp = Gauge(
            "ipvsctl_last_sync_timestamp_seconds",
            "Wall-clock time of the last successful sync.",
            registry=r,
        )
        self.node_address_errors = Counter(
            "ipvsctl_node_address_errors",
            "Failed re-reads of the node's addresses, or failures of the socket that follows "
            "them (the addresses in force were kept).",
            registry=r,
        )
        # nftables (ipvsctl/netfilter) and healthCheckNodePort (ipvsctl/health)
        self.foreign_virtual_servers = Counter(
            "ipvsctl_foreign_virtual_servers",
            "Virtual servers a Service wants that another tool holds (not a Kubernetes "
            "proxy's): left alone, the Service skips them.",
            registry=r,
        )
        self.degraded_conditions = Gauge(
            "ipvsctl_degraded",
            "1 while a part of the daemon keeps failing (nftables, state_write, audit, "
            "source); readiness is not failed for it.",
            ["condition"],
            registry=r,
        )
        self.degraded = Degraded(self.degraded_conditions)
        self.nft_errors = Counter(
            "ipvsctl_nft_errors",
            "Failed nft runs, by operation.",
            ["operation"],
            registry=r,
        )
        self.nft_seconds = Histogram(
            "ipvsctl_nft_transaction_seconds",
            "Time for one successful nft run.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.netfilter_elements = Gauge(
            "ipvsctl_netfilter_elements",
            "Virtual servers in ipvsctl's nftables maps (as last written).",
            registry=r,
        )
        self.table_restores = Counter(
            "ipvsctl_table_restores",
            "What another program removed (kube-proxy's IPVS cleanup, ipvsadm -C) and the"
            " daemon put back, by what: ipvs, interface, nftables.",
            ["what"],
            registry=r,
        )
        self.netfilter_repairs = Counter(
            "ipvsctl_netfilter_repairs",
            "nftables table or elements found changed by someone else and rewritten, by kind.",
            ["kind"],
            registry=r,
        )
        self.health_check_ports = Gauge(
            "ipvsctl_health_check_node_ports",
            "healthCheckNodePorts served.",
            registry=r,
        )
        self.health_check_errors = Counter(
            "ipvsctl_health_check_node_port_errors",
            "healthCheckNodePorts that could not be opened (each attempt).",
            registry=r,
        )
        self.http_refused = Counter(
            "ipvsctl_http_refused",
            "HTTP connections or requests refused, by server (daemon, proxy-health, health) "
            "and reason "
            "(busy, evicted, timeout, too_large, bad_request, method, forbidden).",
            ["server", "reason"],
            registry=r,
        )
        self.status_renders = Counter(
            "ipvsctl_status_renders",
            "/status documents rendered (callers share one).",
            registry=r,
        )
        self.status_render_seconds = Gauge(
            "ipvsctl_status_render_seconds",
            "How long the last /status rendering took.",
            registry=r,
        )
        self.metrics_renders = Counter(
            "ipvsctl_metrics_renders",
            "/metrics renderings (the scrapes that come together share one).",
            registry=r,
        )
        self.metrics_render_seconds = Gauge(
            "ipvsctl_metrics_render_seconds",
            "How long the last /metrics rendering took.",
            registry=r,
        )
        # This node's Node and kube-proxy's health server (--healthz-bind-address)
        self.node_object_known = Gauge(
            "ipvsctl_node_object_known",
            "1 while this node's Node object is known (zone, deletion), else 0.",
            registry=r,
        )
        self.ready = Gauge(
            "ipvsctl_ready",
            "1 while /readyz answers 200 (the first full list is in the kernel), else 0.",
            registry=r,
        )
        self.proxy_health_errors = Counter(
            "ipvsctl_proxy_health_errors",
            "Attempts to open --healthz-bind-address that failed (port taken, ...).",
            registry=r,
        )
        self.proxy_health_responses = Counter(
            "ipvsctl_proxy_health_responses",
            "Answers of the --healthz-bind-address server, by path and code.",
            ["path", "code"],
            registry=r,
        )
        self.virtual_server_conflicts = Counter(
            "ipvsctl_virtual_server_conflicts",
            "Times a Service lost a virtual server it claims to another Service "
            "(cluster IP first, then the older Service).",
            registry=r,
        )
        self.virtual_server_conflict_losers = Gauge(
            "ipvsctl_virtual_server_conflict_losers",
            "Claims on virtual servers currently lost to another Service.",
            registry=r,
        )
        # The node's table against --max-table-entries (plan/capacity.py)
        self.table_entries = Gauge(
            "ipvsctl_table_entries",
            "IPVS entries (virtual servers and their real servers) the admitted Services "
            "ask for, counted against --max-table-entries.",
            registry=r,
        )
        self.table_entries_limit = Gauge(
            "ipvsctl_table_entries_limit",
            "--max-table-entries: past it, the newest Services are refused whole.",
            registry=r,
        )
        self.table_refused_services = Gauge(
            "ipvsctl_table_refused_services",
            "Services refused whole because they do not fit in --max-table-entries.",
            registry=r,
        )
        self.build_info = Gauge(
            "ipvsctl_build_info",
            "Always 1; the running ipvsctl's version.",
            ["version"],
            registry=r,
        )
        self.build_info.labels(__version__).set(1)
        # process_resident_memory_bytes, process_cpu_seconds_total, open fds (Linux /proc)
        ProcessCollector(registry=r)
        # Drains (ipvsctl/reconcile/drain_reader.py)
        self.drain_duration = Histogram(
            "ipvsctl_drain_duration_seconds",
            "Time from a real server's drain start to its deletion, by why it was deleted.",
            ["reason"],
            buckets=(1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600),
            registry=r,
        )
        self.conn_table_reads = Counter(
            "ipvsctl_conn_table_reads",
            "Passes over /proc/net/ip_vs_conn for draining TCP real servers, by result "
            "(ok, deferred by pacing, unavailable, error).",
            ["result"],
            registry=r,
        )
        self.conn_table_lines = Counter(
            "ipvsctl_conn_table_lines",
            "Lines read from /proc/net/ip_vs_conn.",
            registry=r,
        )
        for state in ("active", "draining"):
            self.real_servers.labels(state)
        for reason in ("drained", "deadline", "udp", "pod_gone", "service_deleted"):
            self.real_server_deletions.labels(reason)
        for result in ("ok", "deferred", "unavailable", "error"):
            self.conn_table_reads.labels(result)
        # Stale UDP/SCTP conntrack entries (ipvsctl/reconcile/conntrack_sweeper.py)
        self.conntrack_stale_deleted = Counter(
            "ipvsctl_conntrack_stale_entries_deleted",
            "Stale UDP/SCTP conntrack entries deleted by the sweep (to a Service address, "
            "answered by no serving endpoint).",
            registry=r,
        )
        self.conntrack_sweeps = Counter(
            "ipvsctl_conntrack_sweeps",
            "Conntrack sweeps, by result (ok, error).",
            ["result"],
            registry=r,
        )
        for result in ("ok", "error"):
            self.conntrack_sweeps.labels(result)
        # Node drain (ipvsctl/reconcile/node_drain.py, docs/node-drain.md)
        self.node_draining = Gauge(
            "ipvsctl_node_draining",
            "1 while this node is leaving (deletion, a --draining-taints taint, network "
            "unavailable) and its /healthz on --healthz-bind-address answers 503, else 0.",
            registry=r,
        )
        self.node_draining_seconds = Gauge(
            "ipvsctl_node_draining_seconds",
            "Seconds this node has been draining (0 when it is not).",
            registry=r,
        )
        self.node_established_connections = Gauge(
            "ipvsctl_node_established_connections",
            "Connections established through this node's NodePort, load-balancer and "
            "external-IP virtual servers, at the last reading of the IPVS table.",
            registry=r,
        )
        # Drains that Kubernetes can see (ipvsctl/kube/events.py)
        self.drain_connections_cut = Counter(
            "ipvsctl_drain_connections_cut",
            "Established connections cut when a drain deadline deleted their real server "
            "(each counted, whether an Event was written or not), by protocol.",
            ["protocol"],
            registry=r,
        )
        self.events = Counter(
            "ipvsctl_events",
            "Kubernetes Events, by reason and result (created, series, aggregated, "
            "rate_limited, dropped, forbidden, refused, error, other_namespace).",
            ["reason", "result"],
            registry=r,
        )
        self.network_programming = Histogram(
            "ipvsctl_network_programming_duration_seconds",
            "Time from an EndpointSlice's endpoints.kubernetes.io/last-change-trigger-time "
            "to the kernel change (kube-proxy's network programming SLI).",
            buckets=_PROGRAMMING_BUCKETS,
            registry=r,
        )
        self.network_programming_skipped = Counter(
            "ipvsctl_network_programming_skipped",
            "last-change-trigger-time annotations not observed, by reason (malformed, future).",
            ["reason"],
            registry=r,
        )
        for reason in ("malformed", "future"):
            self.network_programming_skipped.labels(reason)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def value(self, name: str, labels: dict[str, str] | None = None) -> float:
        """A sample's current value (0 if absent): for tests and status."""
        v = self.registry.get_sample_value(name, labels or {})
        return v or 0.0

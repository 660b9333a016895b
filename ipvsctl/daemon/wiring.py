"""`ipvsctl run`: all the wiring happens here.

kernel adapter + source adapter + state file + engine + loop + HTTP, each built from flags,
each failure at start-up one clear line and exit 1. On SIGTERM/SIGINT the threads stop and
the IPVS table is left exactly as it is: traffic keeps flowing while the daemon restarts.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import queue
import sys
import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ipvsctl.daemon.api import DaemonAPI
from ipvsctl.daemon.options import DaemonOptions
from ipvsctl.daemon.signals import serve_until_signal
from ipvsctl.daemon.status_json import engine_status
from ipvsctl.healthcheck.proxy_server import ProxyHealthServer
from ipvsctl.healthcheck.server import HealthServer
from ipvsctl.httpd import HTTPServer, Limits
from ipvsctl.kernel.port import (
    ConntrackTable,
    HostAddresses,
    IPVSKernel,
    KernelError,
    ServiceStatsReader,
)
from ipvsctl.model import ServiceKey
from ipvsctl.model.cidrs import in_cidrs
from ipvsctl.netfilter.nft import NftError, NftUnavailable
from ipvsctl.netfilter.ruleset import RulesetConfig
from ipvsctl.netfilter.sync import NetfilterSync, NftRunner, SyncConfig
from ipvsctl.obs.logging import fields
from ipvsctl.obs.metrics import Metrics
from ipvsctl.persist.drain_state import DrainStateFile
from ipvsctl.plan.ownership import is_owned, may_take_over
from ipvsctl.reconcile.conntrack_sweeper import ConntrackSweeper
from ipvsctl.reconcile.engine import Engine, EngineConfig
from ipvsctl.reconcile.feed import ChangeFeed, Subscriptions
from ipvsctl.reconcile.loop import Loop, LoopConfig
from ipvsctl.reconcile.node_drain import NodeDrain
from ipvsctl.reconcile.paced import Pace, PacedRunner
from ipvsctl.reconcile.service_traffic import (
    ServiceMetricsMode,
    ServiceTraffic,
)
from ipvsctl.reconcile.view import EngineView
from ipvsctl.reconcile.writer import StateWriter
from ipvsctl.source.backlog import Backlog
from ipvsctl.source.events import ObjectKind, ObjectSource, SourceConfigError, SourceEvent

if TYPE_CHECKING:
    from ipvsctl.kube.events import EventWriter
    from ipvsctl.kube.settings import KubeSettings

SWITCH_INTERVAL = 0.001  # seconds: sys.setswitchinterval, see Daemon.start

log = logging.getLogger("ipvsctl.daemon")

# Scrapes, probes, the shutdown-managers' /v1/quiesced and a few /status streams at once.
DAEMON_HTTP_LIMITS = Limits(max_connections=64, workers=8)


class StartupError(Exception):
    """A fatal start-up problem; the message is the one line the user sees."""


@dataclass
class Daemon:
    """The running parts, so tests can drive a daemon in-process."""

    options: DaemonOptions
    kernel: IPVSKernel
    source: ObjectSource
    metrics: Metrics = field(default_factory=Metrics)
    events: queue.Queue[SourceEvent] = field(default_factory=Backlog)
    stop: threading.Event = field(default_factory=threading.Event)
    owned: Callable[[ServiceKey], bool] = lambda key: True
    # Which existing virtual servers not ours a Service may take over (open_kernel).
    may_take_over: Callable[[ServiceKey], bool] = lambda key: True
    nft: NftRunner | None = None  # ipvsctl's nftables table, kept by a service listener
    health: HealthServer | None = None  # healthCheckNodePorts, a service listener too
    read_node_ips: Callable[[], list[str]] | None = None  # None: fixed node IPs
    # When to sync, check drains, audit...; None: the defaults with the options' interval.
    loop_config: LoopConfig | None = None
    conntrack: ConntrackTable | None = None  # None: no stale-UDP-entry sweep
    # ConnectionsCut Events (CONTRACT.md "Events"); None: none (a manifest directory)
    event_writer: EventWriter | None = None
    # Every address of the node, followed (kernel/netlink/address_watch.py): Node safety
    # counts them all. None: only the NodePort addresses count (tests without a kernel).
    host_addresses: HostAddresses | None = None

    def __post_init__(self) -> None:
        self.options = o = with_apiserver_addresses(self.options, self.source)
        if self.host_addresses is not None:
            self.options = o = dataclasses.replace(
                o, node=dataclasses.replace(o.node, host_ips=self.host_addresses.host_addresses())
            )
        self.state = DrainStateFile(o.drain.state_dir)
        try:
            self.state.ensure_dir()
        except OSError as exc:
            raise StartupError(f"--state-dir {o.drain.state_dir}: {exc}") from None
        self.feed = ChangeFeed()
        self.engine = Engine(
            self.kernel,
            EngineConfig(
                o.node,
                o.drain.timeout,
                service_drain_timeout=o.drain.service_timeout,
                wait_for_node=getattr(self.source, "emits_node", False),
            ),
            metrics=self.metrics,
            owned=self.owned,
            restored_queue=self.state.load(),
            may_take_over=self.may_take_over,
            feed=self.feed,
        )
        self.view = EngineView(self.engine)
        # A pod_gone grace counts only while the EndpointSlices are watched (an API source
        # says when; a manifest folder has no stream to break).
        watch_listeners = getattr(self.source, "watch_listeners", None)
        if isinstance(watch_listeners, list):
            watch_listeners.append(self._watched)
        if self.event_writer is not None:
            self.feed.subscribe(Subscriptions(cut=self.event_writer.record))
        if self.state.load_error:
            self.metrics.state_load_errors.inc()
        # The queue's writes (fsyncs) on their own thread: the loop never waits on disk.
        self.writer = StateWriter(
            self.state.save,
            on_error=self.metrics.state_write_errors.inc,
            on_health=lambda exc: self.metrics.degraded.set("state_write", exc),
        )
        self.loop = Loop(
            self.engine,
            self.events,
            self.loop_config or LoopConfig(drain_check_interval=o.drain.check_interval),
            save_queue=self.writer.submit,
            read_node_ips=self.read_node_ips,
            host_addresses=self.host_addresses,
        )
        self.netfilter: NetfilterSync | None = None
        if self.nft is not None:
            self.netfilter = NetfilterSync(
                self.nft,
                SyncConfig(RulesetConfig(o.netfilter.cluster_cidrs, o.netfilter.masquerade_all)),
                batch_lock=self.loop.lock,
                ready=lambda: self.view.started,
                metrics=self.metrics,
                node_ips=lambda: self.view.node.node_ips,
            )
            self._netfilter_feed = Subscriptions(
                service=self.netfilter.on_service, vs_drain=self.netfilter.on_virtual_server_drain
            )
            self.feed.subscribe(self._netfilter_feed)
        if self.health is not None:
            self.health.metrics = self.metrics
            # The node's own peers are never refused on a healthCheckNodePort either.
            self.health.http.trusted = lambda peer: self.api.is_local_peer(peer)
            self.health.proxy_healthy = lambda: self.api.healthz({})[0] == 200
            self.feed.subscribe(Subscriptions(service=self.health.on_service))
        # Per-Service traffic: read at scrape time; the event path only keeps who opted in.
        self.service_traffic: ServiceTraffic | None = None
        if o.metrics.service_metrics is not ServiceMetricsMode.NONE and isinstance(
            self.kernel, ServiceStatsReader
        ):
            self.service_traffic = ServiceTraffic(
                self.kernel,
                o.metrics.service_metrics,
                o.metrics.max_series,
                on_error=lambda exc: self.metrics.netlink_errors.labels(
                    exc.operation or "read_service_stats"
                ).inc(),
            )
            self.feed.subscribe(Subscriptions(service=self.service_traffic.on_service))
            self.metrics.service_traffic.read = self.service_traffic.read
        # Node drain: since when the node is leaving, and what still comes through it.
        check_interval = self.loop.config.drain_check_interval
        self.node_drain = NodeDrain(
            self.kernel,
            self.metrics,
            self.engine.clock,
            draining_taints=o.node_drain.draining_taints,
            lb_grace=o.node_drain.lb_grace,
            interval=check_interval,
            ready=lambda: self.view.started,
        )
        self.feed.subscribe(
            Subscriptions(service=self.node_drain.on_service, node=self.node_drain.on_node)
        )
        # The background reads of the kernel, each on its own thread (reconcile/paced.py).
        self.readers: list[PacedRunner] = [
            self.loop.drain_runner,
            self.loop.audit_runner,
            PacedRunner(
                "node-drain",
                self.node_drain,
                self.loop.lock,
                Pace(every=check_interval),  # a poll: NodeDrain paces its own reads
                clock=self.engine.clock,
            ),
        ]
        self.sweeper: ConntrackSweeper | None = None
        if self.conntrack is not None:
            self.sweeper = ConntrackSweeper(self.view, self.conntrack, self.loop.lock, self.metrics)
            self.feed.subscribe(Subscriptions(service=self.sweeper.on_service))
            self.readers.append(
                PacedRunner(
                    "conntrack",
                    self.sweeper,
                    self.loop.lock,
                    self.sweeper.pace(),
                    wake=self.sweeper.wake,
                )
            )
        self.threads: list[threading.Thread] = []
        self.api = DaemonAPI(
            self.view,
            self.loop.lock,
            self.metrics,
            heartbeat=lambda: self.loop.heartbeat,
            threads=lambda: self.threads,
            source_dead_threads=lambda: getattr(self.source, "dead_threads", list)(),
            stale_after=o.http.stale_after,
            node_drain=self.node_drain,
        )
        try:
            self.http = HTTPServer(
                o.http.listen,
                self.api.routes(),
                limits=DAEMON_HTTP_LIMITS,
                name="daemon",
                local_only=DaemonAPI.LOCAL_ONLY,
                inline=DaemonAPI.INLINE,
                is_local=self.api.is_local_peer,
                on_refused=lambda r: self.metrics.http_refused.labels("daemon", r).inc(),
            )
        except (OSError, ValueError) as exc:
            raise StartupError(f"--listen {o.http.listen}: {exc}") from None
        self.api.metrics_doc.listeners.append(self.http.server.wake)
        self.metrics.ready.set_function(lambda: 1 if self.api.readyz({})[0] == 200 else 0)
        self.metrics.node_object_known.set_function(
            lambda: 1 if (node := self.view.node_object) is not None and node.present else 0
        )
        self.proxy_health = (
            ProxyHealthServer(
                o.http.healthz_bind_address,
                self.api.proxy_state,
                self.metrics,
                trusted=self.api.is_local_peer,
            )
            if o.http.healthz_bind_address
            else None
        )

    def _watched(self, kind: ObjectKind, watching: bool) -> None:
        if kind is ObjectKind.ENDPOINT_SLICE:
            self.engine.slices_watched(watching)

    def status(self) -> dict[str, Any]:
        with self.loop.lock:
            return engine_status(self.view)

    def is_local_peer(self, peer: str) -> bool:
        return self.api.is_local_peer(peer)

    def start(self) -> None:
        # The readers parse kernel answers in Python while the loop waits to apply an event:
        # a thread waiting for the GIL gets it after up to the switch interval (5 ms by
        # default), several times per change (each netlink call releases it). 1 ms keeps an
        # event's wait short while a dump or a table read is being parsed.
        sys.setswitchinterval(SWITCH_INTERVAL)
        if self.netfilter is not None:
            try:
                self.netfilter.start()
            except NftError as exc:
                # IPVS alone still carries pod-to-Service traffic, the core of the job: run
                # degraded and say so loudly rather than leave the node with no proxy.
                hint = (
                    "; install nftables or pass --no-nftables"
                    if isinstance(exc, NftUnavailable)
                    else ""
                )
                log.error(
                    "nftables unavailable: running without ipvsctl's netfilter rules "
                    "(no masquerade, hairpin or NodePort from outside)",
                    extra=fields(error=f"{exc}{hint}"),
                )
                self.feed.unsubscribe(self._netfilter_feed)
                self.netfilter = None
        self.http.start()
        self.loop.pause_gc_until_started()
        self.threads = [
            threading.Thread(
                target=self._guard(self.loop.run), args=(self.stop,), name="loop", daemon=True
            ),
            threading.Thread(
                target=self._guard(self.source.run),
                args=(self.events.put, self.stop),
                name="source",
                daemon=True,
            ),
        ]
        # Drain checks, the audit and the conntrack sweep read the kernel off the loop's
        # lock, each on its own thread: a drain check never waits behind a full dump.
        for runner in self.readers:
            self.threads.append(
                threading.Thread(
                    target=self._guard(runner.run), args=(self.stop,), name=runner.name, daemon=True
                )
            )
        for name, part in (
            ("metrics", self.api.metrics_doc),
            (
                "node-addresses",
                self.host_addresses if hasattr(self.host_addresses, "run") else None,
            ),
            ("netfilter", self.netfilter),
            ("health", self.health),
            ("proxy-health", self.proxy_health),
            ("state-writer", self.writer),
            ("events", self.event_writer),
        ):
            if part is not None:
                self.threads.append(
                    threading.Thread(
                        target=self._guard(part.run), args=(self.stop,), name=name, daemon=True
                    )
                )
        for t in self.threads:
            t.start()
        log.info(
            "started",
            extra=fields(
                node=self.options.node.node_name,
                node_ips=",".join(self.options.node.node_ips),
                node_ips_followed=self.read_node_ips is not None,
                listen=f"{self.options.http.listen} (port {self.http.port})",
                source=self.options.source.describe(),
            ),
        )

    def _guard(self, fn: Callable[..., None]) -> Callable[..., None]:
        """A thread that dies logs why; /healthz then fails and the kubelet restarts us."""

        def run(*args: Any) -> None:
            try:
                fn(*args)
            except Exception:
                log.exception("thread died", extra=fields(thread=threading.current_thread().name))

        return run

    def shutdown(self) -> None:
        """Stop threads; leave the kernel's IPVS table exactly as it is."""
        self.stop.set()
        if self.netfilter is not None:
            self.netfilter.wake.set()
        for runner in self.readers:
            runner.wake.set()
        for t in self.threads:
            t.join(timeout=10)
        if self.health is not None:
            self.health.close()
        if self.proxy_health is not None:
            self.proxy_health.close()
        self.http.stop()
        try:  # after the writer's last save (a hung disk: not for ever, the kubelet waits)
            self.state.save(self.view.drain_queue(), lock_timeout=5.0)
        except OSError as exc:
            log.error("drain state write failed", extra=fields(error=exc))
        log.info(
            "stopped; IPVS table left in place",
            extra=fields(
                # a count: 3, not the gauge's 3.0
                virtual_servers=int(self.metrics.value("ipvsctl_virtual_servers")),
                draining=len(self.engine.drains),
            ),
        )


def open_kernel(
    o: DaemonOptions,
    node_ips: Callable[[], Collection[str]] | None = None,
    metrics: Metrics | None = None,
) -> tuple[IPVSKernel, Callable[[ServiceKey], bool], Callable[[ServiceKey], bool]]:
    """The netlink kernel, host set-up done, which virtual servers are ipvsctl's (those on
    its dummy interface's addresses and NodePorts on node IPs; others are left alone), and
    which existing ones a Service may take over: ours, or another Kubernetes proxy's (an
    address on kube-ipvs0 or kube-dummy-if, read once here). `node_ips` gives the node IPs
    as they are now (they can change while running); without it, the start-up ones."""
    from ipvsctl.kernel import netlink

    try:
        counted: dict[str, Any] = (
            {} if metrics is None else {"on_answers_lost": metrics.netlink_answers_lost.inc}
        )
        kernel = netlink.NetlinkKernel(interface=o.kernel.interface, **counted)
        netlink.configure_host(
            tcp_timeout=o.kernel.tcp_timeout,
            tcpfin_timeout=o.kernel.tcpfin_timeout,
            udp_timeout=o.kernel.udp_timeout,
            kernel=kernel,
            strict_arp=o.kernel.strict_arp,
        )
        bound = set(kernel.bound_addresses())
    except KernelError as exc:
        raise StartupError(str(exc)) from None
    try:
        proxy_addresses = bound | set(netlink.interface_addresses())
    except Exception as exc:  # not fatal: then only our own are taken over
        log.warning("proxy interfaces unreadable", extra=fields(error=exc))
        proxy_addresses = bound
    fixed = frozenset(o.node.node_ips)
    current = node_ips or (lambda: fixed)
    node_ports = o.node.node_port_range
    excluded = o.kernel.exclude_cidrs

    def owned(key: ServiceKey) -> bool:
        return is_owned(key, bound, current(), node_ports, excluded)

    def take_over(key: ServiceKey) -> bool:
        return may_take_over(key, owned(key), proxy_addresses)

    return kernel, owned, take_over


def node_ips_reader(
    o: DaemonOptions, watch: HostAddresses | None = None
) -> Callable[[], list[str]] | None:
    """How the loop re-reads the node's addresses; None with --node-ip (fixed addresses).
    With `watch` (the followed addresses) a re-read is a copy, no netlink dump."""
    if not o.node_ips.follow:
        return None
    from ipvsctl.kernel.netlink.addresses import node_addresses

    # As at start-up (cli._node): the VIP interface's addresses are ClusterIPs.
    read: Callable[[], list[str]] = (
        watch.node_addresses
        if watch is not None
        else functools.partial(node_addresses, exclude_interfaces=(o.kernel.interface,))
    )
    if not o.node_ips.cidrs:
        return read
    return lambda: in_cidrs(read(), o.node_ips.cidrs)


def open_host_addresses(o: DaemonOptions, metrics: Metrics) -> HostAddresses:
    """Every address of the node, dumped now and followed from `Daemon.start`."""
    from ipvsctl.kernel.netlink.address_watch import HostAddressWatch

    try:
        return HostAddressWatch(o.kernel.interface, on_error=metrics.node_address_errors.inc).open()
    except OSError as exc:
        raise StartupError(f"the node's addresses cannot be read (rtnetlink): {exc}") from None


def open_source(
    o: DaemonOptions, metrics: Metrics, kube_settings: KubeSettings | None = None
) -> ObjectSource:
    if o.source.manifests:
        from ipvsctl.manifests import ManifestSource

        try:
            return ManifestSource(
                o.source.manifests,
                on_file_error=lambda: metrics.invalid_objects.labels("ManifestFile").inc(),
            )
        except SourceConfigError as exc:
            raise StartupError(str(exc)) from None
    from ipvsctl.kube.client import SENTINEL_SERVICE, KubeSource
    from ipvsctl.source.convert import service_label_selector
    from ipvsctl.source.store import Preparer

    try:
        return KubeSource.from_config(
            kubeconfig=o.source.kubeconfig,
            apiserver=o.source.apiserver,
            node_name=o.node.node_name,
            settings=kube_settings,
            on_watch_restart=lambda resource, reason: metrics.watch_restarts.labels(
                resource, reason
            ).inc(),
            service_label_selector=service_label_selector(o.node.service_proxy_name),
            # default/kubernetes carries no proxy-name label: with a name it is never listed,
            # so it cannot vouch for a Service list (the empty-list guard is off then).
            sentinel=None if o.node.service_proxy_name else SENTINEL_SERVICE,
            # Lists parsed as they are decoded, as the engine's store would (its
            # configuration is the same o.node): never all raw objects alive at once.
            prepare=Preparer.for_node(o.node),
            on_invalid_object=lambda kind: metrics.invalid_objects.labels(kind).inc(),
            on_health=lambda why: metrics.degraded.set("source", why),
        )
    except SourceConfigError as exc:
        raise StartupError(str(exc)) from None


def open_event_writer(
    o: DaemonOptions, source: ObjectSource, metrics: Metrics
) -> EventWriter | None:
    """The Events writer, on the source's API client; None without an API server."""
    api_client = getattr(source, "api_client", None)
    if api_client is None:
        return None
    from ipvsctl.kube.events import EventWriter

    node = o.node.node_name or ""
    return EventWriter(
        api_client,
        instance=f"ipvsctl-{node}" if node else "ipvsctl",
        node=node,
        on_result=lambda reason, result: metrics.events.labels(reason, result).inc(),
    )


def with_apiserver_addresses(o: DaemonOptions, source: ObjectSource) -> DaemonOptions:
    """The API server's own addresses, never an external or load-balancer IP (CONTRACT
    "Node safety"): a Service binding one would send this daemon's API traffic into IPVS.
    A hostname is resolved once, here."""
    host = getattr(source, "host", None)
    if not isinstance(host, str) or not host:
        return o
    from ipvsctl.kube.config import host_addresses

    ips = host_addresses(host)
    log.info("API server addresses", extra=fields(host=host, addresses=",".join(sorted(ips))))
    return dataclasses.replace(o, node=dataclasses.replace(o.node, apiserver_ips=ips))


def run(o: DaemonOptions) -> int:
    metrics = Metrics()
    source = open_source(o, metrics)  # configuration mistakes first: they are the user's
    daemon: Daemon | None = None

    def node_ips() -> Collection[str]:
        # The engine's addresses, current and removed while running: a NodePort virtual
        # server on an address just removed is still ours to delete. owned() is only asked
        # during syncs, once `daemon` exists.
        return daemon.view.node_ips_known if daemon else o.node.node_ips

    kernel, owned, take_over = open_kernel(o, node_ips, metrics)
    host_addresses = open_host_addresses(o, metrics)
    event_writer = open_event_writer(o, source, metrics)
    nft = None
    if o.netfilter.enabled:
        from ipvsctl.netfilter.nft import Nft

        nft = Nft(metrics=metrics)
    from ipvsctl.kernel.netlink.conntrack import NetlinkConntrack

    daemon = Daemon(
        o,
        kernel,
        source,
        metrics=metrics,
        owned=owned,
        may_take_over=take_over,
        nft=nft,
        health=HealthServer(o.node.node_name),
        read_node_ips=node_ips_reader(o, host_addresses),
        conntrack=NetlinkConntrack(),
        event_writer=event_writer,
        host_addresses=host_addresses,
    )
    serve_until_signal(daemon.start)
    log.info("signal received, stopping")
    daemon.shutdown()
    return 0

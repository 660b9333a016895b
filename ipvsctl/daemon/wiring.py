"""`ipvsctl run`: the node daemon composed from its options.

The core (state file, engine with its change feed, loop, HTTP API), built once, then the
features (`FEATURES`: daemon/feature.py, daemon/features/), each built from the options and
the core's parts, subscribed to the feed, its routes and collectors added, its threads
started. The outside things come from adapters.py. Each failure at start-up is one clear
line and exit 1. On SIGTERM/SIGINT the threads stop and the IPVS table is left exactly as
it is: traffic keeps flowing while the daemon restarts.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import socket
import sys
import threading
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from ipvsctl.daemon import adapters
from ipvsctl.daemon.adapters import StartupError
from ipvsctl.daemon.api import DaemonAPI
from ipvsctl.daemon.feature import Builder, Feature, Parts, Run
from ipvsctl.daemon.features import (
    audit,
    conntrack_sweep,
    drain_check,
    events,
    health_check_ports,
    netfilter,
    node_drain,
    proxy_health,
    service_metrics,
    table_guard,
)
from ipvsctl.daemon.options import DaemonOptions
from ipvsctl.daemon.signals import serve_until_signal
from ipvsctl.daemon.status_json import engine_status
from ipvsctl.httpd import HTTPServer, Limits
from ipvsctl.kernel.port import ConntrackTable, HostAddresses, IPVSKernel
from ipvsctl.model import ServiceKey
from ipvsctl.netfilter.sync import NftRunner
from ipvsctl.obs.logging import fields
from ipvsctl.obs.metrics import Metrics
from ipvsctl.persist.drain_state import DrainStateFile
from ipvsctl.reconcile.engine import Engine, EngineConfig
from ipvsctl.reconcile.feed import ChangeFeed
from ipvsctl.reconcile.loop import Loop, LoopConfig
from ipvsctl.reconcile.view import EngineView
from ipvsctl.reconcile.writer import StateWriter
from ipvsctl.source.backlog import Backlog
from ipvsctl.source.events import ObjectKind, ObjectSource, SourceEvent

if TYPE_CHECKING:
    from ipvsctl.kube.events import EventWriter

SWITCH_INTERVAL = 0.001  # seconds: sys.setswitchinterval, see Daemon.start

log = logging.getLogger("ipvsctl.daemon")

# Scrapes, probes, the shutdown-managers' /v1/quiesced and a few /status streams at once.
DAEMON_HTTP_LIMITS = Limits(max_connections=64, workers=8)


# The daemon's features (daemon/features/), in the order they hear the feed and start: a new
# feature is its own module plus one line here.
FEATURES: tuple[Builder, ...] = (
    drain_check.feature,
    audit.feature,
    netfilter.feature,
    health_check_ports.feature,
    service_metrics.feature,
    node_drain.feature,
    conntrack_sweep.feature,
    proxy_health.feature,
    events.feature,
    table_guard.feature,
)

T = TypeVar("T")


@dataclass
class Daemon:
    """The running parts, so tests can drive a daemon in-process: the core (state file,
    engine, loop, HTTP API) and the features built on it."""

    options: DaemonOptions
    kernel: IPVSKernel
    source: ObjectSource
    metrics: Metrics = field(default_factory=Metrics)
    events: queue.Queue[SourceEvent] = field(default_factory=Backlog)
    stop: threading.Event = field(default_factory=threading.Event)
    owned: Callable[[ServiceKey], bool] = lambda key: True
    # Which existing virtual servers not ours a Service may take over (open_kernel).
    may_take_over: Callable[[ServiceKey], bool] = lambda key: True
    read_node_ips: Callable[[], list[str]] | None = None  # None: fixed node IPs
    # When to sync, check drains, audit...; None: the defaults with the options' interval.
    loop_config: LoopConfig | None = None
    # Every address of the node, followed (kernel/netlink/address_watch.py): Node safety
    # counts them all. None: only the NodePort addresses count (tests without a kernel).
    host_addresses: HostAddresses | None = None
    # The outside things features need (daemon/feature.py's Parts); None: not here.
    nft: NftRunner | None = None  # ipvsctl's nftables table
    health_ports: Callable[[int], socket.socket] | None = None  # healthCheckNodePorts
    conntrack: ConntrackTable | None = None  # the stale-UDP-entry sweep's table
    event_writer: EventWriter | None = None  # ConnectionsCut Events (an API server's)
    features: Sequence[Builder] = FEATURES

    def __post_init__(self) -> None:
        self.options = o = adapters.with_apiserver_addresses(self.options, self.source)
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
        if self.state.load_error:
            self.metrics.state_load_errors.inc()
        if self.state.entries_set_aside:
            self.metrics.state_entries_set_aside.inc(self.state.entries_set_aside)
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
        self.threads: list[threading.Thread] = []
        self.api = DaemonAPI(
            self.view,
            self.loop.lock,
            self.metrics,
            heartbeat=lambda: self.loop.heartbeat,
            threads=lambda: self.threads,
            source_dead_threads=lambda: getattr(self.source, "dead_threads", list)(),
            stale_after=o.http.stale_after,
        )
        parts = Parts(
            o,
            self.kernel,
            self.metrics,
            self.view,
            self.engine.clock,
            self.loop,
            self.api,
            nft=self.nft,
            health_ports=self.health_ports,
            conntrack=self.conntrack,
            event_writer=self.event_writer,
        )
        self.running = [f for build in self.features if (f := build(parts)) is not None]
        routes = dict(self.api.routes())
        local_only = set(DaemonAPI.LOCAL_ONLY)
        for f in self.running:
            self.feed.subscribe(f.hears)
            routes.update(f.routes)
            local_only |= f.local_only
            for collector in f.collectors:
                self.metrics.registry.register(collector)
        try:
            self.http = HTTPServer(
                o.http.listen,
                routes,
                limits=DAEMON_HTTP_LIMITS,
                name="daemon",
                local_only=frozenset(local_only),
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

    def _leave_out(self, f: Feature) -> None:
        """A feature that could not start: it hears, serves and counts nothing."""
        self.feed.unsubscribe(f.hears)
        for path in f.routes:
            self.http.routes.pop(path, None)
        for collector in f.collectors:
            self.metrics.registry.unregister(collector)
        self.running.remove(f)

    def part(self, kind: type[T]) -> T | None:
        """The running part of that type of a feature this daemon runs (None: none)."""
        for f in self.running:
            if isinstance(f.part, kind):
                return f.part
        return None

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
        for f in list(self.running):
            if f.start is not None and not f.start():  # it said why: run without it
                self._leave_out(f)
        self.http.start()
        self.loop.pause_gc_until_started()
        core: list[tuple[str, Run | None]] = [
            ("loop", self.loop.run),
            ("source", lambda stop: self.source.run(self.events.put, stop)),
            ("metrics", self.api.metrics_doc.run),
            ("node-addresses", getattr(self.host_addresses, "run", None)),
            ("state-writer", self.writer.run),
        ]
        # The features' background reads (drain checks, the audit, the conntrack sweep...)
        # read the kernel off the loop's lock, each on its own thread: a drain check never
        # waits behind a full dump.
        threads = core + [
            thread
            for f in self.running
            for thread in [*((r.name, r.run) for r in f.readers), *f.threads]
        ]
        self.threads += [_thread(name, run, self.stop) for name, run in threads if run]
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

    def shutdown(self) -> None:
        """Stop threads; leave the kernel's IPVS table exactly as it is."""
        self.stop.set()
        for f in self.running:
            if f.wake is not None:
                f.wake()
            for runner in f.readers:
                runner.wake.set()
        for t in self.threads:
            t.join(timeout=10)
        for f in self.running:
            if f.stop is not None:
                f.stop()
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


def _thread(name: str, run: Run, stop: threading.Event) -> threading.Thread:
    """A thread that dies logs why; /healthz then fails and the kubelet restarts us."""

    def guarded() -> None:
        try:
            run(stop)
        except Exception:
            log.exception("thread died", extra=fields(thread=name))

    return threading.Thread(target=guarded, name=name, daemon=True)


def run(o: DaemonOptions) -> int:
    metrics = Metrics()
    source = adapters.open_source(o, metrics)  # configuration mistakes first: they are the user's
    daemon: Daemon | None = None

    def node_ips() -> Collection[str]:
        # The engine's addresses, current and removed while running: a NodePort virtual
        # server on an address just removed is still ours to delete. owned() is only asked
        # during syncs, once `daemon` exists.
        return daemon.view.node_ips_known if daemon else o.node.node_ips

    kernel, owned, take_over = adapters.open_kernel(o, node_ips, metrics)
    host_addresses = adapters.open_host_addresses(o, metrics)
    from ipvsctl.healthcheck.server import listen_any
    from ipvsctl.kernel.netlink.conntrack import NetlinkConntrack

    daemon = Daemon(
        o,
        kernel,
        source,
        metrics=metrics,
        owned=owned,
        may_take_over=take_over,
        nft=adapters.open_nft(o, metrics),
        health_ports=listen_any,
        read_node_ips=adapters.node_ips_reader(o, host_addresses),
        conntrack=NetlinkConntrack(),
        event_writer=adapters.open_event_writer(o, source, metrics),
        host_addresses=host_addresses,
    )
    serve_until_signal(daemon.start)
    log.info("signal received, stopping")
    daemon.shutdown()
    return 0

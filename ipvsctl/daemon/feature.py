"""A feature of the node daemon, declared rather than spliced into the wiring (Cilium's
cells, in miniature).

A `Feature` says, as data, what it hears on the engine's change feed, the background reads
it runs (`PacedRunner`s, each on its own thread), its other threads, the HTTP routes and
metric collectors it adds, and how it starts and stops. Each feature's module in
daemon/features/ builds one from the daemon's options and its shared parts (`Parts`), or
None where it has nothing to do on this daemon (no nft runner, no conntrack table...);
wiring.py composes the list (`FEATURES`). A new feature is its own module plus one line
there; it edits neither the wiring, the engine nor the applier.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prometheus_client.registry import Collector

from ipvsctl.daemon.api import DaemonAPI
from ipvsctl.daemon.options import DaemonOptions
from ipvsctl.httpd import Handler
from ipvsctl.kernel.port import ConntrackTable, IPVSKernel
from ipvsctl.netfilter.sync import NftRunner
from ipvsctl.obs.metrics import Metrics
from ipvsctl.reconcile.clock import Clock
from ipvsctl.reconcile.feed import Subscriptions
from ipvsctl.reconcile.loop import Loop
from ipvsctl.reconcile.paced import PacedRunner
from ipvsctl.reconcile.view import EngineView

if TYPE_CHECKING:  # the Kubernetes client is loaded only where Events are written
    from ipvsctl.kube.events import EventWriter

Run = Callable[[threading.Event], None]  # a thread's body: until the event is set


@dataclass(frozen=True, slots=True)
class Feature:
    name: str
    # The running object (the daemon and tests find it by its type: `Daemon.part`).
    part: object = None
    hears: Subscriptions = field(default_factory=Subscriptions)
    readers: tuple[PacedRunner, ...] = ()  # background reads of the kernel
    threads: tuple[tuple[str, Run], ...] = ()  # (thread name, body)
    routes: Mapping[str, Handler] = field(default_factory=dict)  # on --listen
    local_only: frozenset[str] = frozenset()  # of `routes`: for this node's clients only
    collectors: tuple[Collector, ...] = ()  # on the daemon's registry
    # Before the threads start. False: it could not start (it said why, once) and is left
    # out whole: it hears nothing, runs no thread, serves no route, adds no series; the
    # daemon runs without it.
    start: Callable[[], bool] | None = None
    wake: Callable[[], None] | None = None  # at shutdown: ends its threads' waits
    stop: Callable[[], None] | None = None  # at shutdown, once its threads ended


@dataclass(frozen=True, slots=True)
class Parts:
    """What every feature may use, built once by the wiring before the features: the
    options, the engine read through its view, the loop (its lock, its runners), the core
    HTTP API, and the outside things a feature needs (None: not on this daemon)."""

    options: DaemonOptions
    kernel: IPVSKernel
    metrics: Metrics
    view: EngineView
    clock: Clock  # the engine's
    loop: Loop
    api: DaemonAPI
    nft: NftRunner | None = None  # ipvsctl's nftables table
    health_ports: Callable[[int], socket.socket] | None = None  # healthCheckNodePorts
    conntrack: ConntrackTable | None = None  # the stale-entry sweep's table
    event_writer: EventWriter | None = None  # Kubernetes Events


Builder = Callable[[Parts], Feature | None]

"""The shutdown-manager sidecar's wiring: its HTTP server (/shutdown, /healthz, /status),
the shared barrier and its probes, and the run until SIGTERM (`ipvsctl shutdown-manager`,
cli/shutdown_manager.py, parses the flags).

GET /shutdown blocks until every node's ipvsctl daemon says the pod's IPs are quiesced (no
real server with weight > 0 left for them), then until the pod's established connections on
the watched ports are at most --min-open-connections, never longer than --timeout; then it
answers 200 with a JSON account of what happened, and the kubelet goes on to SIGTERM.
Concurrent calls share one barrier, but each gets an answer made after it came: an early or
stray call never leaves a result that makes the real preStop return at once. A waiting call
holds no thread (the HTTP server parks it: `ipvsctl.httpd.Park`) and is never closed by
the server's bounds (`protected`), which are per peer, so no number of other connections
or calls makes the preStop's be evicted or answered early. See docs/shutdown-manager.md.

The barrier is ipvsctl.shutdown.barrier, the probes ipvsctl.shutdown.probes. The HTTP server
and the probes are imported where they are used, so that registering the command costs the
rest of the CLI nothing.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from ipvsctl.daemon.signals import serve_until_signal
from ipvsctl.model import PodRef
from ipvsctl.obs.logging import fields
from ipvsctl.shutdown import DEFAULT_DAEMON_PORT, DEFAULT_DAEMON_SERVICES
from ipvsctl.shutdown.barrier import BarrierConfig

if TYPE_CHECKING:
    from ipvsctl.httpd import Park, Response
    from ipvsctl.kube.events import EventWriter
    from ipvsctl.shutdown.probes import Resolver
    from ipvsctl.shutdown.runner import Clock, Sleep, Ticket

log = logging.getLogger("ipvsctl.shutdown")

DEFAULT_LISTEN = "0.0.0.0:9797"
DEFAULT_TIMEOUT = 25.0  # below the default terminationGracePeriodSeconds (30) by 5 s
REPLY_GRACE = 5.0  # on SIGTERM, longest wait for /shutdown replies still being written
EVENT_GRACE = 5.0  # on SIGTERM, longest wait for the barrier's Event to be written


class StartupError(Exception):
    """A fatal start-up problem; the message is the one line the user sees."""


@dataclass(frozen=True, slots=True)
class ManagerOptions:
    pod_ips: tuple[str, ...]
    listen: str = DEFAULT_LISTEN
    daemons: tuple[str, ...] = ()
    """Explicit daemon base URLs; empty: look them up in DNS (daemon_services)."""
    daemon_services: tuple[str, ...] = DEFAULT_DAEMON_SERVICES
    """The names the daemons are behind: those of every name that exists."""
    daemon_port: int = DEFAULT_DAEMON_PORT
    ports: tuple[int, ...] = ()
    """Watched local ports; empty: every listening port but the manager's own."""
    proc_net: str = "/proc/net"
    node_ips: tuple[str, ...] = ()
    """The node's addresses (the kubelet's probes and preStop come from there): trusted
    like loopback, never refused or evicted by the server's bounds."""
    barrier: BarrierConfig = field(default_factory=lambda: BarrierConfig(timeout=DEFAULT_TIMEOUT))
    pod: PodRef | None = None
    """This pod (the downward API's metadata.name, .namespace, .uid): where the barrier's
    outcome is recorded as an Event; None: not recorded."""


class ShutdownManager:
    """The running sidecar, so tests can run it in-process (clock, sleep and the DNS resolver
    injectable; daemons and /proc/net come from the options)."""

    def __init__(
        self,
        options: ManagerOptions,
        clock: Clock = time.monotonic,
        sleep: Sleep = time.sleep,
        resolve: Resolver | None = None,
        events: EventWriter | None = None,
    ) -> None:
        from ipvsctl.httpd import HTTPServer, Limits, as_json, is_loopback_peer, text
        from ipvsctl.shutdown.probes import (
            ConnectionCounter,
            DnsDaemons,
            ShutdownProbes,
            StaticDaemons,
            default_gateways,
            resolve_addresses,
        )
        from ipvsctl.shutdown.runner import SharedBarrier

        # A waiting /shutdown holds a socket, not a thread (parked); per peer at most 16
        # connections, so one address's flood or strays only ever close its own.
        limits = Limits(max_connections=1024, max_per_peer=16, workers=4)
        self.options = options
        # The node's addresses: --node-ip, and the pod's default gateways (the node as the
        # pod sees it: with a bridge CNI the bridge's address, where the kubelet's probes
        # and preStops come from).
        trusted = frozenset(options.node_ips) | default_gateways(options.proc_net)
        self.trusted = trusted
        try:
            self.http = HTTPServer(
                options.listen,
                {
                    "/shutdown": self._shutdown,
                    "/healthz": lambda q: text(200, "ok\n"),
                    "/status": lambda q: as_json(200, self.barrier.status()),
                },
                limits=limits,
                name="shutdown-manager",
                is_local=lambda peer: is_loopback_peer(peer) or peer in trusted,
                inline=("/healthz",),  # the liveness probe: never behind a /shutdown or /status
            )
        except (OSError, ValueError) as exc:
            raise StartupError(f"--listen {options.listen}: {exc}") from None
        daemons = (
            StaticDaemons(options.daemons)
            if options.daemons
            else DnsDaemons(
                options.daemon_services, options.daemon_port, resolve or resolve_addresses
            )
        )
        self.daemons: StaticDaemons | DnsDaemons = daemons
        self.counter = ConnectionCounter(options.proc_net, options.ports, exclude=(self.http.port,))
        probes = ShutdownProbes(daemons, options.pod_ips, self.counter)
        self.barrier = SharedBarrier(options.barrier, options.pod_ips, probes, clock, sleep)
        self.barrier.listeners.append(self.http.server.wake)
        # The barrier's outcome as an Event on this pod (CONTRACT.md, the shutdown-manager).
        self.events = events
        self._events_stop = threading.Event()
        if events is not None:
            # Before the wake: a caller answered is a preStop that returned, and the SIGTERM
            # that follows must find the Event already pending (finish() flushes it).
            self.barrier.listeners.insert(0, self._record_outcome)

    @property
    def port(self) -> int:
        return self.http.port

    def _shutdown(self, q: dict[str, list[str]]) -> Park:
        from ipvsctl.httpd import Park

        # Protected: no bound ever closes a waiting /shutdown (the kubelet would take the
        # closed connection as "done"), whoever else holds connections.
        return Park(_ShutdownCall(self.barrier.call()), protected=True)

    def _record_outcome(self) -> None:
        """A barrier run ended (the barrier's thread): its Event, queued, never waited for."""
        from ipvsctl.plan.events import quiesce_outcome
        from ipvsctl.shutdown.barrier import Outcome

        result, pod = self.barrier.result, self.options.pod
        if result is None or pod is None or self.events is None:
            return
        self.events.record(
            quiesce_outcome(
                pod,
                quiesced=result.outcome is not Outcome.TIMEOUT,
                nodes=len(result.daemons),
                seconds=result.elapsed,
                still_sending=[_host(d) for d in result.not_quiesced],
                established=result.connections,
            )
        )

    def start(self) -> None:
        if self.events is not None:
            threading.Thread(
                target=self.events.run,
                args=(self._events_stop,),
                name="events",
                daemon=True,
            ).start()
        self.http.start()
        o = self.options
        log.info(
            "shutdown-manager started",
            extra=fields(
                listen=f"{o.listen} (port {self.http.port})",
                pod_ips=",".join(o.pod_ips),
                trusted=",".join(sorted(self.trusted)) or "-",
                daemons=str(self.daemons),
                ports=",".join(map(str, o.ports)) or f"listening ports except {self.http.port}",
                timeout=o.barrier.timeout,
                check_interval=o.barrier.check_interval,
                check_delay=o.barrier.check_delay,
                min_open_connections=o.barrier.min_open_connections,
                wait_connections=o.barrier.wait_connections,
            ),
        )

    def finish(self) -> None:
        """On SIGTERM: a barrier that has started is seen to its end (never past its
        deadline) and its replies written; then the server stops."""
        if self.barrier.started:
            self.barrier.settle()
            self.http.server.wake()
            self.http.server.wait_answered(REPLY_GRACE)
        if self.events is not None:
            self.events.flush(EVENT_GRACE)
        self.stop()

    def stop(self) -> None:
        self._events_stop.set()
        self.http.stop()


def _host(daemon_url: str) -> str:
    """A daemon's node, as its URL names it (the node's address: the daemons run on the
    host network)."""
    return urlsplit(daemon_url).hostname or daemon_url


def open_events(
    options: ManagerOptions, environ: Mapping[str, str] | None = None
) -> EventWriter | None:
    """The Events writer on the pod's own service account; None (and one line saying why)
    when the pod is not known or there are no API credentials."""
    if options.pod is None:
        log.info("pod name not known (--pod-name, --pod-namespace): no Event of the outcome")
        return None
    from ipvsctl.kube.config import load_configuration, new_api_client
    from ipvsctl.kube.events import EventWriter
    from ipvsctl.source.events import SourceConfigError

    try:
        cfg = load_configuration(None, None, environ=environ or os.environ, proxy=False)
    except SourceConfigError as exc:
        log.warning("no API credentials: no Event of the outcome", extra=fields(error=exc))
        return None
    return EventWriter(new_api_client(cfg), instance=f"shutdown-manager-{options.pod.name}")


class _ShutdownCall:
    """A parked GET /shutdown (`ipvsctl.httpd.Waiter`): its barrier ticket, polled by the
    HTTP server's selector thread; always 200 with the result, never another answer."""

    def __init__(self, ticket: Ticket) -> None:
        self.ticket = ticket

    @property
    def deadline(self) -> float:
        """When the caller's own deadline comes, on the server's clock."""
        t = self.ticket
        return time.monotonic() + max(0.0, t.deadline - t.shared.clock())

    def poll(self, now: float) -> Response | None:
        from ipvsctl.httpd import Response

        result = self.ticket.poll(self.ticket.shared.clock())
        if result is None:
            return None
        return Response(
            200, "application/json", (json.dumps(result.to_json(), indent=1) + "\n").encode()
        )

    def cancel(self) -> None:
        self.ticket.cancel()


def run(options: ManagerOptions) -> int:
    manager = ShutdownManager(options, events=open_events(options))
    serve_until_signal(manager.start)
    log.info(
        "signal received, stopping",
        extra=fields(
            barrier="done"
            if manager.barrier.done
            else "running"
            if manager.barrier.started
            else "not started"
        ),
    )
    manager.finish()
    return 0


# --- flags --------------------------------------------------------------------------------

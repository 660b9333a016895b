"""`ipvsctl shutdown-manager`: a sidecar whose /shutdown is an application's preStop hook.

GET /shutdown blocks until every node's ipvsctl daemon says the pod's IPs are quiesced (no
real server with weight > 0 left for them), then until the pod's established connections on
the watched ports are at most --min-open-connections, never longer than --timeout; then it
answers 200 with a JSON account of what happened, and the kubelet goes on to SIGTERM.
Concurrent calls share one barrier, but each gets an answer made after it came: an early or
stray call never leaves a result that makes the real preStop return at once. A waiting call
holds no thread (the HTTP server parks it: `ipvsctl.httpd.Park`), and the server's bounds are
per peer, so no number of other connections or calls makes the preStop's be refused,
evicted or answered early. /healthz is for the liveness probe, /status shows the barrier
while it runs. See docs/shutdown-manager.md.

Wiring only: the barrier is ipvsctl.shutdown.barrier, the probes ipvsctl.shutdown.probes.
The HTTP server and the probes are imported where they are used, so that registering the
command costs the rest of the CLI nothing.
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated

import typer

from ipvsctl.model import normalize_ip
from ipvsctl.obs.logging import fields
from ipvsctl.shell.signals import serve_until_signal
from ipvsctl.shutdown import DEFAULT_DAEMON_PORT, DEFAULT_DAEMON_SERVICE
from ipvsctl.shutdown.barrier import BarrierConfig
from ipvsctl.source.duration import parse_duration as _parse_duration

if TYPE_CHECKING:
    from ipvsctl.httpd import Park, Response
    from ipvsctl.shutdown.probes import Resolver
    from ipvsctl.shutdown.runner import Clock, Sleep, Ticket

log = logging.getLogger("ipvsctl.shutdown")

DEFAULT_LISTEN = "0.0.0.0:9797"
DEFAULT_TIMEOUT = 25.0  # below the default terminationGracePeriodSeconds (30) by 5 s
REPLY_GRACE = 5.0  # on SIGTERM, longest wait for /shutdown replies still being written


class StartupError(Exception):
    """A fatal start-up problem; the message is the one line the user sees."""


@dataclass(frozen=True, slots=True)
class ManagerOptions:
    pod_ips: tuple[str, ...]
    listen: str = DEFAULT_LISTEN
    daemons: tuple[str, ...] = ()
    """Explicit daemon base URLs; empty: look them up in DNS (daemon_service)."""
    daemon_service: str = DEFAULT_DAEMON_SERVICE
    daemon_port: int = DEFAULT_DAEMON_PORT
    ports: tuple[int, ...] = ()
    """Watched local ports; empty: every listening port but the manager's own."""
    proc_net: str = "/proc/net"
    node_ips: tuple[str, ...] = ()
    """The node's addresses (the kubelet's probes and preStop come from there): trusted
    like loopback, never refused or evicted by the server's bounds."""
    barrier: BarrierConfig = field(default_factory=lambda: BarrierConfig(timeout=DEFAULT_TIMEOUT))


class ShutdownManager:
    """The running sidecar, so tests can run it in-process (clock, sleep and the DNS resolver
    injectable; daemons and /proc/net come from the options)."""

    def __init__(self, options: ManagerOptions, clock: Clock = time.monotonic,
                 sleep: Sleep = time.sleep, resolve: Resolver | None = None) -> None:
        from ipvsctl.httpd import Limits
        from ipvsctl.shell.http import HTTPServer, as_json, is_loopback, text
        from ipvsctl.shutdown.probes import (
            ConnectionCounter,
            DnsDaemons,
            ShutdownProbes,
            StaticDaemons,
            resolve_addresses,
        )
        from ipvsctl.shutdown.runner import SharedBarrier

        # A waiting /shutdown holds a socket, not a thread (parked); per peer at most 16
        # connections, so one address's flood or strays only ever close its own.
        limits = Limits(max_connections=1024, max_per_peer=16, workers=4)
        self.options = options
        trusted = frozenset(options.node_ips)
        try:
            self.http = HTTPServer(options.listen, {
                "/shutdown": self._shutdown,
                "/healthz": lambda q: text(200, "ok\n"),
                "/status": lambda q: as_json(200, self.barrier.status()),
            }, limits=limits, name="shutdown-manager",
                is_local=lambda peer: is_loopback(peer) or peer in trusted)
        except (OSError, ValueError) as exc:
            raise StartupError(f"--listen {options.listen}: {exc}") from None
        daemons = (StaticDaemons(options.daemons) if options.daemons
                   else DnsDaemons(options.daemon_service, options.daemon_port,
                                   resolve or resolve_addresses))
        self.daemons: StaticDaemons | DnsDaemons = daemons
        self.counter = ConnectionCounter(options.proc_net, options.ports,
                                         exclude=(self.http.port,))
        probes = ShutdownProbes(daemons, options.pod_ips, self.counter)
        self.barrier = SharedBarrier(options.barrier, options.pod_ips, probes, clock, sleep)
        self.barrier.listeners.append(self.http.server.wake)

    @property
    def port(self) -> int:
        return self.http.port

    def _shutdown(self, q: dict[str, list[str]]) -> Park:
        from ipvsctl.httpd import Park

        return Park(_ShutdownCall(self.barrier.call()))

    def start(self) -> None:
        self.http.start()
        o = self.options
        log.info("shutdown-manager started", extra=fields(
            listen=f"{o.listen} (port {self.http.port})", pod_ips=",".join(o.pod_ips),
            daemons=str(self.daemons),
            ports=",".join(map(str, o.ports)) or f"listening ports except {self.http.port}",
            timeout=o.barrier.timeout, check_interval=o.barrier.check_interval,
            check_delay=o.barrier.check_delay,
            min_open_connections=o.barrier.min_open_connections,
            wait_connections=o.barrier.wait_connections))

    def finish(self) -> None:
        """On SIGTERM: a barrier that has started is seen to its end (never past its
        deadline) and its replies written; then the server stops."""
        if self.barrier.started:
            self.barrier.settle()
            self.http.server.wake()
            self.http.server.wait_answered(REPLY_GRACE)
        self.stop()

    def stop(self) -> None:
        self.http.stop()


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
        return Response(200, "application/json",
                        (json.dumps(result.to_json(), indent=1) + "\n").encode())

    def cancel(self) -> None:
        self.ticket.cancel()


def run(options: ManagerOptions) -> int:
    manager = ShutdownManager(options)
    serve_until_signal(manager.start)
    log.info("signal received, stopping", extra=fields(
        barrier="done" if manager.barrier.done else
        "running" if manager.barrier.started else "not started"))
    manager.finish()
    return 0


# --- flags --------------------------------------------------------------------------------

def parse_duration(value: str) -> float:
    """Seconds from `25`, `25s`, `500ms`, `1m` or `1m30s` (Contour's flags take Go
    durations); one parser for every duration of ipvsctl."""
    return _parse_duration(value)


def _fail(message: str, code: int = 2) -> typer.Exit:
    typer.echo(f"ipvsctl: {message}", err=True)
    return typer.Exit(code)


def _duration(flag: str, value: str, positive: bool = False) -> float:
    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        raise _fail(f"{flag}: {exc}") from None
    if positive and seconds <= 0:
        raise _fail(f"{flag} {value}: must be > 0")
    return seconds


def _ips(values: list[str] | None, flag: str) -> tuple[str, ...]:
    ips: list[str] = []
    for value in values or []:
        for part in re.split(r"[,\s]+", value.strip()):
            if not part:
                continue
            try:
                ips.append(normalize_ip(part))
            except ValueError:
                raise _fail(f"{flag} {part}: not an IP address") from None
    return tuple(dict.fromkeys(ips))


def _pod_ips(values: list[str] | None) -> tuple[str, ...]:
    ips = _ips(values, "--pod-ip")
    if not ips:
        raise _fail("--pod-ip (or env POD_IP, from the downward API's status.podIP) is "
                    "required")
    return tuple(dict.fromkeys(ips))


def register(app: typer.Typer) -> None:
    """Add the `shutdown-manager` command to the ipvsctl CLI."""
    app.command("shutdown-manager")(shutdown_manager)


def shutdown_manager(
    node_ip: Annotated[list[str] | None, typer.Option(
        "--node-ip", envvar="HOST_IP",
        help="The node's address (repeatable or comma-separated): the kubelet's probes and "
             "preStop come from it, so it is never refused or evicted, like loopback; from "
             "env HOST_IP (the downward API's status.hostIP) by default.")] = None,
    pod_ip: Annotated[list[str] | None, typer.Option(
        "--pod-ip", envvar="POD_IP",
        help="This pod's IP (repeatable or comma-separated, for dual-stack); "
             "from env POD_IP (the downward API) by default.")] = None,
    listen: Annotated[str, typer.Option(
        "--listen", help="HOST:PORT for /shutdown, /healthz and /status "
                         "([::]:PORT for IPv6).")] = DEFAULT_LISTEN,
    daemon: Annotated[list[str] | None, typer.Option(
        "--daemon", help="A daemon's base URL, e.g. http://10.0.0.5:9796 (repeatable); "
                         "replaces the DNS lookup.")] = None,
    daemon_service: Annotated[str, typer.Option(
        "--daemon-service", help="DNS name whose A/AAAA records are the daemons (the "
                                 "DaemonSet's headless metrics Service).")
    ] = DEFAULT_DAEMON_SERVICE,
    daemon_port: Annotated[int, typer.Option(
        "--daemon-port", min=1, max=65535, help="The daemons' HTTP port.")
    ] = DEFAULT_DAEMON_PORT,
    port: Annotated[list[int] | None, typer.Option(
        "--port", min=1, max=65535,
        help="Local port whose established connections are counted (repeatable); "
             "every listening port but --listen's by default.")] = None,
    min_open_connections: Annotated[int, typer.Option(
        "--min-open-connections", min=0,
        help="Connections stage ends at this many established connections or fewer.")] = 0,
    wait_connections: Annotated[bool, typer.Option(
        "--wait-connections/--no-wait-connections",
        help="After the daemons, wait for the pod's connections to drain.")] = True,
    check_interval: Annotated[str, typer.Option(
        "--check-interval", help="Time between checks (seconds, or 500ms, 2s...).")] = "1s",
    check_delay: Annotated[str, typer.Option(
        "--check-delay", help="Wait this long after the first /shutdown before the first "
                              "check.")] = "0s",
    timeout: Annotated[str, typer.Option(
        "--timeout", help="Longest /shutdown ever blocks; keep it below the pod's "
                          "terminationGracePeriodSeconds.")] = "25s",
    proc_net: Annotated[str, typer.Option(
        "--proc-net", help="Where tcp and tcp6 are read from (tests).")] = "/proc/net",
    log_format: Annotated[str, typer.Option("--log-format", help="text or json.")] = "text",
    log_level: Annotated[str, typer.Option(
        "--log-level", metavar="LEVEL", help="debug, info, warning or error.")] = "info",
) -> None:
    """Sidecar: a preStop /shutdown that waits until no node sends this pod new connections.

    GET /shutdown (the app's preStop httpGet) returns once every node's ipvsctl daemon says
    this pod's IPs are quiesced and the pod's own connections have drained, or at --timeout.
    See docs/shutdown-manager.md.
    """
    from ipvsctl.obs import logging as obs_logging
    from ipvsctl.shutdown.probes import normalize_daemon_url

    if log_format not in ("text", "json"):
        raise _fail(f"--log-format {log_format}: must be text or json")
    try:
        level = obs_logging.parse_level(log_level)
    except ValueError as exc:
        raise _fail(f"--log-level {log_level}: {exc}") from None
    if ":" not in listen or not listen.rpartition(":")[2].isdigit():
        raise _fail(f"--listen {listen}: must be HOST:PORT")
    daemons: list[str] = []
    for url in daemon or []:
        try:
            daemons.append(normalize_daemon_url(url))
        except ValueError as exc:
            raise _fail(f"--daemon: {exc}") from None
    options = ManagerOptions(
        pod_ips=_pod_ips(pod_ip), listen=listen, daemons=tuple(daemons),
        daemon_service=daemon_service, daemon_port=daemon_port,
        ports=tuple(dict.fromkeys(port or [])), proc_net=proc_net,
        node_ips=_ips(node_ip, "--node-ip"),
        barrier=BarrierConfig(
            check_interval=_duration("--check-interval", check_interval, positive=True),
            check_delay=_duration("--check-delay", check_delay),
            timeout=_duration("--timeout", timeout),
            min_open_connections=min_open_connections,
            wait_connections=wait_connections,
        ),
    )
    obs_logging.setup(log_format, level)
    try:
        code = run(options)
    except StartupError as exc:
        raise _fail(str(exc), 1) from None
    raise typer.Exit(code)

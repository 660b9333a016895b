"""`ipvsctl shutdown-manager`: the flags of the sidecar whose /shutdown is an application's
preStop hook; the sidecar itself is ipvsctl.daemon.shutdown_manager (docs/shutdown-manager.md).
"""

from __future__ import annotations

import re
from typing import Annotated

import typer

from ipvsctl.cli.params import host_port
from ipvsctl.daemon.shutdown_manager import (
    DEFAULT_LISTEN,
    ManagerOptions,
    ShutdownManager,
    StartupError,
    run,
)
from ipvsctl.model import PodRef, normalize_ip
from ipvsctl.shutdown import DEFAULT_DAEMON_PORT, DEFAULT_DAEMON_SERVICES
from ipvsctl.shutdown.barrier import BarrierConfig
from ipvsctl.source.duration import parse_duration as _parse_duration

__all__ = ["ManagerOptions", "ShutdownManager", "parse_duration", "register"]


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
        raise _fail("--pod-ip (or env POD_IP, from the downward API's status.podIP) is required")
    return tuple(dict.fromkeys(ips))


_DNS_LABELS = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


def _pod(name: str | None, namespace: str | None, uid: str | None) -> PodRef | None:
    """This pod, when both its name and namespace are given (else None: no Event)."""
    if not name and not namespace:
        return None
    for flag, value in (("--pod-name", name), ("--pod-namespace", namespace)):
        if not value or not _DNS_LABELS.match(value):
            raise _fail(f"{flag} {value or '(empty)'}: not a Kubernetes name")
    if uid is not None and (len(uid) > 64 or not re.fullmatch(r"[-0-9a-fA-F]*", uid)):
        raise _fail(f"--pod-uid {uid}: not a uid")
    assert name is not None and namespace is not None
    return PodRef(namespace, name, uid or "")


def register(app: typer.Typer) -> None:
    """Add the `shutdown-manager` command to the ipvsctl CLI."""
    app.command("shutdown-manager")(shutdown_manager)


def shutdown_manager(
    node_ip: Annotated[
        list[str] | None,
        typer.Option(
            "--node-ip",
            metavar="IP",
            envvar="HOST_IP",
            help="The node's address (repeatable or comma-separated): the kubelet's probes and "
            "preStop come from it, so it is never refused or evicted, like loopback and the "
            "pod's default gateways; from env HOST_IP (the downward API's status.hostIP) by "
            "default.",
        ),
    ] = None,
    pod_ip: Annotated[
        list[str] | None,
        typer.Option(
            "--pod-ip",
            metavar="IP",
            envvar="POD_IP",
            help="This pod's IP (repeatable or comma-separated, for dual-stack); "
            "from env POD_IP (the downward API) by default.",
        ),
    ] = None,
    pod_name: Annotated[
        str | None,
        typer.Option(
            "--pod-name",
            metavar="NAME",
            envvar="POD_NAME",
            help="This pod's name (env POD_NAME, the downward API's metadata.name): with "
            "--pod-namespace, the barrier's outcome is recorded as an Event on the pod.",
        ),
    ] = None,
    pod_namespace: Annotated[
        str | None,
        typer.Option(
            "--pod-namespace",
            metavar="NS",
            envvar="POD_NAMESPACE",
            help="This pod's namespace (env POD_NAMESPACE, metadata.namespace).",
        ),
    ] = None,
    pod_uid: Annotated[
        str | None,
        typer.Option(
            "--pod-uid",
            metavar="UID",
            envvar="POD_UID",
            help="This pod's uid (env POD_UID, metadata.uid): the Event names this very pod.",
        ),
    ] = None,
    listen: Annotated[
        str,
        typer.Option(
            "--listen",
            metavar="HOST:PORT",
            help="HOST:PORT for /shutdown, /healthz and /status ([::]:PORT for IPv6).",
        ),
    ] = DEFAULT_LISTEN,
    daemon: Annotated[
        list[str] | None,
        typer.Option(
            "--daemon",
            metavar="URL",
            help="A daemon's base URL, e.g. http://10.0.0.5:9796 (repeatable); "
            "replaces the DNS lookup.",
        ),
    ] = None,
    daemon_service: Annotated[
        list[str] | None,
        typer.Option(
            "--daemon-service",
            metavar="NAME",
            help="DNS name whose A/AAAA records are the daemons (the DaemonSet's headless "
            "metrics Service; repeatable: the daemons of every name that exists). Default: "
            "ipvsctl-metrics in ipvsctl-system and in kube-system.",
        ),
    ] = None,
    daemon_port: Annotated[
        int,
        typer.Option(
            "--daemon-port", metavar="PORT", min=1, max=65535, help="The daemons' HTTP port."
        ),
    ] = DEFAULT_DAEMON_PORT,
    port: Annotated[
        list[int] | None,
        typer.Option(
            "--port",
            metavar="PORT",
            min=1,
            max=65535,
            help="Local port whose established connections are counted (repeatable); "
            "every listening port but --listen's by default.",
        ),
    ] = None,
    min_open_connections: Annotated[
        int,
        typer.Option(
            "--min-open-connections",
            metavar="N",
            min=0,
            help="Connections stage ends at this many established connections or fewer.",
        ),
    ] = 0,
    wait_connections: Annotated[
        bool,
        typer.Option(
            "--wait-connections/--no-wait-connections",
            help="After the daemons, wait for the pod's connections to drain.",
        ),
    ] = True,
    check_interval: Annotated[
        str,
        typer.Option(
            "--check-interval",
            metavar="DURATION",
            help="Time between checks (seconds, or 500ms, 2s...).",
        ),
    ] = "1s",
    check_delay: Annotated[
        str,
        typer.Option(
            "--check-delay",
            metavar="DURATION",
            help="Wait this long after the first /shutdown before the first check.",
        ),
    ] = "0s",
    timeout: Annotated[
        str,
        typer.Option(
            "--timeout",
            metavar="DURATION",
            help="Longest /shutdown ever blocks; keep it below the pod's "
            "terminationGracePeriodSeconds.",
        ),
    ] = "25s",
    proc_net: Annotated[
        str,
        typer.Option("--proc-net", metavar="DIR", help="Where tcp and tcp6 are read from (tests)."),
    ] = "/proc/net",
    log_format: Annotated[
        str, typer.Option("--log-format", metavar="FORMAT", help="text or json.")
    ] = "text",
    log_level: Annotated[
        str, typer.Option("--log-level", metavar="LEVEL", help="debug, info, warning or error.")
    ] = "info",
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
    try:
        host_port(listen)
    except ValueError as exc:
        raise _fail(f"--listen {listen}: {exc}") from None
    daemons: list[str] = []
    for url in daemon or []:
        try:
            daemons.append(normalize_daemon_url(url))
        except ValueError as exc:
            raise _fail(f"--daemon: {exc}") from None
    options = ManagerOptions(
        pod_ips=_pod_ips(pod_ip),
        listen=listen,
        daemons=tuple(daemons),
        daemon_services=tuple(dict.fromkeys(daemon_service or DEFAULT_DAEMON_SERVICES)),
        daemon_port=daemon_port,
        ports=tuple(dict.fromkeys(port or [])),
        proc_net=proc_net,
        node_ips=_ips(node_ip, "--node-ip"),
        pod=_pod(pod_name, pod_namespace, pod_uid),
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

"""The `ipvsctl` command: run, status, plan (and the commands registered from their modules)."""

from __future__ import annotations

import dataclasses
import enum
import math
import os
import re
import socket
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
import typer.core

from ipvsctl.cli.cleanup import register as register_cleanup
from ipvsctl.cli.config_file import (
    FILE_FLAGS,
    ConfigFileError,
    log_config_notes,
    read_config_file,
)
from ipvsctl.cli.node_drain import register as register_node_drain
from ipvsctl.cli.output import Output, choose, dump
from ipvsctl.cli.params import daemon_url, host_port, split_short_equals
from ipvsctl.cli.shutdown_manager import register as register_shutdown_manager
from ipvsctl.cli.version import register as register_version
from ipvsctl.model import NodeContext, normalize_ip
from ipvsctl.model.desired import DEFAULT_MAX_TABLE_ENTRIES


class _Commands(typer.core.TyperGroup):
    """kubectl's `-o=json` as well as `-o json` (params.split_short_equals); the shell
    completion of `ipvsctl completion SHELL`'s scripts."""

    def main(self, args: Any = None, *rest: Any, **kw: Any) -> Any:
        from typer._completion_classes import completion_init

        completion_init()  # what add_completion would register: typer's bash, zsh, fish
        return super().main(split_short_equals(sys.argv[1:] if args is None else args), *rest, **kw)


app = typer.Typer(
    cls=_Commands,
    # `ipvsctl completion SHELL`, as kubectl's (below), instead of typer's options
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    no_args_is_help=True,
    help="A per-node Kubernetes service proxy on Linux IPVS with graceful termination.",
    pretty_exceptions_enable=False,
    # Plain click help: rich truncates long option names at 80 columns and reads
    # "[default: ...]" in help strings as markup, swallowing it.
    rich_markup_mode=None,
)


def _version(value: bool) -> None:
    if value:
        from ipvsctl import __version__

        typer.echo(f"ipvsctl {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", is_eager=True, callback=_version, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """A per-node Kubernetes service proxy on Linux IPVS with graceful termination."""


OutputOpt = Annotated[
    Output | None,
    typer.Option(
        "-o",
        "--output",
        metavar="FORMAT",
        help="Output format: table, wide, json or yaml [default: table].",
        show_default=False,
    ),
]
AsJson = Annotated[bool, typer.Option("--json", help="Same as -o json.")]


def _output(output: Output | None, as_json: bool) -> Output:
    try:
        return choose(output, as_json)
    except ValueError as exc:
        raise _fail(str(exc), 2) from None


NodeName = Annotated[
    str | None,
    typer.Option(
        "--node-name", metavar="NAME", envvar="NODE_NAME", help="This node [default: hostname]."
    ),
]
NodeIPs = Annotated[
    list[str] | None,
    typer.Option(
        "--node-ip",
        metavar="IP",
        help="Addresses NodePorts listen on (repeatable) [default: the node's global addresses].",
    ),
]
Scheduler = Annotated[
    str, typer.Option("--scheduler", metavar="NAME", help="Default IPVS scheduler.")
]
NodePortRange = Annotated[
    str,
    typer.Option(
        "--service-node-port-range",
        metavar="A-B",
        help="The cluster's NodePort range (the API server's flag): which virtual servers "
        "on node addresses are ipvsctl's; a node address at another port is never one.",
    ),
]
MaxVirtualServers = Annotated[
    int,
    typer.Option(
        "--max-virtual-servers-per-service",
        metavar="N",
        min=1,
        help="A Service that would make more virtual servers is refused whole.",
    ),
]
MaxTableEntries = Annotated[
    int,
    typer.Option(
        "--max-table-entries",
        metavar="N",
        min=1,
        help="The most IPVS entries (virtual servers plus their real servers) the node's "
        "Services may make; past it, the newest Services are refused whole.",
    ),
]
ServiceProxyName = Annotated[
    str | None,
    typer.Option(
        "--service-proxy-name",
        metavar="NAME",
        help="Serve only Services labelled "
        "service.kubernetes.io/service-proxy-name=NAME (default: only Services "
        "without that label).",
    ),
]


def _fail(message: str, code: int = 1) -> typer.Exit:
    """One line on stderr; a JSON log line once `run --log-format json` set logging up."""
    from ipvsctl.obs import logging as obs_logging

    if obs_logging.json_configured():
        import logging

        from ipvsctl.obs.logging import fields

        logging.getLogger("ipvsctl").critical(message, extra=fields(exit_code=code))
    else:
        typer.echo(f"ipvsctl: {message}", err=True)
    return typer.Exit(code)


def _listen(flag: str, value: str) -> str:
    try:
        host_port(value)
    except ValueError as exc:
        raise _fail(f"{flag} {value}: {exc}", 2) from None
    return value


def _endpoint(value: str) -> str:
    try:
        return daemon_url(value)
    except ValueError as exc:
        raise _fail(f"--endpoint {value}: {exc}", 2) from None


def _placeholder(url: str) -> bool:
    """A host under `.invalid` (RFC 6761: never resolves), as daemonset/kustomization.yaml
    ships: a daemon started with it would retry forever and never get ready."""
    import urllib.parse

    host = (urllib.parse.urlsplit(url.strip()).hostname or "").rstrip(".")
    return host == "invalid" or host.endswith(".invalid")


# A Kubernetes label value (it goes into the Service watch's label selector).
_LABEL_VALUE = re.compile(r"^(?:[A-Za-z0-9](?:[A-Za-z0-9._-]{0,61}[A-Za-z0-9])?)?$")


def _seconds(flag: str, value: str, minimum: float = 0.0) -> float:
    """A SECONDS flag: plain seconds or a Go duration (CONTRACT.md "Durations"); exit 2."""
    from ipvsctl.source.duration import parse_duration

    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        raise _fail(f"{flag}: {exc}", 2) from None
    if seconds < minimum:
        raise _fail(f"{flag} {value}: must be at least {minimum:g} seconds", 2)
    return seconds


def _node(
    node_name: str | None,
    node_ips: list[str] | None,
    scheduler: str,
    interface: str = "kube-ipvs0",
    service_proxy_name: str | None = None,
    host_addresses: bool = True,
    node_port_range: str = "30000-32767",
    max_virtual_servers: int = 1024,
    node_port_cidrs: tuple[str, ...] = (),
    max_table_entries: int = DEFAULT_MAX_TABLE_ENTRIES,
) -> NodeContext:
    """The node's flags checked (exit 2); without --node-ip, the host's addresses, unless
    `host_addresses` is False (`plan` may find them in the input)."""
    from ipvsctl.model.ipvs import IPVS_SCHEDULERS
    from ipvsctl.model.portrange import parse_port_range

    try:
        node_ports = parse_port_range(node_port_range)
    except ValueError as exc:
        raise _fail(f"--service-node-port-range {exc}", 2) from None

    if service_proxy_name is not None and not _LABEL_VALUE.match(service_proxy_name):
        raise _fail(
            f"--service-proxy-name {service_proxy_name!r}: not a label value (up "
            "to 63 of A-Z a-z 0-9 - _ ., starting and ending alphanumeric)",
            2,
        )

    if scheduler not in IPVS_SCHEDULERS:
        raise _fail(
            f"--scheduler {scheduler}: unknown IPVS scheduler "
            f"(one of {', '.join(sorted(IPVS_SCHEDULERS))})",
            2,
        )
    ips: list[str] = []
    if node_ips:
        for ip in node_ips:
            try:
                ips.append(normalize_ip(ip))
            except ValueError:
                raise _fail(f"--node-ip {ip}: not an IP address", 2) from None
    elif host_addresses:
        from ipvsctl.model.cidrs import in_cidrs

        ips = in_cidrs(_host_addresses(interface), node_port_cidrs)
    return NodeContext(
        node_name or socket.gethostname(),
        tuple(dict.fromkeys(ips)),
        scheduler,
        service_proxy_name=service_proxy_name or None,
        node_port_range=node_ports,
        max_virtual_servers=max_virtual_servers,
        max_table_entries=max_table_entries,
    )


def _host_addresses(interface: str) -> list[str]:
    try:
        from ipvsctl.kernel.netlink.addresses import node_addresses

        # The VIP interface's addresses are ClusterIPs, never NodePort addresses.
        return node_addresses(exclude_interfaces=(interface,))
    except Exception as exc:  # no netlink route socket: plan still works without
        typer.echo(
            f"ipvsctl: cannot read the node's addresses ({exc}); NodePorts need --node-ip",
            err=True,
        )
        return []


def _all_addresses(interface: str) -> frozenset[str]:
    """Every address of this machine (Node safety's), or none when they cannot be read."""
    try:
        from ipvsctl.kernel.netlink.address_watch import HostAddressWatch

        watch = HostAddressWatch(interface).open()
        watch.close()
        return watch.host_addresses()
    except Exception:  # said once already by _host_addresses when netlink is missing
        return frozenset()


@app.command()
def plan(
    files: Annotated[
        list[Path],
        typer.Option(
            "-f",
            "--filename",
            metavar="PATH",
            help=("Manifest file or folder (*.yaml, *.yml, *.json; repeatable; - reads stdin)."),
        ),
    ],
    node_name: NodeName = None,
    node_ip: NodeIPs = None,
    scheduler: Scheduler = "rr",
    service_proxy_name: ServiceProxyName = None,
    service_node_port_range: NodePortRange = "30000-32767",
    max_virtual_servers_per_service: MaxVirtualServers = 1024,
    max_table_entries: MaxTableEntries = DEFAULT_MAX_TABLE_ENTRIES,
    output: OutputOpt = None,
    as_json: AsJson = False,
) -> None:
    """Print the IPVS state the daemon would program for these manifests (no kernel)."""
    from ipvsctl.cli.render import plan_json, plan_text
    from ipvsctl.manifests import ManifestError, load_paths
    from ipvsctl.model import VirtualServerKind
    from ipvsctl.reconcile.cluster import node_object_addresses, plan_objects

    fmt = _output(output, as_json)
    node = _node(
        node_name,
        node_ip,
        scheduler,
        service_proxy_name=service_proxy_name,
        host_addresses=False,
        node_port_range=service_node_port_range,
        max_virtual_servers=max_virtual_servers_per_service,
        max_table_entries=max_table_entries,
    )
    try:
        objects = load_paths(files)
    except ManifestError as exc:
        raise _fail(str(exc), 2) from None
    # A cluster dump's NodePorts are on its Node's addresses, not on this machine's.
    from_node = None if node_ip else node_object_addresses(objects, node.node_name)
    if not node_ip:
        ips = from_node or tuple(dict.fromkeys(_host_addresses("kube-ipvs0")))
        node = dataclasses.replace(node, node_ips=ips)
        if not from_node:  # planned as this machine: Node safety counts all its addresses
            node = dataclasses.replace(node, host_ips=_all_addresses("kube-ipvs0"))
    result, problems = plan_objects(objects, node)
    for p in problems:
        what = "skipped" if p.fatal else "warning"
        typer.echo(f"ipvsctl: {p.kind.value} {p.name} {what}: {p.reason}", err=True)
    if not node_ip and any(dvs.kind is VirtualServerKind.NODE_PORT for _, dvs in result):
        source = (
            f"Node {node.node_name}'s InternalIP/ExternalIP addresses"
            if from_node
            else f"this machine's addresses (no Node {node.node_name} in the input; --node-name or "
            "--node-ip to choose)"
        )
        shown = ", ".join(node.node_ips) or "none"
        typer.echo(f"ipvsctl: NodePorts on {shown}: {source}", err=True)
    if fmt in (Output.json, Output.yaml):
        typer.echo(dump(plan_json(result), fmt), nl=False)
    else:
        typer.echo(plan_text(result, wide=fmt is Output.wide), nl=False)


@app.command()
def run(
    ctx: typer.Context,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            metavar="FILE",
            help="kube-proxy's KubeProxyConfiguration file (v1alpha1); flags given here win.",
        ),
    ] = None,
    kubeconfig: Annotated[
        str | None,
        typer.Option(
            "--kubeconfig",
            envvar="KUBECONFIG",
            metavar="PATH",
            help="Kubeconfig file [default: in-cluster].",
        ),
    ] = None,
    apiserver: Annotated[
        str | None,
        typer.Option(
            "--apiserver",
            metavar="URL",
            envvar="IPVSCTL_APISERVER",
            help="API server URL (overrides the kubeconfig's; http:// allowed).",
        ),
    ] = None,
    manifests: Annotated[
        str | None,
        typer.Option(
            "--manifests",
            metavar="DIR",
            help="Standalone: follow Services/EndpointSlices/Pods in this folder.",
        ),
    ] = None,
    node_name: NodeName = None,
    node_ip: NodeIPs = None,
    interface: Annotated[
        str, typer.Option(metavar="NAME", help="Dummy interface holding the VIPs.")
    ] = ("kube-ipvs0"),
    scheduler: Scheduler = "rr",
    service_proxy_name: ServiceProxyName = None,
    service_node_port_range: NodePortRange = "30000-32767",
    max_virtual_servers_per_service: MaxVirtualServers = 1024,
    max_table_entries: MaxTableEntries = DEFAULT_MAX_TABLE_ENTRIES,
    drain_timeout: Annotated[
        str,
        typer.Option(
            "--drain-timeout",
            metavar="DURATION",
            help="Longest drain when no better deadline is known (30, 2.5, 30s, 5m...).",
        ),
    ] = "30",
    service_drain_timeout: Annotated[
        str,
        typer.Option(
            "--service-drain-timeout",
            metavar="DURATION",
            help="Longest drain of a virtual server that leaves the wanted set (its Service "
            "deleted, a port or address removed); 0: removed at once.",
        ),
    ] = "30",
    drain_check_interval: Annotated[
        str,
        typer.Option(
            "--drain-check-interval",
            metavar="DURATION",
            help="Time between connection-count reads (1, 500ms...).",
        ),
    ] = "1",
    ipvs_tcp_timeout: Annotated[
        str,
        typer.Option(
            "--ipvs-tcp-timeout",
            metavar="DURATION",
            help="IPVS TCP timeout (0: kernel's; 900, 15m...).",
        ),
    ] = "0",
    ipvs_tcpfin_timeout: Annotated[
        str,
        typer.Option(
            "--ipvs-tcpfin-timeout", metavar="DURATION", help="IPVS TCP FIN timeout (0: kernel's)."
        ),
    ] = "0",
    ipvs_udp_timeout: Annotated[
        str,
        typer.Option(
            "--ipvs-udp-timeout", metavar="DURATION", help="IPVS UDP timeout (0: kernel's)."
        ),
    ] = "0",
    state_dir: Annotated[
        str,
        typer.Option("--state-dir", metavar="DIR", help="Where the drain queue survives restarts."),
    ] = "/var/lib/ipvsctl",
    listen: Annotated[
        str,
        typer.Option(
            "--listen",
            metavar="HOST:PORT",
            help="HOST:PORT for /metrics, /healthz, /readyz, /status.",
        ),
    ] = "0.0.0.0:9796",
    log_format: Annotated[
        str, typer.Option("--log-format", metavar="FORMAT", help="text or json.")
    ] = "text",
    log_level: Annotated[
        str, typer.Option("--log-level", metavar="LEVEL", help="debug, info, warning or error.")
    ] = "info",
    cluster_cidr: Annotated[
        list[str] | None,
        typer.Option(
            "--cluster-cidr",
            metavar="CIDR",
            help="The cluster's pod CIDR (repeatable, one per family): traffic "
            "to ClusterIPs from outside it is masqueraded.",
        ),
    ] = None,
    masquerade_all: Annotated[
        bool,
        typer.Option(
            "--masquerade-all/--no-masquerade-all", help="Masquerade all traffic to ClusterIPs."
        ),
    ] = False,
    nftables: Annotated[
        bool,
        typer.Option(
            "--nftables/--no-nftables",
            help="Keep ipvsctl's nftables table (masquerading, hairpin).",
        ),
    ] = True,
    healthz_bind_address: Annotated[
        str,
        typer.Option(
            "--healthz-bind-address",
            metavar="HOST:PORT",
            help="HOST:PORT of kube-proxy's health server (/healthz, "
            "/livez) for cloud load balancers; empty: none.",
        ),
    ] = "0.0.0.0:10256",
    service_metrics: Annotated[
        str,
        typer.Option(
            "--service-metrics",
            metavar="WHICH",
            help="none, annotated or all: which Services get per-Service traffic metrics "
            '(annotated: those with ipvsctl.io/metrics: "true").',
        ),
    ] = "annotated",
    service_metrics_max_series: Annotated[
        int,
        typer.Option(
            "--service-metrics-max-series",
            metavar="N",
            help="Cap on per-Service traffic series; Services past it are left out, counted.",
        ),
    ] = 10000,
    draining_taints: Annotated[
        str,
        typer.Option(
            "--draining-taints",
            metavar="KEYS",
            help="Comma-separated taint keys (any effect) that mean this node is leaving: "
            "its /healthz answers 503 and it drains (docs/node-drain.md); empty: none.",
        ),
    ] = "ToBeDeletedByClusterAutoscaler,karpenter.sh/disrupted",
    lb_grace: Annotated[
        str,
        typer.Option(
            "--lb-grace",
            metavar="SECONDS",
            help="How long a draining node's health must have said 503 before it counts as "
            "quiesced: the load balancer's probe interval times its unhealthy threshold.",
        ),
    ] = "30",
) -> None:
    """The node daemon: follow Services and EndpointSlices, program IPVS, drain gracefully."""
    from ipvsctl.daemon.wiring import DaemonOptions, StartupError
    from ipvsctl.daemon.wiring import run as run_daemon
    from ipvsctl.obs import logging as obs_logging

    try:
        file = read_config_file(config) if config is not None else None
    except ConfigFileError as exc:
        raise _fail(str(exc), 2) from None
    if file is not None:
        # The file's values where the command line (or the flag's env var) gave none.
        # (typer's own copy of click's ParameterSource: compared by name)
        explicit = {
            name
            for name in ctx.params
            if getattr(ctx.get_parameter_source(name), "name", "") in ("COMMANDLINE", "ENVIRONMENT")
        }
        f = {k: v for k, v in file.flags.items() if k not in explicit}
        kubeconfig = f.get("kubeconfig", kubeconfig)
        node_name = f.get("node_name", node_name)
        scheduler = f.get("scheduler", scheduler)
        ipvs_tcp_timeout = f.get("ipvs_tcp_timeout", ipvs_tcp_timeout)
        ipvs_tcpfin_timeout = f.get("ipvs_tcpfin_timeout", ipvs_tcpfin_timeout)
        ipvs_udp_timeout = f.get("ipvs_udp_timeout", ipvs_udp_timeout)
        log_format = f.get("log_format", log_format)
        log_level = f.get("log_level", log_level)
        cluster_cidr = f.get("cluster_cidr", cluster_cidr)
        masquerade_all = f.get("masquerade_all", masquerade_all)
        healthz_bind_address = f.get("healthz_bind_address", healthz_bind_address)
        assert not f.keys() - FILE_FLAGS, f"unmapped: {f.keys() - FILE_FLAGS}"
    if log_format not in ("text", "json"):
        raise _fail(f"--log-format {log_format}: must be text or json", 2)
    try:
        level = obs_logging.parse_level(log_level)
    except ValueError as exc:
        raise _fail(f"--log-level {log_level}: {exc}", 2) from None
    obs_logging.setup(log_format, level)  # from here on, a fatal line is a log line
    if manifests is not None:
        given = [
            f"--{name}"
            for name in ("kubeconfig", "apiserver")
            if (src := ctx.get_parameter_source(name)) is not None and src.name == "COMMANDLINE"
        ]
        if given:
            raise _fail(f"--manifests and {' and '.join(given)}: choose one source", 2)
        if not Path(manifests).is_dir():
            raise _fail(f"--manifests {manifests}: no such folder", 2)
    elif apiserver and _placeholder(apiserver):
        raise _fail(
            f"API server {apiserver} is the shipped placeholder: set IPVSCTL_APISERVER in "
            "daemonset/kustomization.yaml (or your overlay's configMapGenerator) to the API "
            "server's address (docs/install.md)",
            2,
        )
    listen = _listen("--listen", listen)
    healthz_bind_address = _healthz_address(healthz_bind_address)
    from ipvsctl.netfilter.ruleset import parse_cidrs

    try:
        cluster_cidrs = parse_cidrs(cluster_cidr or ())
    except ValueError as exc:
        raise _fail(f"--cluster-cidr {exc}", 2) from None
    from ipvsctl.reconcile.service_traffic import ServiceMetricsMode

    try:
        metrics_mode = ServiceMetricsMode(service_metrics)
    except ValueError:
        raise _fail(
            f"--service-metrics {service_metrics}: must be none, annotated or all", 2
        ) from None
    if service_metrics_max_series < 0:
        raise _fail(f"--service-metrics-max-series {service_metrics_max_series}: must be >= 0", 2)
    drain_seconds = _seconds("--drain-timeout", drain_timeout)
    service_drain_seconds = _seconds("--service-drain-timeout", service_drain_timeout)
    lb_grace_seconds = _seconds("--lb-grace", lb_grace)
    taints = _taint_keys(draining_taints)
    check_seconds = _seconds("--drain-check-interval", drain_check_interval, minimum=0.05)
    # The kernel counts IPVS timeouts in whole seconds: 500ms means 1 s, not "kernel's".
    tcp, tcpfin, udp = (
        math.ceil(_seconds(flag, value))
        for flag, value in (
            ("--ipvs-tcp-timeout", ipvs_tcp_timeout),
            ("--ipvs-tcpfin-timeout", ipvs_tcpfin_timeout),
            ("--ipvs-udp-timeout", ipvs_udp_timeout),
        )
    )
    node_port_cidrs = file.node_port_cidrs if file is not None and not node_ip else ()
    node = _node(
        node_name,
        node_ip,
        scheduler,
        interface,
        service_proxy_name,
        node_port_range=service_node_port_range,
        max_virtual_servers=max_virtual_servers_per_service,
        node_port_cidrs=node_port_cidrs,
        max_table_entries=max_table_entries,
    )
    if file is not None:
        log_config_notes(str(config), file)
    options = DaemonOptions(
        node=node,
        kubeconfig=kubeconfig,
        apiserver=apiserver,
        manifests=manifests,
        interface=interface,
        drain_timeout=drain_seconds,
        service_drain_timeout=service_drain_seconds,
        drain_check_interval=check_seconds,
        tcp_timeout=tcp,
        tcpfin_timeout=tcpfin,
        udp_timeout=udp,
        state_dir=state_dir,
        listen=listen,
        cluster_cidrs=cluster_cidrs,
        masquerade_all=masquerade_all,
        nftables=nftables,
        follow_node_ips=not node_ip,  # the host's addresses: re-read while running
        node_port_range=node.node_port_range,
        healthz_bind_address=healthz_bind_address,
        service_metrics=metrics_mode,
        service_metrics_max_series=service_metrics_max_series,
        draining_taints=taints,
        lb_grace=lb_grace_seconds,
        exclude_cidrs=file.exclude_cidrs if file is not None else (),
        node_port_cidrs=node_port_cidrs,
        strict_arp=file.strict_arp if file is not None else False,
    )
    try:
        code = run_daemon(options)
    except StartupError as exc:
        raise _fail(str(exc), 1) from None
    raise typer.Exit(code)


# A taint key: a label key ([prefix/]name, the name up to 63 characters).
_TAINT_KEY = re.compile(
    r"^(?:[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)


def _taint_keys(value: str) -> tuple[str, ...]:
    keys = [k.strip() for k in value.split(",") if k.strip()]
    for key in keys:
        if not _TAINT_KEY.match(key):
            raise _fail(f"--draining-taints {key!r}: not a taint key", 2)
    return tuple(dict.fromkeys(keys))


def _healthz_address(value: str) -> str:
    """As kube-proxy's flag: HOST:PORT, a bare IP (port 10256), or empty (no server)."""
    value = value.strip()
    if not value:
        return ""
    try:
        ip = normalize_ip(value.strip("[]"))
    except ValueError:
        if value.startswith(":"):  # kube-proxy's flag names a host
            raise _fail(f"--healthz-bind-address {value}: must be HOST:PORT or empty", 2) from None
        return _listen("--healthz-bind-address", value)
    return f"[{ip}]:10256" if ":" in ip else f"{ip}:10256"


@app.command()
def status(
    endpoint: Annotated[
        str,
        typer.Option(
            "--endpoint",
            metavar="URL",
            help="The daemon to ask; one on another machine is shown without "
            "this machine's kernel table.",
        ),
    ] = "http://127.0.0.1:9796",
    output: OutputOpt = None,
    as_json: AsJson = False,
    connections: Annotated[
        bool,
        typer.Option(
            "--connections",
            help="Under each draining real server, its connections from "
            "/proc/net/ip_vs_conn (client, state, expiry), at most 20 each.",
        ),
    ] = False,
) -> None:
    """The node's IPVS table with its Kubernetes meaning, and the drain queue."""
    from ipvsctl.cli.status import (
        attach_connections,
        endpoint_is_local,
        fetch_daemon_status,
        join_status,
        read_draining_connections,
        render_status,
    )

    fmt = _output(output, as_json)
    endpoint = _endpoint(endpoint)
    daemon, daemon_error = fetch_daemon_status(endpoint)
    kernel, kernel_error = None, None
    remote = not endpoint_is_local(endpoint)
    if remote:  # another node's daemon: this machine's kernel table is not its table
        kernel_error = "not read: the daemon is on another machine"
    else:
        try:
            from ipvsctl.kernel.netlink import read_host_statuses

            kernel = read_host_statuses()
        except Exception as exc:  # any reason the table cannot be read is shown, not raised
            kernel_error = str(exc) or type(exc).__name__
    if kernel is None and daemon is None:
        typer.echo(
            f"ipvsctl: {daemon_error}; kernel table {kernel_error}"
            if remote
            else f"ipvsctl: {daemon_error}; kernel table not readable: {kernel_error}",
            err=True,
        )
        raise typer.Exit(1)
    doc = join_status(kernel, kernel_error, daemon, daemon_error, endpoint, remote=remote)
    if connections:
        listing, error = (
            (None, "the daemon is on another machine") if remote else read_draining_connections(doc)
        )
        attach_connections(doc, listing, error)
    if fmt in (Output.json, Output.yaml):
        typer.echo(dump(doc, fmt), nl=False)
    else:
        typer.echo(render_status(doc, wide=fmt is Output.wide), nl=False)


class Shell(enum.StrEnum):
    bash = "bash"
    zsh = "zsh"
    fish = "fish"


@app.command()
def completion(
    shell: Annotated[Shell, typer.Argument(metavar="SHELL", help="bash, zsh or fish.")],
) -> None:
    """Print the shell completion script, as kubectl's: `source <(ipvsctl completion bash)`."""
    # typer.completion uses these without re-exporting them; the same functions, typed
    from typer._completion_classes import completion_init
    from typer._completion_shared import get_completion_script

    completion_init()
    typer.echo(
        get_completion_script(
            prog_name="ipvsctl", complete_var="_IPVSCTL_COMPLETE", shell=shell.value
        ),
        nl=False,
    )


register_shutdown_manager(app)
register_cleanup(app)
register_node_drain(app)
register_version(app)


def main() -> None:
    try:
        app()
    except BrokenPipeError:  # `ipvsctl plan ... | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)


if __name__ == "__main__":
    main()

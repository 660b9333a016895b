"""The node daemon's options as data, as kube-proxy's options.go: raw values in (`RunFlags`:
`ipvsctl run`'s flags as typed, and the kube-proxy configuration file's values where no
flag was given), one frozen `DaemonOptions` out, built group by group. Each group's
`complete` turns the raw values into the completed group or raises `OptionsError`, one line
naming the flag or field (the CLI exits 2 with it).

`run` parses flags into a `RunFlags` and calls `complete`; `run --config` and a
`check-config FILE` share it: the file is one more group, read first. A group's defaults
are the in-process daemon's (tests build `DaemonOptions` directly); `RunFlags`'s are the
command line's, the one place `ipvsctl run`'s defaults are written (cli/run.py shows them).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
import socket
import sys
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ipvsctl.daemon.config_file import FILE_FLAGS, ConfigFileError, read_config_file
from ipvsctl.model import NodeContext, normalize_ip
from ipvsctl.model.desired import DEFAULT_MAX_TABLE_ENTRIES
from ipvsctl.model.hostport import host_port
from ipvsctl.reconcile.service_traffic import DEFAULT_MAX_SERIES, ServiceMetricsMode
from ipvsctl.source.kubeproxy_config import Settings
from ipvsctl.source.node import DEFAULT_DRAINING_TAINTS


class OptionsError(ValueError):
    """A flag or a configuration file field that cannot be used: one line naming it."""


# --- the raw values ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RunFlags:
    """`ipvsctl run`'s flags as given, named as its parameters; strings not yet parsed.
    `command_line` and `environment` name those given there (they win over --config)."""

    config: Path | None = None
    kubeconfig: str | None = None
    apiserver: str | None = None
    manifests: str | None = None
    node_name: str | None = None
    node_ip: Sequence[str] | None = None
    interface: str = "kube-ipvs0"
    scheduler: str = "rr"
    service_proxy_name: str | None = None
    service_node_port_range: str = "30000-32767"
    max_virtual_servers_per_service: int = 1024
    max_table_entries: int = DEFAULT_MAX_TABLE_ENTRIES
    drain_timeout: str = "30"
    service_drain_timeout: str = "30"
    drain_check_interval: str = "1"
    ipvs_tcp_timeout: str = "0"
    ipvs_tcpfin_timeout: str = "0"
    ipvs_udp_timeout: str = "0"
    state_dir: str = "/var/lib/ipvsctl"
    listen: str = "0.0.0.0:9796"
    log_format: str = "text"
    log_level: str = "info"
    cluster_cidr: Sequence[str] | None = None
    masquerade_all: bool = False
    nftables: bool = True
    healthz_bind_address: str = "0.0.0.0:10256"
    service_metrics: str = "annotated"
    service_metrics_max_series: int = DEFAULT_MAX_SERIES
    draining_taints: str = ",".join(DEFAULT_DRAINING_TAINTS)
    lb_grace: str = "30"
    command_line: frozenset[str] = frozenset()
    environment: frozenset[str] = frozenset()

    def given(self, name: str) -> bool:
        return name in self.command_line or name in self.environment

    def with_file(self, file: Settings) -> RunFlags:
        """The file's values where neither the command line nor the flag's environment
        variable gave one."""
        taken = {k: v for k, v in file.flags.items() if not self.given(k)}
        assert not taken.keys() - FILE_FLAGS, f"unmapped: {taken.keys() - FILE_FLAGS}"
        return dataclasses.replace(self, **taken)


DEFAULTS = RunFlags()


# --- the groups ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ConfigFile:
    """--config: kube-proxy's KubeProxyConfiguration, read once."""

    path: str
    settings: Settings

    @staticmethod
    def complete(raw: RunFlags) -> ConfigFile | None:
        if raw.config is None:
            return None
        try:
            return ConfigFile(str(raw.config), read_config_file(raw.config))
        except ConfigFileError as exc:
            raise OptionsError(str(exc)) from None

    def log_notes(self) -> None:
        """One line per field the file sets that ipvsctl takes no action on."""
        from ipvsctl.obs.logging import fields

        log = logging.getLogger("ipvsctl.config")
        for name, instead in self.settings.notes:
            log.info(
                "kube-proxy setting not used",
                extra=fields(config=self.path, field=name, ipvsctl=instead),
            )


@dataclass(frozen=True, slots=True)
class LogOptions:
    format: str = "text"  # --log-format
    level: int = logging.INFO  # --log-level

    @staticmethod
    def complete(raw: RunFlags) -> LogOptions:
        from ipvsctl.obs.logging import parse_level

        if raw.log_format not in ("text", "json"):
            raise OptionsError(f"--log-format {raw.log_format}: must be text or json")
        try:
            return LogOptions(raw.log_format, parse_level(raw.log_level))
        except ValueError as exc:
            raise OptionsError(f"--log-level {raw.log_level}: {exc}") from None


@dataclass(frozen=True, slots=True)
class SourceOptions:
    """Where Services and EndpointSlices come from: an API server or a folder."""

    kubeconfig: str | None = None  # --kubeconfig
    apiserver: str | None = None  # --apiserver
    manifests: str | None = None  # --manifests

    @staticmethod
    def complete(raw: RunFlags) -> SourceOptions:
        if raw.manifests is not None:
            given = [f"--{n}" for n in ("kubeconfig", "apiserver") if n in raw.command_line]
            if given:
                raise OptionsError(f"--manifests and {' and '.join(given)}: choose one source")
            if not Path(raw.manifests).is_dir():
                raise OptionsError(f"--manifests {raw.manifests}: no such folder")
        elif raw.apiserver and _placeholder(raw.apiserver):
            raise OptionsError(
                f"API server {raw.apiserver} is the shipped placeholder: set IPVSCTL_APISERVER "
                "in daemonset/kustomization.yaml (or your overlay's configMapGenerator) to the "
                "API server's address (docs/install.md)"
            )
        return SourceOptions(raw.kubeconfig, raw.apiserver, raw.manifests)

    def describe(self) -> str:
        return self.manifests or self.apiserver or "kubeconfig"


@dataclass(frozen=True, slots=True)
class HTTPOptions:
    listen: str = "0.0.0.0:9796"  # --listen: /metrics, /healthz, /readyz, /status
    # --healthz-bind-address: kube-proxy's health server ("": none). The command line's
    # default is 0.0.0.0:10256; in-process daemons (tests) serve none unless asked.
    healthz_bind_address: str = ""
    stale_after: float = 60.0  # /healthz fails when the loop has not turned for this long

    @staticmethod
    def complete(raw: RunFlags) -> HTTPOptions:
        return HTTPOptions(
            _listen("--listen", raw.listen), healthz_address(raw.healthz_bind_address)
        )


@dataclass(frozen=True, slots=True)
class NetfilterOptions:
    """ipvsctl's nftables table (masquerading, hairpin, the port filter)."""

    enabled: bool = True  # --no-nftables: none (masquerading done elsewhere)
    cluster_cidrs: tuple[str, ...] = ()  # --cluster-cidr, normalized
    masquerade_all: bool = False  # --masquerade-all

    @staticmethod
    def complete(raw: RunFlags) -> NetfilterOptions:
        from ipvsctl.netfilter.ruleset import parse_cidrs

        try:
            cidrs = parse_cidrs(raw.cluster_cidr or ())
        except ValueError as exc:
            raise OptionsError(f"--cluster-cidr {exc}") from None
        return NetfilterOptions(raw.nftables, cidrs, raw.masquerade_all)


@dataclass(frozen=True, slots=True)
class MetricsOptions:
    """Per-Service traffic series."""

    service_metrics: ServiceMetricsMode = ServiceMetricsMode.ANNOTATED  # --service-metrics
    max_series: int = DEFAULT_MAX_SERIES  # --service-metrics-max-series

    @staticmethod
    def complete(raw: RunFlags) -> MetricsOptions:
        try:
            mode = ServiceMetricsMode(raw.service_metrics)
        except ValueError:
            raise OptionsError(
                f"--service-metrics {raw.service_metrics}: must be none, annotated or all"
            ) from None
        if raw.service_metrics_max_series < 0:
            raise OptionsError(
                f"--service-metrics-max-series {raw.service_metrics_max_series}: must be >= 0"
            )
        return MetricsOptions(mode, raw.service_metrics_max_series)


@dataclass(frozen=True, slots=True)
class DrainOptions:
    """Real and virtual servers' drains, and where the queue survives restarts."""

    timeout: float = 30.0  # --drain-timeout
    service_timeout: float = 30.0  # --service-drain-timeout
    check_interval: float = 1.0  # --drain-check-interval
    state_dir: str = "/var/lib/ipvsctl"  # --state-dir

    @staticmethod
    def complete(raw: RunFlags) -> DrainOptions:
        return DrainOptions(
            _seconds("--drain-timeout", raw.drain_timeout),
            _seconds("--service-drain-timeout", raw.service_drain_timeout),
            _seconds("--drain-check-interval", raw.drain_check_interval, minimum=0.05),
            raw.state_dir,
        )


@dataclass(frozen=True, slots=True)
class NodeDrainOptions:
    """This node's own drain, for load balancers (docs/node-drain.md)."""

    # --draining-taints: taint keys that mean this node is leaving
    draining_taints: tuple[str, ...] = DEFAULT_DRAINING_TAINTS
    lb_grace: float = 30.0  # --lb-grace: draining this long before it can be quiesced

    @staticmethod
    def complete(raw: RunFlags) -> NodeDrainOptions:
        lb_grace = _seconds("--lb-grace", raw.lb_grace)
        return NodeDrainOptions(_taint_keys(raw.draining_taints), lb_grace)


@dataclass(frozen=True, slots=True)
class KernelOptions:
    """The host's IPVS set-up and which of its virtual servers are ipvsctl's."""

    interface: str = "kube-ipvs0"  # --interface: the dummy interface holding the VIPs
    # --ipvs-*-timeout, whole seconds (0: the kernel's)
    tcp_timeout: int = 0
    tcpfin_timeout: int = 0
    udp_timeout: int = 0
    strict_arp: bool = False  # --config's ipvs.strictARP: arp_ignore=1, arp_announce=2
    exclude_cidrs: tuple[str, ...] = ()  # --config's ipvs.excludeCIDRs: never ipvsctl's

    @staticmethod
    def complete(raw: RunFlags, file: ConfigFile | None) -> KernelOptions:
        # The kernel counts IPVS timeouts in whole seconds: 500ms means 1 s, not "kernel's".
        tcp, tcpfin, udp = (
            math.ceil(_seconds(flag, value))
            for flag, value in (
                ("--ipvs-tcp-timeout", raw.ipvs_tcp_timeout),
                ("--ipvs-tcpfin-timeout", raw.ipvs_tcpfin_timeout),
                ("--ipvs-udp-timeout", raw.ipvs_udp_timeout),
            )
        )
        s = file.settings if file is not None else Settings()
        return KernelOptions(raw.interface, tcp, tcpfin, udp, s.strict_arp, s.exclude_cidrs)


@dataclass(frozen=True, slots=True)
class NodeIPs:
    """Where NodePorts listen: fixed by --node-ip, or the host's addresses (within
    --config's nodePortAddresses), re-read while running."""

    follow: bool = False
    cidrs: tuple[str, ...] = ()  # --config's nodePortAddresses

    @staticmethod
    def complete(raw: RunFlags, file: ConfigFile | None) -> NodeIPs:
        if raw.node_ip:
            return NodeIPs()
        return NodeIPs(True, file.settings.node_port_cidrs if file is not None else ())


# --- the whole ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DaemonOptions:
    """The node daemon's options, completed and checked: what `wiring.run` builds from."""

    node: NodeContext
    node_ips: NodeIPs = field(default_factory=NodeIPs)
    source: SourceOptions = field(default_factory=SourceOptions)
    kernel: KernelOptions = field(default_factory=KernelOptions)
    drain: DrainOptions = field(default_factory=DrainOptions)
    node_drain: NodeDrainOptions = field(default_factory=NodeDrainOptions)
    http: HTTPOptions = field(default_factory=HTTPOptions)
    netfilter: NetfilterOptions = field(default_factory=NetfilterOptions)
    metrics: MetricsOptions = field(default_factory=MetricsOptions)
    log: LogOptions = field(default_factory=LogOptions)
    config: ConfigFile | None = None


def complete(
    raw: RunFlags,
    *,
    setup_logging: Callable[[str, int], object] | None = None,
    host_addresses: Callable[[str], list[str]] | None = None,
) -> DaemonOptions:
    """Every group completed, or OptionsError. The configuration file first (its values fill
    the flags not given), then logging (`setup_logging` is called with it: later errors are
    log lines), then the rest. `host_addresses(interface)` reads the node's addresses when
    no --node-ip is given (the netlink reader by default)."""
    config = ConfigFile.complete(raw)
    if config is not None:
        raw = raw.with_file(config.settings)
    log = LogOptions.complete(raw)
    if setup_logging is not None:
        setup_logging(log.format, log.level)
    source = SourceOptions.complete(raw)
    http = HTTPOptions.complete(raw)
    netfilter = NetfilterOptions.complete(raw)
    metrics = MetricsOptions.complete(raw)
    drain = DrainOptions.complete(raw)
    node_drain = NodeDrainOptions.complete(raw)
    kernel = KernelOptions.complete(raw, config)
    node_ips = NodeIPs.complete(raw, config)
    node = node_context(
        raw,
        read_host=host_addresses or read_host_addresses,
        node_port_cidrs=node_ips.cidrs,
    )
    return DaemonOptions(
        node, node_ips, source, kernel, drain, node_drain, http, netfilter, metrics, log, config
    )


# --- the node --------------------------------------------------------------------------------

# A Kubernetes label value (it goes into the Service watch's label selector).
_LABEL_VALUE = re.compile(r"^(?:[A-Za-z0-9](?:[A-Za-z0-9._-]{0,61}[A-Za-z0-9])?)?$")


def node_context(
    raw: RunFlags,
    *,
    read_host: Callable[[str], list[str]] | None,
    node_port_cidrs: tuple[str, ...] = (),
) -> NodeContext:
    """The node's flags checked (`run`'s and `plan`'s); without --node-ip, the host's
    addresses as `read_host(interface)` reads them (None: none, `plan` may find them in
    its input)."""
    from ipvsctl.model.ipvs import IPVS_SCHEDULERS
    from ipvsctl.model.portrange import parse_port_range

    try:
        node_ports = parse_port_range(raw.service_node_port_range)
    except ValueError as exc:
        raise OptionsError(f"--service-node-port-range {exc}") from None
    name = raw.service_proxy_name
    if name is not None and not _LABEL_VALUE.match(name):
        raise OptionsError(
            f"--service-proxy-name {name!r}: not a label value (up to 63 of A-Z a-z 0-9 - _ ., "
            "starting and ending alphanumeric)"
        )
    if raw.scheduler not in IPVS_SCHEDULERS:
        raise OptionsError(
            f"--scheduler {raw.scheduler}: unknown IPVS scheduler "
            f"(one of {', '.join(sorted(IPVS_SCHEDULERS))})"
        )
    ips: list[str] = []
    if raw.node_ip:
        for ip in raw.node_ip:
            try:
                ips.append(normalize_ip(ip))
            except ValueError:
                raise OptionsError(f"--node-ip {ip}: not an IP address") from None
    elif read_host is not None:
        from ipvsctl.model.cidrs import in_cidrs

        ips = in_cidrs(read_host(raw.interface), node_port_cidrs)
    return NodeContext(
        raw.node_name or socket.gethostname(),
        tuple(dict.fromkeys(ips)),
        raw.scheduler,
        service_proxy_name=name or None,
        node_port_range=node_ports,
        max_virtual_servers=raw.max_virtual_servers_per_service,
        max_table_entries=raw.max_table_entries,
    )


def read_host_addresses(interface: str) -> list[str]:
    """The node's global addresses but `interface`'s (its addresses are ClusterIPs, never
    NodePort addresses); none, said on stderr, where netlink cannot be read."""
    try:
        from ipvsctl.kernel.netlink.addresses import node_addresses

        return node_addresses(exclude_interfaces=(interface,))
    except Exception as exc:  # no netlink route socket: `plan` still works without
        print(
            f"ipvsctl: cannot read the node's addresses ({exc}); NodePorts need --node-ip",
            file=sys.stderr,
        )
        return []


# --- one flag's value --------------------------------------------------------------------------


def _seconds(flag: str, value: str, minimum: float = 0.0) -> float:
    """A SECONDS flag: plain seconds or a Go duration (CONTRACT.md "Durations")."""
    from ipvsctl.source.duration import parse_duration

    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        raise OptionsError(f"{flag}: {exc}") from None
    if seconds < minimum:
        raise OptionsError(f"{flag} {value}: must be at least {minimum:g} seconds")
    return seconds


def _listen(flag: str, value: str) -> str:
    try:
        host_port(value)
    except ValueError as exc:
        raise OptionsError(f"{flag} {value}: {exc}") from None
    return value


def healthz_address(value: str) -> str:
    """--healthz-bind-address as kube-proxy's flag: HOST:PORT, a bare IP (port 10256), or
    empty (no server)."""
    value = value.strip()
    if not value:
        return ""
    try:
        ip = normalize_ip(value.strip("[]"))
    except ValueError:
        if value.startswith(":"):  # kube-proxy's flag names a host
            raise OptionsError(
                f"--healthz-bind-address {value}: must be HOST:PORT or empty"
            ) from None
        return _listen("--healthz-bind-address", value)
    return f"[{ip}]:10256" if ":" in ip else f"{ip}:10256"


# A taint key: a label key ([prefix/]name, the name up to 63 characters).
_TAINT_KEY = re.compile(
    r"^(?:[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)


def _taint_keys(value: str) -> tuple[str, ...]:
    keys = [k.strip() for k in value.split(",") if k.strip()]
    for key in keys:
        if not _TAINT_KEY.match(key):
            raise OptionsError(f"--draining-taints {key!r}: not a taint key")
    return tuple(dict.fromkeys(keys))


def _placeholder(url: str) -> bool:
    """A host under `.invalid` (RFC 6761: never resolves), as daemonset/kustomization.yaml
    ships: a daemon started with it would retry forever and never get ready."""
    host = (urllib.parse.urlsplit(url.strip()).hostname or "").rstrip(".")
    return host == "invalid" or host.endswith(".invalid")

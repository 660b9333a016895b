"""kube-proxy's `KubeProxyConfiguration` (kubeproxy.config.k8s.io/v1alpha1) into ipvsctl's
settings. Pure: a parsed document in, settings and notes out, or one error naming a field.

FIELDS is the one mapping table (docs/migrating-from-kube-proxy.md's "Configuration file"
table is checked against it both ways). Every field of the type
(staging/src/k8s.io/kube-proxy/config/v1alpha1/types.go, and the ones older kubeadm
versions still write) is one of three kinds:
- SETS: it sets an ipvsctl equivalent (a flag of `ipvsctl run`, or a setting of its own);
- NOTED: it tunes kube-proxy's own process or another mode: accepted, and when it is not
  left empty one log line says what ipvsctl does instead;
- REFUSED: a value other than kube-proxy's default asks for a behaviour ipvsctl lacks.
A field the table does not know, or a value of the wrong type, is refused too.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from ipvsctl.model.ipvs import IPVS_SCHEDULERS
from ipvsctl.source.duration import parse_duration

API_VERSION = "kubeproxy.config.k8s.io/v1alpha1"
KIND = "KubeProxyConfiguration"


class Kind(Enum):
    SETS = "sets"
    NOTED = "accepted"
    REFUSED = "refused"


class KubeProxyConfigError(ValueError):
    """One line naming the field; `ipvsctl run --config` exits 2 with it."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path


# Value types, as Go's JSON decoding of the v1alpha1 type takes them (null leaves a field
# unset: `acceptContentTypes:` with nothing after it, as kubespray writes, is ""). Each
# returns the value or raises ValueError with the reason.
_GO_DURATION = re.compile(r"^[-+]?(?:0|(?:(?:\d+(?:\.\d*)?|\.\d+)(?:ns|us|µs|μs|ms|s|m|h))+)$")


def _string(v: Any) -> str:
    if v is None:
        return ""
    if not isinstance(v, str):
        raise ValueError(f"{v!r} is not a string")
    return v


def _boolean(v: Any) -> bool:
    if v is None:
        return False
    if not isinstance(v, bool):
        raise ValueError(f"{v!r} is not true or false")
    return v


def _integer(v: Any) -> int | None:
    if v is None:  # *int32: null means kube-proxy's default
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not -(2**31) <= v < 2**31:
        raise ValueError(f"{v!r} is not a 32-bit integer")
    return v


def _number(v: Any) -> float:
    if v is None:
        return 0.0
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ValueError(f"{v!r} is not a number")
    return float(v)


def _duration(v: Any) -> float | None:
    """metav1.Duration: a Go duration string ("0s", "30s", "1h0m0s"); null for a pointer."""
    if v is None:
        return None
    if not isinstance(v, str) or not _GO_DURATION.match(v.strip()):
        raise ValueError(f"{v!r} is not a duration (e.g. 0s, 30s, 15m0s)")
    if v.strip().startswith("-"):
        raise ValueError(f"{v!r} is negative")
    try:
        return parse_duration(v.strip().lstrip("+"), max_seconds=float(2**63) / 1e9)
    except ValueError as exc:
        raise ValueError(str(exc)) from None


def _duration_or_int(v: Any) -> float | None:
    """component-base's TimeOrMetaDuration (logging.flushFrequency): nanoseconds or a string."""
    if isinstance(v, int) and not isinstance(v, bool):
        return v / 1e9
    return _duration(v)


def _strings(v: Any) -> list[str]:
    if v is None:
        return []
    if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
        raise ValueError(f"{v!r} is not a list of strings")
    return v


def _gates(v: Any) -> dict[str, bool]:
    if v is None:
        return {}
    if not isinstance(v, dict) or not all(
        isinstance(k, str) and isinstance(b, bool) for k, b in v.items()
    ):
        raise ValueError("not a map of feature names to true or false")
    return v


def _anything(v: Any) -> Any:
    """kube-proxy's own logging internals (logging.options, logging.vmodule): not read."""
    return v


def _is_empty(value: Any) -> bool:
    """Left as kubeadm writes an unset field: null, "", 0, "0s", false, [], {}."""
    return value is None or value is False or value in ("", 0, [], {})


@dataclass
class Settings:
    """What the file sets: `flags` by `ipvsctl run`'s parameter name (the command line wins
    over them), the settings that have no flag, and one note per NOTED field to log."""

    flags: dict[str, Any] = field(default_factory=dict)
    exclude_cidrs: tuple[str, ...] = ()  # ipvs.excludeCIDRs: never owned
    node_port_cidrs: tuple[str, ...] = ()  # nodePortAddresses: NodePorts on these only
    strict_arp: bool = False  # ipvs.strictARP
    notes: list[tuple[str, str]] = field(default_factory=list)  # (field, what ipvsctl does)
    sources: dict[str, str] = field(default_factory=dict)  # flag (parameter name) -> field


Setter = Callable[[Any, Settings], None]


@dataclass(frozen=True)
class Field:
    path: str
    kind: Kind
    parse: Callable[[Any], Any]
    ipvsctl: str  # SETS: the flag or setting; NOTED: what ipvsctl does instead; REFUSED: why
    apply: Setter | None = None  # SETS: puts the parsed value into Settings
    allowed: tuple[Any, ...] = ()  # REFUSED: the values accepted (kube-proxy's default first)


def _flag(name: str, convert: Callable[[Any], Any] = lambda v: v) -> Setter:
    def apply(value: Any, s: Settings) -> None:
        if not _is_empty(value):
            s.flags[name] = convert(value)

    return apply


def _cidrs(path: str, texts: list[str]) -> tuple[str, ...]:
    out = []
    for text in texts:
        try:
            out.append(ipaddress.ip_network(text.strip(), strict=False).compressed)
        except ValueError:
            raise KubeProxyConfigError(path, f"{text!r} is not a CIDR") from None
    return tuple(dict.fromkeys(out))


def _scheduler(value: str, s: Settings) -> None:
    if value and value not in IPVS_SCHEDULERS:
        raise KubeProxyConfigError(
            "ipvs.scheduler",
            f"unknown IPVS scheduler {value!r} (one of {', '.join(sorted(IPVS_SCHEDULERS))})",
        )
    if value:
        s.flags["scheduler"] = value


def _cluster_cidr(value: str, s: Settings) -> None:
    texts = [t for t in value.split(",") if t.strip()]
    if texts:
        s.flags["cluster_cidr"] = list(_cidrs("clusterCIDR", texts))


def _exclude_cidrs(value: list[str], s: Settings) -> None:
    s.exclude_cidrs = _cidrs("ipvs.excludeCIDRs", value)


def _strict_arp(value: bool, s: Settings) -> None:
    s.strict_arp = value


def _node_port_addresses(value: list[str], s: Settings) -> None:
    for text in value:
        if text in ("primary", "localhost"):
            raise KubeProxyConfigError(
                "nodePortAddresses",
                f"{text!r} is not supported: ipvsctl serves NodePorts on the node's addresses "
                "in the listed CIDRs, or on --node-ip's; give --node-ip",
            )
    if "all" not in value:  # empty: all the node's addresses, as kube-proxy's IPVS mode
        s.node_port_cidrs = _cidrs("nodePortAddresses", value)


def _log_format(value: str, s: Settings) -> None:
    if value not in ("", "text", "json"):
        raise KubeProxyConfigError("logging.format", f"{value!r}: ipvsctl logs text or json")
    if value:
        s.flags["log_format"] = value


def _verbosity(value: int | None, s: Settings) -> None:
    # klog's -v: kube-proxy logs its per-sync detail from 4 on; ipvsctl's debug is that.
    if value is not None and value >= 4:
        s.flags["log_level"] = "debug"


def _seconds_flag(name: str) -> Setter:
    def apply(value: float | None, s: Settings) -> None:
        if value:
            s.flags[name] = f"{value:g}"

    return apply


S, N, R = Kind.SETS, Kind.NOTED, Kind.REFUSED

# The table. Order: as types.go declares them; the historical fields at the end.
FIELDS: tuple[Field, ...] = (
    Field("apiVersion", R, _string, f"only {API_VERSION}", allowed=(API_VERSION,)),
    Field("kind", R, _string, f"only {KIND}", allowed=(KIND,)),
    Field("featureGates", N, _gates, "nothing in ipvsctl is behind a gate"),
    Field("clientConnection.kubeconfig", S, _string, "--kubeconfig", _flag("kubeconfig")),
    Field("clientConnection.acceptContentTypes", N, _string, "ipvsctl asks for JSON"),
    Field("clientConnection.contentType", N, _string, "ipvsctl asks for JSON"),
    Field("clientConnection.qps", N, _number, "ipvsctl makes one list and watch per resource"),
    Field("clientConnection.burst", N, _integer, "ipvsctl makes one list and watch per resource"),
    Field("logging.format", S, _string, "--log-format", _log_format),
    Field("logging.verbosity", S, _integer, "--log-level (debug from 4 on)", _verbosity),
    Field("logging.flushFrequency", N, _duration_or_int, "ipvsctl logs unbuffered"),
    Field("logging.vmodule", N, _anything, "ipvsctl has one --log-level"),
    Field("logging.options", N, _anything, "ipvsctl logs every line to stderr, unbuffered"),
    Field("logging.sanitization", N, _boolean, "ipvsctl logs no secrets"),
    Field("hostnameOverride", S, _string, "--node-name", _flag("node_name")),
    Field("bindAddress", N, _string, "ipvsctl serves both families; --node-ip fixes addresses"),
    Field(
        "healthzBindAddress",
        S,
        _string,
        "--healthz-bind-address",
        _flag("healthz_bind_address"),
    ),
    Field("metricsBindAddress", N, _string, "ipvsctl's metrics are on --listen"),
    Field("bindAddressHardFail", N, _boolean, "a --listen port that cannot be opened is fatal"),
    Field("enableProfiling", R, _boolean, "ipvsctl has no profiling endpoint", allowed=(False,)),
    Field("showHiddenMetricsForVersion", N, _string, "ipvsctl has no hidden metrics"),
    Field("mode", R, _string, "ipvsctl is IPVS only", allowed=("", "ipvs")),
    Field("iptables.masqueradeBit", N, _integer, "ipvsctl's nftables table marks no packets"),
    Field("iptables.masqueradeAll", S, _boolean, "--masquerade-all", _flag("masquerade_all")),
    Field("iptables.localhostNodePorts", N, _anything, "iptables mode only"),
    Field("iptables.snatNodeInternalIP", N, _anything, "iptables mode only"),
    Field("iptables.syncPeriod", N, _duration, "iptables mode only"),
    Field("iptables.minSyncPeriod", N, _duration, "iptables mode only"),
    Field("ipvs.syncPeriod", N, _duration, "each change is applied at once; an audit repairs"),
    Field("ipvs.minSyncPeriod", N, _duration, "changes that arrive together are batched"),
    Field("ipvs.scheduler", S, _string, "--scheduler", _scheduler),
    Field("ipvs.excludeCIDRs", S, _strings, "never owned (the ownership rule)", _exclude_cidrs),
    Field("ipvs.strictARP", S, _boolean, "arp_ignore=1, arp_announce=2", _strict_arp),
    Field("ipvs.tcpTimeout", S, _duration, "--ipvs-tcp-timeout", _seconds_flag("ipvs_tcp_timeout")),
    Field(
        "ipvs.tcpFinTimeout",
        S,
        _duration,
        "--ipvs-tcpfin-timeout",
        _seconds_flag("ipvs_tcpfin_timeout"),
    ),
    Field("ipvs.udpTimeout", S, _duration, "--ipvs-udp-timeout", _seconds_flag("ipvs_udp_timeout")),
    Field("nftables.masqueradeBit", N, _integer, "nftables mode only"),
    Field("nftables.masqueradeAll", N, _boolean, "nftables mode only (iptables.masqueradeAll)"),
    Field("nftables.syncPeriod", N, _duration, "nftables mode only"),
    Field("nftables.minSyncPeriod", N, _duration, "nftables mode only"),
    Field("winkernel.networkName", N, _string, "Windows only"),
    Field("winkernel.sourceVip", N, _string, "Windows only"),
    Field("winkernel.enableDSR", N, _boolean, "Windows only"),
    Field("winkernel.rootHnsEndpointName", N, _string, "Windows only"),
    Field("winkernel.forwardHealthCheckVip", N, _boolean, "Windows only"),
    Field(
        "detectLocalMode",
        R,
        _string,
        "ipvsctl tells pod traffic by source address (--cluster-cidr)",
        allowed=("", "ClusterCIDR"),
    ),
    Field("detectLocal.bridgeInterface", N, _string, "only for detectLocalMode BridgeInterface"),
    Field(
        "detectLocal.interfaceNamePrefix",
        N,
        _string,
        "only for detectLocalMode InterfaceNamePrefix",
    ),
    Field("clusterCIDR", S, _string, "--cluster-cidr", _cluster_cidr),
    Field(
        "nodePortAddresses",
        S,
        _strings,
        "NodePorts on the node's addresses in these CIDRs",
        _node_port_addresses,
    ),
    Field("oomScoreAdj", N, _integer, "the kubelet sets it from the pod's QoS class"),
    Field("conntrack.maxPerCore", N, _integer, "set net.netfilter.nf_conntrack_max on the node"),
    Field("conntrack.min", N, _integer, "set net.netfilter.nf_conntrack_max on the node"),
    Field("conntrack.tcpEstablishedTimeout", N, _duration, "the nf_conntrack sysctls"),
    Field("conntrack.tcpCloseWaitTimeout", N, _duration, "the nf_conntrack sysctls"),
    Field("conntrack.tcpBeLiberal", N, _boolean, "the nf_conntrack sysctls"),
    Field("conntrack.udpTimeout", N, _duration, "the nf_conntrack sysctls"),
    Field("conntrack.udpStreamTimeout", N, _duration, "the nf_conntrack sysctls"),
    Field("configSyncPeriod", N, _duration, "watches are never resynced on a timer"),
    Field("portRange", N, _string, "unused (kube-proxy's removed userspace mode)"),
    Field("windowsRunAsService", N, _boolean, "Windows only"),
    # Written by older kubeadm versions, gone from the type since.
    Field("udpIdleTimeout", N, _duration, "unused (kube-proxy's removed userspace mode)"),
    Field("resourceContainer", N, _string, "the kubelet runs ipvsctl in its pod's cgroup"),
)

BY_PATH: Mapping[str, Field] = {f.path: f for f in FIELDS}
# The objects whose members the table lists: a key not in the table is unknown.
_OBJECTS = {p.rpartition(".")[0] for p in BY_PATH if "." in p}


@dataclass(frozen=True, slots=True)
class Verdict:
    """What ipvsctl does with one field of the file: `kind` None for a field left empty
    (kube-proxy's default: nothing to do); `error` for one refused (why)."""

    path: str
    value: Any  # as the file has it
    kind: Kind | None
    ipvsctl: str  # the table's text: the flag it sets, what ipvsctl does instead, why not
    error: str | None = None

    @property
    def refused(self) -> bool:
        return self.error is not None


@dataclass
class Judgement:
    """Every field of a file judged, in the file's order (apiVersion and kind first), and
    the settings of the fields accepted. `refusal`: the first field refused, the one `run
    --config` names; None when the file can be used."""

    verdicts: list[Verdict] = field(default_factory=list)
    settings: Settings = field(default_factory=Settings)
    refusal: KubeProxyConfigError | None = None

    def refuse(self, path: str, value: Any, kind: Kind | None, text: str, why: str) -> None:
        self.verdicts.append(Verdict(path, value, kind, text, why))
        if self.refusal is None:
            self.refusal = KubeProxyConfigError(path, why)


_UNSET = object()


def judge(doc: Any) -> Judgement:
    """Every field of a parsed document judged, as `run --config` and `check-config` read
    it. A document that is not a KubeProxyConfiguration (its apiVersion or kind) is
    refused on that alone: a KubeletConfiguration is not judged field by field."""
    j = Judgement()
    if not isinstance(doc, dict):
        j.refuse("(file)", doc, None, "", "not a KubeProxyConfiguration object")
        return j
    for key in ("kind", "apiVersion"):  # a KubeletConfiguration is refused as such
        f = BY_PATH[key]
        if key not in doc:
            j.refuse(key, None, f.kind, f.ipvsctl, f"missing (want {KIND} {API_VERSION})")
        elif doc[key] not in f.allowed:
            j.refuse(
                key,
                doc[key],
                f.kind,
                f.ipvsctl,
                f"{doc[key]!r}: not kube-proxy's file (want {KIND} {API_VERSION})",
            )
        else:
            j.verdicts.append(Verdict(key, doc[key], f.kind, f.ipvsctl))
    if j.refusal is not None:
        return j
    rest = {k: v for k, v in doc.items() if k not in ("apiVersion", "kind")}
    for path, raw in _flatten(rest, "", j):
        _judge_field(BY_PATH[path], raw, j)
    return j


def _judge_field(f: Field, raw: Any, j: Judgement) -> None:
    try:
        value = f.parse(raw)
    except ValueError as exc:
        j.refuse(f.path, raw, f.kind, f.ipvsctl, str(exc))
        return
    if f.kind is Kind.REFUSED:
        if value not in f.allowed:
            j.refuse(f.path, raw, f.kind, f.ipvsctl, f"{value!r} is not supported: {f.ipvsctl}")
            return
        # kube-proxy's default (or what ipvsctl is): fine, nothing to set
        j.verdicts.append(Verdict(f.path, raw, f.kind if not _is_empty(value) else None, f.ipvsctl))
        return
    if _is_empty(value):
        j.verdicts.append(Verdict(f.path, raw, None, f.ipvsctl))
        return
    if f.kind is Kind.SETS:
        assert f.apply is not None
        before = dict(j.settings.flags)
        try:
            f.apply(value, j.settings)
        except KubeProxyConfigError as exc:
            j.refuse(f.path, raw, f.kind, f.ipvsctl, str(exc).removeprefix(f"{exc.path}: "))
            return
        for name, v in j.settings.flags.items():
            if before.get(name, _UNSET) != v:
                j.settings.sources[name] = f.path
    else:
        j.settings.notes.append((f.path, f.ipvsctl))
    j.verdicts.append(Verdict(f.path, raw, f.kind, f.ipvsctl))


def translate(doc: Any) -> Settings:
    """The settings of a parsed KubeProxyConfiguration; KubeProxyConfigError (the first
    field refused) otherwise."""
    j = judge(doc)
    if j.refusal is not None:
        raise j.refusal
    return j.settings


def _flatten(obj: dict[Any, Any], prefix: str, j: Judgement) -> Iterator[tuple[str, Any]]:
    """The table's fields the document sets, in its order; an unknown key or an object
    of the wrong type refused where it stands."""
    for key, value in obj.items():
        path = f"{prefix}{key}" if isinstance(key, str) else f"{prefix}{key!r}"
        if path in BY_PATH:
            yield path, value
        elif path in _OBJECTS:
            if value is None:
                continue
            if not isinstance(value, dict):
                j.refuse(path, value, None, "", f"{value!r} is not an object")
                continue
            yield from _flatten(value, f"{path}.", j)
        else:
            j.refuse(path, value, None, "", "unknown field (not in kube-proxy's v1alpha1)")

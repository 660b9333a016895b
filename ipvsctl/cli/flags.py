"""The commands' flags as typer declares them: those `plan` and `run` share, and `run`'s own
(cli/run.py). Their defaults are `RunFlags`'s (daemon/options.py), their checks the
options groups'."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ipvsctl.cli.output import Output

# --- shared by plan and run -----------------------------------------------------------------

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


# --- run's own (daemon/options.py's groups complete them) -----------------------------------

Config = Annotated[
    Path | None,
    typer.Option(
        "--config",
        metavar="FILE",
        help="kube-proxy's KubeProxyConfiguration file (v1alpha1); flags given here win.",
    ),
]
Kubeconfig = Annotated[
    str | None,
    typer.Option(
        "--kubeconfig",
        envvar="KUBECONFIG",
        metavar="PATH",
        help="Kubeconfig file [default: in-cluster].",
    ),
]
Apiserver = Annotated[
    str | None,
    typer.Option(
        "--apiserver",
        metavar="URL",
        envvar="IPVSCTL_APISERVER",
        help="API server URL (overrides the kubeconfig's; http:// allowed).",
    ),
]
Manifests = Annotated[
    str | None,
    typer.Option(
        "--manifests",
        metavar="DIR",
        help="Standalone: follow Services/EndpointSlices/Pods in this folder.",
    ),
]
Interface = Annotated[str, typer.Option(metavar="NAME", help="Dummy interface holding the VIPs.")]
DrainTimeout = Annotated[
    str,
    typer.Option(
        "--drain-timeout",
        metavar="DURATION",
        help="Longest drain when no better deadline is known (30, 2.5, 30s, 5m...).",
    ),
]
ServiceDrainTimeout = Annotated[
    str,
    typer.Option(
        "--service-drain-timeout",
        metavar="DURATION",
        help="Longest drain of a virtual server that leaves the wanted set (its Service "
        "deleted, a port or address removed); 0: removed at once.",
    ),
]
DrainCheckInterval = Annotated[
    str,
    typer.Option(
        "--drain-check-interval",
        metavar="DURATION",
        help="Time between connection-count reads (1, 500ms...).",
    ),
]
IpvsTcpTimeout = Annotated[
    str,
    typer.Option(
        "--ipvs-tcp-timeout",
        metavar="DURATION",
        help="IPVS TCP timeout (0: kernel's; 900, 15m...).",
    ),
]
IpvsTcpfinTimeout = Annotated[
    str,
    typer.Option(
        "--ipvs-tcpfin-timeout", metavar="DURATION", help="IPVS TCP FIN timeout (0: kernel's)."
    ),
]
IpvsUdpTimeout = Annotated[
    str,
    typer.Option("--ipvs-udp-timeout", metavar="DURATION", help="IPVS UDP timeout (0: kernel's)."),
]
StateDir = Annotated[
    str,
    typer.Option("--state-dir", metavar="DIR", help="Where the drain queue survives restarts."),
]
Listen = Annotated[
    str,
    typer.Option(
        "--listen",
        metavar="HOST:PORT",
        help="HOST:PORT for /metrics, /healthz, /readyz, /status.",
    ),
]
LogFormat = Annotated[str, typer.Option("--log-format", metavar="FORMAT", help="text or json.")]
LogLevel = Annotated[
    str, typer.Option("--log-level", metavar="LEVEL", help="debug, info, warning or error.")
]
ClusterCidr = Annotated[
    list[str] | None,
    typer.Option(
        "--cluster-cidr",
        metavar="CIDR",
        help="The cluster's pod CIDR (repeatable, one per family): traffic "
        "to ClusterIPs from outside it is masqueraded.",
    ),
]
MasqueradeAll = Annotated[
    bool,
    typer.Option(
        "--masquerade-all/--no-masquerade-all", help="Masquerade all traffic to ClusterIPs."
    ),
]
Nftables = Annotated[
    bool,
    typer.Option(
        "--nftables/--no-nftables",
        help="Keep ipvsctl's nftables table (masquerading, hairpin).",
    ),
]
HealthzBindAddress = Annotated[
    str,
    typer.Option(
        "--healthz-bind-address",
        metavar="HOST:PORT",
        help="HOST:PORT of kube-proxy's health server (/healthz, "
        "/livez) for cloud load balancers; empty: none.",
    ),
]
ServiceMetrics = Annotated[
    str,
    typer.Option(
        "--service-metrics",
        metavar="WHICH",
        help="none, annotated or all: which Services get per-Service traffic metrics "
        '(annotated: those with ipvsctl.io/metrics: "true").',
    ),
]
ServiceMetricsMaxSeries = Annotated[
    int,
    typer.Option(
        "--service-metrics-max-series",
        metavar="N",
        help="Cap on per-Service traffic series; Services past it are left out, counted.",
    ),
]
DrainingTaints = Annotated[
    str,
    typer.Option(
        "--draining-taints",
        metavar="KEYS",
        help="Comma-separated taint keys (any effect) that mean this node is leaving: "
        "its /healthz answers 503 and it drains (docs/node-drain.md); empty: none.",
    ),
]
LbGrace = Annotated[
    str,
    typer.Option(
        "--lb-grace",
        metavar="DURATION",
        help="How long a draining node's health must have said 503 before it counts as "
        "quiesced: the load balancer's probe interval times its unhealthy threshold.",
    ),
]

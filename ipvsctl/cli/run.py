"""`ipvsctl run`: its flags parsed into `RunFlags`, completed into the daemon's options
(daemon/options.py, shared with `--config`'s file), and the daemon started."""

from __future__ import annotations

import typer

from ipvsctl.cli import flags as f
from ipvsctl.cli.errors import fail
from ipvsctl.daemon.options import DEFAULTS as D


def register(app: typer.Typer) -> None:
    @app.command()
    def run(
        ctx: typer.Context,
        config: f.Config = D.config,
        kubeconfig: f.Kubeconfig = D.kubeconfig,
        apiserver: f.Apiserver = D.apiserver,
        manifests: f.Manifests = D.manifests,
        node_name: f.NodeName = D.node_name,
        node_ip: f.NodeIPs = None,
        interface: f.Interface = D.interface,
        scheduler: f.Scheduler = D.scheduler,
        service_proxy_name: f.ServiceProxyName = D.service_proxy_name,
        service_node_port_range: f.NodePortRange = D.service_node_port_range,
        max_virtual_servers_per_service: f.MaxVirtualServers = D.max_virtual_servers_per_service,
        max_table_entries: f.MaxTableEntries = D.max_table_entries,
        drain_timeout: f.DrainTimeout = D.drain_timeout,
        service_drain_timeout: f.ServiceDrainTimeout = D.service_drain_timeout,
        drain_check_interval: f.DrainCheckInterval = D.drain_check_interval,
        ipvs_tcp_timeout: f.IpvsTcpTimeout = D.ipvs_tcp_timeout,
        ipvs_tcpfin_timeout: f.IpvsTcpfinTimeout = D.ipvs_tcpfin_timeout,
        ipvs_udp_timeout: f.IpvsUdpTimeout = D.ipvs_udp_timeout,
        state_dir: f.StateDir = D.state_dir,
        listen: f.Listen = D.listen,
        log_format: f.LogFormat = D.log_format,
        log_level: f.LogLevel = D.log_level,
        cluster_cidr: f.ClusterCidr = None,
        masquerade_all: f.MasqueradeAll = D.masquerade_all,
        nftables: f.Nftables = D.nftables,
        healthz_bind_address: f.HealthzBindAddress = D.healthz_bind_address,
        service_metrics: f.ServiceMetrics = D.service_metrics,
        service_metrics_max_series: f.ServiceMetricsMaxSeries = D.service_metrics_max_series,
        draining_taints: f.DrainingTaints = D.draining_taints,
        lb_grace: f.LbGrace = D.lb_grace,
    ) -> None:
        """The node daemon: follow Services and EndpointSlices, program IPVS, drain gracefully."""
        from ipvsctl.daemon import wiring
        from ipvsctl.daemon.adapters import StartupError
        from ipvsctl.daemon.options import OptionsError, RunFlags, complete
        from ipvsctl.obs import logging as obs_logging

        raw = RunFlags(
            **ctx.params,
            command_line=given(ctx, "COMMANDLINE"),
            environment=given(ctx, "ENVIRONMENT"),
        )
        try:  # from logging's set-up on, a fatal line is a log line
            options = complete(raw, setup_logging=obs_logging.setup)
        except OptionsError as exc:
            raise fail(str(exc), 2) from None
        if options.config is not None:
            options.config.log_notes()
        try:
            code = wiring.run(options)
        except StartupError as exc:
            raise fail(str(exc), 1) from None
        raise typer.Exit(code)


def given(ctx: typer.Context, where: str) -> frozenset[str]:
    """The parameters whose value came from `where` (typer's own copy of click's
    ParameterSource: compared by name)."""
    return frozenset(
        n for n in ctx.params if getattr(ctx.get_parameter_source(n), "name", "") == where
    )

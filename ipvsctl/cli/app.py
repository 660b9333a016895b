"""The `ipvsctl` command: plan, status, completion (and the commands registered from their
modules: run, shutdown-manager, cleanup, node-drain)."""

from __future__ import annotations

import dataclasses
import enum
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
import typer.core

from ipvsctl.cli.cleanup import register as register_cleanup
from ipvsctl.cli.errors import fail, plain
from ipvsctl.cli.flags import (
    AsJson,
    MaxTableEntries,
    MaxVirtualServers,
    NodeIPs,
    NodeName,
    NodePortRange,
    OutputOpt,
    Scheduler,
    ServiceProxyName,
)
from ipvsctl.cli.node_drain import register as register_node_drain
from ipvsctl.cli.output import Output, choose, dump
from ipvsctl.cli.params import ENDPOINT_ENV, daemon_url, split_short_equals
from ipvsctl.cli.run import register as register_run
from ipvsctl.cli.shutdown_manager import register as register_shutdown_manager
from ipvsctl.cli.version import register as register_version
from ipvsctl.daemon.options import DEFAULTS as D


class _Commands(typer.core.TyperGroup):
    """kubectl's `-o=json` as well as `-o json` (params.split_short_equals); the shell
    completion of `ipvsctl completion SHELL`'s scripts; a bad flag value said in one line,
    in ipvsctl's words, as its own checks say it."""

    def main(self, args: Any = None, *rest: Any, **kw: Any) -> Any:
        from typer._completion_classes import completion_init

        completion_init()  # what add_completion would register: typer's bash, zsh, fish
        return super().main(split_short_equals(sys.argv[1:] if args is None else args), *rest, **kw)

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)  # parses the command's flags
        except typer.BadParameter as exc:
            if type(exc) is not typer.BadParameter or exc.param is None:
                raise  # a missing flag: click's own words are right
            p = exc.param
            if getattr(p, "param_type_name", "") == "argument":  # its metavar: SHELL
                name = str(getattr(p, "metavar", None) or p.name or "").upper()
            else:
                name = "/".join(p.opts)
            raise fail(f"{name}: {plain(exc.message)}", 2) from None


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


def _output(output: Output | None, as_json: bool) -> Output:
    try:
        return choose(output, as_json)
    except ValueError as exc:
        raise fail(str(exc), 2) from None


def _endpoint(value: str) -> str:
    try:
        return daemon_url(value)
    except ValueError as exc:
        raise fail(f"--endpoint {value}: {exc}", 2) from None


def _all_addresses(interface: str) -> frozenset[str]:
    """Every address of this machine (Node safety's), or none when they cannot be read."""
    try:
        from ipvsctl.kernel.netlink.address_watch import HostAddressWatch

        watch = HostAddressWatch(interface).open()
        watch.close()
        return watch.host_addresses()
    except Exception:  # said once already by read_host_addresses when netlink is missing
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
    scheduler: Scheduler = D.scheduler,
    service_proxy_name: ServiceProxyName = D.service_proxy_name,
    service_node_port_range: NodePortRange = D.service_node_port_range,
    max_virtual_servers_per_service: MaxVirtualServers = D.max_virtual_servers_per_service,
    max_table_entries: MaxTableEntries = D.max_table_entries,
    output: OutputOpt = None,
    as_json: AsJson = False,
) -> None:
    """Print the IPVS state the daemon would program for these manifests (no kernel)."""
    from ipvsctl.cli.render import plan_json, plan_text
    from ipvsctl.daemon.options import OptionsError, RunFlags, node_context, read_host_addresses
    from ipvsctl.manifests import ManifestError, load_paths
    from ipvsctl.manifests.files import OtherId
    from ipvsctl.model import VirtualServerKind
    from ipvsctl.reconcile.cluster import node_object_addresses, plan_report

    fmt = _output(output, as_json)
    raw = RunFlags(
        node_name=node_name,
        node_ip=node_ip,
        scheduler=scheduler,
        service_proxy_name=service_proxy_name,
        service_node_port_range=service_node_port_range,
        max_virtual_servers_per_service=max_virtual_servers_per_service,
        max_table_entries=max_table_entries,
    )
    try:
        node = node_context(raw, read_host=None)  # a cluster dump may name its Node's
    except OptionsError as exc:
        raise fail(str(exc), 2) from None
    others: list[OtherId] = []
    try:
        objects = load_paths(files, others)
    except ManifestError as exc:
        raise fail(str(exc), 2) from None
    # A cluster dump's NodePorts are on its Node's addresses, not on this machine's.
    from_node = None if node_ip else node_object_addresses(objects, node.node_name)
    if not node_ip:
        ips = from_node or tuple(dict.fromkeys(read_host_addresses("kube-ipvs0")))
        node = dataclasses.replace(node, node_ips=ips)
        if not from_node:  # planned as this machine: Node safety counts all its addresses
            node = dataclasses.replace(node, host_ips=_all_addresses("kube-ipvs0"))
    report = plan_report(objects, node, others)
    result = report.virtual_servers
    for p in report.problems:
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
    name = node.node_name
    if fmt in (Output.json, Output.yaml):
        typer.echo(dump(plan_json(result, report.skipped, name), fmt), nl=False)
    else:
        wide = fmt is Output.wide
        typer.echo(plan_text(result, wide, report.skipped, name), nl=False)


register_run(app)  # here: `ipvsctl --help` lists the commands in this order


@app.command()
def status(
    endpoint: Annotated[
        str,
        typer.Option(
            "--endpoint",
            metavar="URL",
            envvar=ENDPOINT_ENV,
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

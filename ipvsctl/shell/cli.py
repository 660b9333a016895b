"""The `ipvsctl` command: run, status, plan."""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path
from typing import Annotated

import typer

from ipvsctl.model import NodeContext, normalize_ip

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="A per-node Kubernetes service proxy on Linux IPVS with graceful termination.",
    pretty_exceptions_enable=False,
)

@app.callback()
def _root() -> None:
    """A per-node Kubernetes service proxy on Linux IPVS with graceful termination."""


NodeName = Annotated[
    str | None,
    typer.Option("--node-name", envvar="NODE_NAME", help="This node [default: hostname]."),
]
NodeIPs = Annotated[
    list[str] | None,
    typer.Option("--node-ip", help="Addresses NodePorts listen on (repeatable) "
                 "[default: the node's global addresses]."),
]
Scheduler = Annotated[str, typer.Option("--scheduler", help="Default IPVS scheduler.")]


def _fail(message: str, code: int = 1) -> typer.Exit:
    typer.echo(f"ipvsctl: {message}", err=True)
    return typer.Exit(code)


def _node(node_name: str | None, node_ips: list[str] | None, scheduler: str) -> NodeContext:
    from ipvsctl.source.convert import IPVS_SCHEDULERS

    if scheduler not in IPVS_SCHEDULERS:
        raise _fail(f"--scheduler {scheduler}: unknown IPVS scheduler "
                    f"(one of {', '.join(sorted(IPVS_SCHEDULERS))})", 2)
    ips: list[str] = []
    if node_ips:
        for ip in node_ips:
            try:
                ips.append(normalize_ip(ip))
            except ValueError:
                raise _fail(f"--node-ip {ip}: not an IP address", 2) from None
    else:
        try:
            from ipvsctl.kernel.addresses import node_addresses

            ips = node_addresses()
        except Exception as exc:  # no netlink route socket: plan still works without
            typer.echo(f"ipvsctl: cannot read the node's addresses ({exc}); "
                       "NodePorts need --node-ip", err=True)
    return NodeContext(node_name or socket.gethostname(), tuple(dict.fromkeys(ips)), scheduler)


@app.command()
def plan(
    files: Annotated[list[Path], typer.Option("-f", "--filename", help=(
        "Manifest file or folder (*.yaml, *.yml, *.json; repeatable)."))],
    node_name: NodeName = None,
    node_ip: NodeIPs = None,
    scheduler: Scheduler = "rr",
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Print the IPVS state the daemon would program for these manifests (no kernel)."""
    from ipvsctl.plan.cluster import plan_objects
    from ipvsctl.shell.render import plan_json, plan_text
    from ipvsctl.source.manifests import ManifestError, load_paths

    node = _node(node_name, node_ip, scheduler)
    try:
        objects = load_paths(files)
    except ManifestError as exc:
        raise _fail(str(exc), 2) from None
    result, problems = plan_objects(objects, node)
    for p in problems:
        what = "skipped" if p.fatal else "warning"
        typer.echo(f"ipvsctl: {p.kind.value} {p.name} {what}: {p.reason}", err=True)
    if as_json:
        typer.echo(json.dumps(plan_json(result), indent=2))
    else:
        typer.echo(plan_text(result), nl=False)


def main() -> None:
    try:
        app()
    except BrokenPipeError:  # `ipvsctl plan ... | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)


if __name__ == "__main__":
    main()

"""`ipvsctl check-config FILE`: a kube-proxy configuration file read as `run --config FILE`
reads it, starting nothing. The same completion as `run` (daemon/options.py's `complete`
on `RunFlags(config=FILE)`), so the answer is the daemon's: exit 0 when `run --config FILE`
would start with the file, 2 with the same one line when it would refuse it.

It prints every field the file sets and what ipvsctl does with it (the flag it sets, not
used and why, refused and why), then the settings that result for everything a file can
set (taken from a field, or the default)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from ipvsctl.cli.errors import fail
from ipvsctl.cli.output import columns
from ipvsctl.source.kubeproxy_config import Judgement, Kind, Verdict

VALUE_WIDTH = 48  # a longer value is cut, with an ellipsis

# What each setting a file can set is when the file leaves it (RunFlags' defaults in words
# where the default is found at start).
SETTING_DEFAULTS = {
    "--kubeconfig": "in-cluster config (or KUBECONFIG)",
    "--node-name": "the node's hostname (or NODE_NAME)",
    "nodePortAddresses": "all the node's global addresses",
    "ipvs.excludeCIDRs": "none",
    "ipvs.strictARP": "false",
}


def _value(v: Any) -> str:
    text = v if isinstance(v, str) else json.dumps(v, separators=(",", ":"), default=str)
    text = " ".join(text.split()) or '""'
    return text if len(text) <= VALUE_WIDTH else text[: VALUE_WIDTH - 3] + "..."


def what(v: Verdict, set_flags: frozenset[str]) -> str:
    """What ipvsctl does with one field, in a few words (`set_flags`: the fields that did
    set a flag)."""
    if v.refused:
        return f"refused: {v.error}"
    if v.kind is Kind.SETS:
        if not v.ipvsctl.startswith("--"):
            return f"sets: {v.ipvsctl}"
        if v.path not in set_flags:  # logging.verbosity below 4
            return f"sets {v.ipvsctl}: nothing at this value"
        return f"sets {v.ipvsctl}"
    if v.kind is Kind.NOTED:
        return f"not used: {v.ipvsctl}"
    return f"checked: {v.ipvsctl}"  # apiVersion, kind, mode ipvs: what ipvsctl is


def field_lines(j: Judgement, refused: tuple[str, str] | None = None) -> list[str]:
    """The fields the file sets, one a line; `refused`: (field, why) a flag's check refused
    the value of (the verdict said it sets that flag)."""
    shown = [v for v in j.verdicts if v.kind is not None or v.refused]
    empty = len(j.verdicts) - len(shown)
    set_flags = frozenset(j.settings.sources.values())
    rows = [("FIELD", "VALUE", "IPVSCTL")]
    for v in shown:
        text = what(v, set_flags)
        if refused is not None and v.path == refused[0]:
            text = f"refused: {refused[1]}"
        rows.append((v.path, _value(v.value), text))
    out = columns(rows)
    if empty:
        out.append(f"({empty} more fields left empty or at kube-proxy's default: nothing to do)")
    return out


def setting_lines(took: tuple[tuple[str, str], ...], defaults: dict[str, str]) -> list[str]:
    """Every setting a file can set: its value, and where it comes from."""
    from ipvsctl.daemon.config_file import FILE_FLAGS

    taken = dict(took)
    rows = [("SETTING", "VALUE", "FROM")]
    flags = sorted("--" + n.replace("_", "-") for n in FILE_FLAGS)
    names = [*flags, "nodePortAddresses", "ipvs.excludeCIDRs", "ipvs.strictARP"]
    for name in names:
        if name in taken:
            rows.append((name, _value(taken[name]), "the file"))
        else:
            rows.append((name, SETTING_DEFAULTS.get(name, defaults.get(name, "")), "default"))
    return columns(rows)


def _defaults() -> dict[str, str]:
    from ipvsctl.daemon.config_file import FILE_FLAGS
    from ipvsctl.daemon.options import DEFAULTS

    out = {}
    for name in FILE_FLAGS:
        value = getattr(DEFAULTS, name)
        flag = "--" + name.replace("_", "-")
        out[flag] = "false" if value is False else "none" if value in (None, ()) else f"{value}"
    out["--ipvs-tcp-timeout"] = out["--ipvs-tcpfin-timeout"] = out["--ipvs-udp-timeout"] = (
        "0 (the kernel's)"
    )
    return out


def check_config(
    file: Annotated[Path, typer.Argument(metavar="FILE", help="A KubeProxyConfiguration file.")],
) -> None:
    """Read a kube-proxy configuration file as `run --config FILE` would; start nothing."""
    from ipvsctl.daemon.options import OptionsError, RunFlags, complete

    try:
        # The node's addresses are the node's business at start: not read here.
        options = complete(RunFlags(config=file), host_addresses=lambda interface: [])
    except OptionsError as exc:
        if exc.judgement is not None:
            why = str(exc).split(f"{exc.field}: ", 1)[-1]
            refused = (exc.field, why) if exc.field else None
            typer.echo("\n".join(field_lines(exc.judgement, refused)))
        raise fail(str(exc), 2) from None
    config = options.config
    assert config is not None
    typer.echo(f"{file}: a KubeProxyConfiguration that `ipvsctl run --config` accepts")
    typer.echo("")
    typer.echo("\n".join(field_lines(config.judgement)))
    typer.echo("")
    typer.echo("Settings (a flag given to `ipvsctl run` wins over the file):")
    typer.echo("\n".join("  " + line for line in setting_lines(config.took, _defaults())))
    raise typer.Exit(0)


def register(app: typer.Typer) -> None:
    app.command("check-config")(check_config)

"""`ipvsctl version`: what to pin and to quote in a bug report: ipvsctl's version, the commit
it was built from, the Python running it and the pyroute2 it talks to the kernel through.

The version and commit are `ipvsctl.__version__` and `ipvsctl.__commit__`, which `make dist`
writes from the git tag and the commit into the copy it builds the wheel, the sdist and the
image from. A checkout (an editable install) has no commit written: it is asked of git, with
`-dirty` when tracked files differ, or `unknown` without git.
"""

from __future__ import annotations

import enum
import importlib.metadata
import platform
import subprocess
from pathlib import Path
from typing import Annotated

import typer

from ipvsctl.cli.output import Output, dump


class VersionOutput(enum.StrEnum):
    text = "text"
    json = "json"
    yaml = "yaml"


def _git(checkout: Path, *args: str) -> str | None:
    try:
        r = subprocess.run(
            ["git", "-C", str(checkout), *args],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def checkout_commit(package_dir: Path) -> str | None:
    """The commit of the git checkout the package runs from (an editable install), with
    `-dirty` when tracked files differ from it; None when it is not in one."""
    checkout = package_dir.parent
    if not (checkout / ".git").exists():  # a directory, or a worktree's file
        return None
    commit = _git(checkout, "rev-parse", "HEAD")
    if not commit:
        return None
    changed = _git(checkout, "status", "--porcelain", "--untracked-files=no", "--", "ipvsctl")
    return f"{commit}-dirty" if changed else commit


def build_info() -> dict[str, str]:
    import ipvsctl

    try:
        pyroute2 = importlib.metadata.version("pyroute2")
    except importlib.metadata.PackageNotFoundError:
        pyroute2 = "not installed"
    commit = ipvsctl.__commit__ or checkout_commit(Path(ipvsctl.__file__).parent) or "unknown"
    return {
        "version": ipvsctl.__version__,
        "commit": commit,
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "pyroute2": pyroute2,
    }


def version(
    output: Annotated[
        VersionOutput,
        typer.Option("-o", "--output", metavar="FORMAT", help="text, json or yaml."),
    ] = VersionOutput.text,
) -> None:
    """Print ipvsctl's version, the commit it was built from, Python's and pyroute2's."""
    info = build_info()
    if output is VersionOutput.text:
        typer.echo(
            f"ipvsctl {info['version']}\n"
            f"commit:   {info['commit']}\n"
            f"python:   {info['python']} ({info['python_implementation']})\n"
            f"pyroute2: {info['pyroute2']}"
        )
    else:
        typer.echo(dump(info, Output(output.value)), nl=False)


def register(app: typer.Typer) -> None:
    app.command("version")(version)

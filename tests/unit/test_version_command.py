"""`ipvsctl version`: the version, the commit, Python's and pyroute2's, as text and JSON."""

from __future__ import annotations

import importlib.metadata
import json
import platform
import re
import subprocess
from pathlib import Path

from typer.testing import CliRunner

import ipvsctl
from ipvsctl.cli.app import app
from ipvsctl.cli.version import checkout_commit


def test_version_names_what_to_pin(monkeypatch):
    monkeypatch.setattr(ipvsctl, "__commit__", "0123456789abcdef0123456789abcdef01234567")
    r = CliRunner().invoke(app, ["version"])
    assert r.exit_code == 0, r.output
    assert r.output.splitlines() == [
        f"ipvsctl {ipvsctl.__version__}",
        "commit:   0123456789abcdef0123456789abcdef01234567",
        f"python:   {platform.python_version()} ({platform.python_implementation()})",
        f"pyroute2: {importlib.metadata.version('pyroute2')}",
    ]
    r = CliRunner().invoke(app, ["version", "-o", "json"])
    assert json.loads(r.output) == {
        "version": ipvsctl.__version__,
        "commit": "0123456789abcdef0123456789abcdef01234567",
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "pyroute2": importlib.metadata.version("pyroute2"),
    }
    assert CliRunner().invoke(app, ["version", "-o", "wide"]).exit_code == 2
    r = CliRunner().invoke(app, ["--version"])  # kept, as before
    assert r.exit_code == 0 and r.output == f"ipvsctl {ipvsctl.__version__}\n"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True
    ).stdout.strip()


def test_a_checkout_without_a_built_commit_asks_git(tmp_path):
    repo = tmp_path / "checkout"
    package = repo / "ipvsctl"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text('__version__ = "1"\n')
    assert checkout_commit(package) is None  # not a git checkout
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x")
    head = git(repo, "rev-parse", "HEAD")
    assert checkout_commit(package) == head
    (package / "__init__.py").write_text('__version__ = "2"\n')
    assert checkout_commit(package) == f"{head}-dirty"


def test_without_git_the_commit_is_unknown(monkeypatch, tmp_path):
    monkeypatch.setattr(ipvsctl, "__commit__", "")
    monkeypatch.setattr(ipvsctl, "__file__", str(tmp_path / "ipvsctl" / "__init__.py"))
    r = CliRunner().invoke(app, ["version", "-o", "yaml"])
    assert r.exit_code == 0 and "commit: unknown" in r.output


def test_the_lines_make_dist_rewrites_are_there():
    """release/dist.sh rewrites these two lines, by these patterns, in the copy it builds."""
    text = (Path(ipvsctl.__file__).parent / "__init__.py").read_text()
    for key in ("__version__", "__commit__"):
        assert len(re.findall(rf'^{key} = "[^"]*"$', text, re.M)) == 1, key

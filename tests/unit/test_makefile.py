"""`make` alone lists the targets (what each does, how long, what it installs) and builds,
installs and boots nothing; `make help` is the same list; `make test` is still what CI
runs."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).parents[2]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make")


def make(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "--no-print-directory", "-C", str(REPO), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def phony() -> list[str]:
    text = (REPO / "Makefile").read_text()
    return [t for line in re.findall(r"^\.PHONY:(.*)$", text, re.M) for t in line.split()]


def test_a_bare_make_only_prints_what_it_would_run():
    dry = make("-n")
    assert dry.returncode == 0, dry.stderr
    commands = [line for line in dry.stdout.splitlines() if line.strip()]
    assert len(commands) == 2 and commands[0].startswith("echo ") and "awk" in commands[1]
    for words in ("tests.lab", "pytest", "pip", "build.sh", "qemu", "apt-get"):
        assert words not in dry.stdout


def test_make_and_make_help_list_every_target_with_what_it_does():
    bare, help_ = make(), make("help")
    assert bare.returncode == help_.returncode == 0
    assert bare.stdout == help_.stdout
    listed = dict(
        re.match(r"  (\S+)\s+(.*)", line).groups()  # type: ignore[union-attr]
        for line in bare.stdout.splitlines()[1:]
    )
    assert set(listed) == set(phony())
    for target in ("test-unit", "test-lab", "test", "image", "venv", "lab-deps"):
        assert re.search(r"\d|root|apt|PyPI", listed[target]), (target, listed[target])


def test_make_test_is_still_everything_ci_runs():
    text = (REPO / "Makefile").read_text()
    (prereqs,) = re.findall(r"^test: ([^#\n]*)", text, re.M)
    assert prereqs.split() == ["lint", "test-unit", "test-deploy", "test-image", "test-lab"]
    assert "make test" in (REPO / ".ci" / "run").read_text()

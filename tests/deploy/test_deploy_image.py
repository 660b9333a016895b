"""The image's pinned dependencies: one constraints file, used by both builds, that pins
every runtime dependency of pyproject.toml within its range."""

from __future__ import annotations

import re
import tomllib

from packaging.requirements import Requirement

from .helpers import DAEMONSET_DIR, REPO

CONSTRAINTS = DAEMONSET_DIR / "constraints.txt"


def pins() -> dict[str, str]:
    out = {}
    for line in CONSTRAINTS.read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"not pinned: {line!r}"
            out[re.sub(r"[-_.]+", "-", name).lower()] = version
    return out


def test_every_runtime_dependency_is_pinned_within_its_range():
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    pinned = pins()
    for dep in map(Requirement, deps):
        name = re.sub(r"[-_.]+", "-", dep.name).lower()
        assert name in pinned, f"{dep.name} is not in {CONSTRAINTS.name}"
        assert dep.specifier.contains(pinned[name], prereleases=True), (dep, pinned[name])
    assert "ipvsctl" not in pinned


def test_both_builds_use_the_constraints():
    dockerfile = (DAEMONSET_DIR / "Dockerfile").read_text()
    assert "--constraint /src/daemonset/constraints.txt" in dockerfile
    assert "pip uninstall --yes pip setuptools wheel" in dockerfile
    assert "!daemonset/constraints.txt" in (REPO / ".dockerignore").read_text().splitlines()
    assert "daemonset/constraints.txt" in (DAEMONSET_DIR / "image" / "build.sh").read_text()

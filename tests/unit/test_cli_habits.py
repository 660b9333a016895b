"""kubectl's habits in the CLI: -h, -o=json, metavars, values checked while
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
from ipvsctl.cli import cleanup as cleanup_mod
from ipvsctl.cli.app import app
from ipvsctl.cli.params import daemon_url, host_port, split_short_equals
from ipvsctl.daemon import options as options_mod

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
    monkeypatch.setattr(options_mod, "node_context", lambda *a, **k: touched.append("node"))
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
    assert got[0].source.manifests == str(tmp_path)


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


# --- plan on a cluster dump -----------------------------------------------------------------
def _dump(tmp_path: Path) -> Path:
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "node-a"},
        "status": {
            "addresses": [
                {"type": "Hostname", "address": "node-a"},
                {"type": "InternalIP", "address": "10.0.0.5"},
                {"type": "InternalIP", "address": "not-an-ip"},
            ]
        },
    }
    web = service(
        "web",
        type="NodePort",
        externalTrafficPolicy="Local",
        ports=[{"name": "http", "port": 80, "nodePort": 30080}],
    )
    slice_ = endpoint_slice(
        "web",
        [endpoint("10.244.1.5", pod="web-1", node="node-a"), endpoint("10.244.2.9", pod="web-2")],
    )
    f = tmp_path / "dump.yaml"
    f.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [node, web, slice_]}))
    return f


def test_plan_puts_nodeports_on_the_named_nodes_addresses(tmp_path):
    r = cli("plan", "-f", str(_dump(tmp_path)), "--node-name", "node-a", "-o", "json")
    assert r.returncode == 0, r.stderr
    addresses = {v["address"] for v in json.loads(r.stdout)["virtual_servers"]}
    assert addresses == {"10.96.0.10", "10.0.0.5"}
    assert r.stderr == (
        "ipvsctl: NodePorts on 10.0.0.5: Node node-a's InternalIP/ExternalIP addresses\n"
    )
    # --node-ip still wins, and says nothing
    r = cli("plan", "-f", str(_dump(tmp_path)), "--node-name", "node-a", "--node-ip", "192.0.2.7")
    assert "192.0.2.7:30080" in r.stdout and "10.0.0.5" not in r.stdout and r.stderr == ""


def test_plan_says_which_addresses_it_used_without_the_node(tmp_path):
    r = cli("plan", "-f", str(_dump(tmp_path)), "--node-name", "node-z")
    assert r.returncode == 0, r.stderr
    (line,) = r.stderr.splitlines()
    assert line.startswith("ipvsctl: NodePorts on ")
    assert line.endswith(
        "this machine's addresses (no Node node-z in the input; --node-name or --node-ip to choose)"
    )


def test_plan_json_has_everything_wide_shows(tmp_path):
    args = ("plan", "-f", str(_dump(tmp_path)), "--node-name", "node-a")
    wide = invoke(*args, "-o", "wide").stdout.splitlines()
    doc = json.loads(invoke(*args, "-o", "json").stdout)
    table = wide[2 : wide.index("")] if "" in wide else wide[2:]  # the skipped list after
    vs_rows = [line.split() for line in table if not line.startswith("  ")]
    rs_rows = [line.split() for line in table if line.startswith("  -> ")]
    assert len(vs_rows) == len(doc["virtual_servers"]) == 2
    rs_docs = [rs for v in doc["virtual_servers"] for rs in v["real_servers"]]
    assert len(rs_rows) == len(rs_docs) > 0
    for row, v in zip(vs_rows, doc["virtual_servers"], strict=True):
        prot, hostport, sched, persist, svc, kind, local, ranges, hc, drain = row
        assert (prot, sched) == (v["protocol"], v["scheduler"])
        assert hostport == f"{v['address']}:{v['port']}"
        assert svc == f"{v['service']}:{v['port_name']}" and kind == f"({v['kind']})"
        assert local == ("yes" if v["traffic_policy_local"] else "-")
        assert ranges == (",".join(v["source_ranges"]) if v["source_ranges"] else "-")
        assert persist == (str(v["persistent_timeout"]) if v["persistent_timeout"] else "-")
        assert hc == str(v["health_check_node_port"] or "-")
        assert drain == (f"{v['drain_timeout']:g}s" if v["drain_timeout"] is not None else "-")
    for row, rs in zip(rs_rows, rs_docs, strict=True):
        _, hostport, weight, pod, node = row
        assert hostport == f"{rs['address']}:{rs['port']}" and int(weight) == rs["weight"]
        assert (pod, node) == (rs["pod"] or "-", rs["node"] or "-")

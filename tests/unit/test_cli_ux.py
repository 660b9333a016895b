"""The CLI's habits: --version, -o, plan -f -, help at 80 columns, wide IPv6 columns, and
status against another machine's daemon."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import typer.main
import yaml
from typer.testing import CliRunner

import ipvsctl
from devkit.builders import endpoint, endpoint_slice, service
from devkit.harness import rs, vs
from ipvsctl.cli import status as status_mod
from ipvsctl.cli.app import app
from ipvsctl.cli.status import endpoint_is_local, join_status, render_status
from ipvsctl.model import RealServerStatus, VirtualServer, VirtualServerStatus

REPO = Path(__file__).resolve().parents[2]
V6_NODE = "2001:db8:ffff:ffff:ffff:ffff:ffff:ffff"  # the longest compressed form there is
V6_POD = "fd00:1234:5678:9abc:def0:1234:5678:9abc"


def invoke(*args: str, input: str | None = None):
    return CliRunner().invoke(app, list(args), input=input)


@pytest.fixture
def manifests(tmp_path) -> Path:
    f = tmp_path / "web.yaml"
    f.write_text(
        yaml.safe_dump_all(
            [
                service(
                    "web",
                    type="NodePort",
                    cluster_ip="fd00::10",
                    ip_families=["IPv6"],
                    ports=[{"name": "http", "port": 80, "nodePort": 30080}],
                ),
                endpoint_slice(
                    "web", [endpoint(V6_POD, pod="web-1", node="node-b")], address_type="IPv6"
                ),
            ]
        )
    )
    return f


def test_version_is_the_package_version():
    r = invoke("--version")
    assert r.exit_code == 0 and r.output == f"ipvsctl {ipvsctl.__version__}\n"
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert "version" in meta.get("dynamic", []), "pyproject must take the version from ipvsctl"


def test_plan_output_formats_agree(manifests):
    base = ["plan", "-f", str(manifests), "--node-ip", V6_NODE, "--node-name", "node-a"]
    as_json = invoke(*base, "--json")
    assert as_json.exit_code == 0, as_json.output
    doc = json.loads(as_json.output)
    assert [v["address"] for v in doc["virtual_servers"]] == [V6_NODE, "fd00::10"]
    assert json.loads(invoke(*base, "-o", "json").output) == doc
    assert yaml.safe_load(invoke(*base, "-o", "yaml").output) == doc
    assert invoke(*base, "--json", "-o", "json").exit_code == 0
    bad = invoke(*base, "--json", "-o", "yaml")
    assert bad.exit_code == 2 and "contradict" in bad.output
    assert invoke(*base, "-o", "xml").exit_code == 2


def cells(line: str) -> list[str]:
    return re.split(r"\s{2,}", line.strip())


def test_plan_table_columns_fit_long_ipv6_addresses(manifests):
    r = invoke("plan", "-f", str(manifests), "--node-ip", V6_NODE, "--node-name", "node-a")
    assert r.exit_code == 0, r.output
    vs_lines = [ln for ln in r.output.splitlines() if ln.startswith("TCP")]
    rs_lines = [ln for ln in r.output.splitlines() if ln.startswith("  -> [")]
    assert cells(vs_lines[0])[:3] == ["TCP", f"[{V6_NODE}]:30080", "rr"]
    assert cells(rs_lines[0]) == ["-> [" + V6_POD + "]:8080", "1", "default/web-1"]
    # one column grid: the scheduler starts at the same place on every virtual-server line
    assert len({ln.index(" rr ") for ln in vs_lines}) == 1
    wide = invoke("plan", "-f", str(manifests), "--node-ip", V6_NODE, "-o", "wide").output
    (rs_wide, *_) = [ln for ln in wide.splitlines() if ln.startswith("  -> [")]
    assert cells(rs_wide)[-1] == "node-b"


def test_plan_reads_stdin(manifests):
    text = manifests.read_text()
    r = invoke("plan", "-f", "-", "--node-ip", V6_NODE, "--json", input=text)
    assert r.exit_code == 0, r.output
    from_file = invoke("plan", "-f", str(manifests), "--node-ip", V6_NODE, "--json")
    assert json.loads(r.output) == json.loads(from_file.output)
    # JSON on stdin too (kubectl get -o json | ipvsctl plan -f -)
    as_list = json.dumps({"kind": "List", "items": list(yaml.safe_load_all(text))})
    r = invoke("plan", "-f", "-", "--node-ip", V6_NODE, "--json", input=as_list)
    assert json.loads(r.output) == json.loads(from_file.output)


def _commands():
    root = typer.main.get_command(app)
    return [[]] + [[name] for name in root.commands]  # type: ignore[attr-defined]


@pytest.mark.parametrize("cmd", _commands(), ids=lambda c: " ".join(c) or "ipvsctl")
def test_help_fits_80_columns_and_names_every_option_whole(cmd):
    r = subprocess.run(
        [sys.executable, "-m", "ipvsctl", *cmd, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"COLUMNS": "80", "PATH": "/usr/bin:/bin"},
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert max(map(len, lines)) <= 80 and "…" not in r.stdout
    command = typer.main.get_command(app)
    for name in cmd:
        command = command.commands[name]  # type: ignore[attr-defined]
    for param in command.params:
        for opt in (*param.opts, *param.secondary_opts):
            if opt.startswith("-"):
                assert re.search(rf"(^|[\s,/]){re.escape(opt)}([\s,=]|$)", r.stdout, re.M), opt
    if cmd == ["run"]:  # help strings' own defaults are shown, not eaten as markup
        assert "[default: hostname]" in re.sub(r"\s+", " ", r.stdout)


def test_endpoint_is_local():
    assert endpoint_is_local("http://127.0.0.1:9796")
    assert endpoint_is_local("http://localhost:9796/")
    assert endpoint_is_local("127.0.0.1:9796")
    assert not endpoint_is_local("http://192.0.2.1:9796")  # TEST-NET-1: nobody's address
    assert not endpoint_is_local("http://no-such-host.invalid:9796")
    assert not endpoint_is_local("http://:9796")


def test_status_against_another_machine_does_not_read_this_kernel(monkeypatch):
    import ipvsctl.kernel.netlink as netlink

    reads = []
    monkeypatch.setattr(netlink, "read_host_statuses", lambda: reads.append(1) or [])
    r = invoke("status", "--endpoint", "http://192.0.2.1:9796")
    assert reads == [] and r.exit_code == 1
    assert "another machine" in r.output

    daemon = {
        "node": "node-b",
        "ready": True,
        "drain_queue": [],
        "virtual_servers": [
            {
                "protocol": "TCP",
                "address": "10.96.0.10",
                "port": 80,
                "scheduler": "rr",
                "persistent_timeout": 0,
                "service": "default/web",
                "port_name": "http",
                "kind": "ClusterIP",
                "real_servers": [
                    {
                        "address": "10.244.1.5",
                        "port": 8080,
                        "weight": 0,
                        "pod": "default/web-1",
                        "node": "node-b",
                        "state": "draining",
                        "active_conns": 3,
                        "inactive_conns": 1,
                        "drain": {
                            "reason": "removed",
                            "age": 2.0,
                            "time_left": 28.0,
                            "deadline_source": "flag",
                        },
                    }
                ],
            }
        ],
    }
    monkeypatch.setattr(status_mod, "fetch_daemon_status", lambda endpoint: (daemon, None))
    r = invoke("status", "--endpoint", "http://192.0.2.1:9796", "-o", "json")
    assert reads == [] and r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["kernel"] == {
        "readable": False,
        "machine": "remote",
        "error": "not read: the daemon is on another machine",
    }
    (rsv,) = doc["virtual_servers"][0]["real_servers"]
    assert (rsv["active_conns"], rsv["inactive_conns"]) == (3, 1)  # the daemon's own counts
    text = invoke("status", "--endpoint", "http://192.0.2.1:9796").output
    assert "the daemon is on another machine" in text
    assert re.search(r"-> 10\.244\.1\.5:8080\s+0\s+3\s+1\s+default/web-1 DRAINING", text)
    wide = invoke("status", "--endpoint", "http://192.0.2.1:9796", "-o", "wide").output
    assert re.search(r"\s1\s+node-b\s+default/web-1 DRAINING .*deadline from flag", wide)

    # the same daemon on this machine: joined with (a fake of) this machine's table
    monkeypatch.setattr(netlink, "read_host_statuses", lambda: reads.append(1) or [])
    r = invoke("status", "--endpoint", "http://127.0.0.1:9796", "-o", "yaml")
    assert reads == [1] and yaml.safe_load(r.output)["kernel"]["machine"] == "local"


def test_status_table_fits_ipv6():
    kernel = [
        VirtualServerStatus(
            VirtualServer(vs(V6_NODE, 30080)), (RealServerStatus(rs(V6_POD), 1, 12345, 7),)
        )
    ]
    text = render_status(join_status(kernel, None, None, "down", "http://x"))
    (line,) = [ln for ln in text.splitlines() if ln.startswith("  -> [")]
    assert cells(line) == [f"-> [{V6_POD}]:8080", "1", "12345", "7"]


def test_shell_completion_completes_commands_and_output_formats():
    def complete(words: str) -> list[str]:
        env = {
            "PATH": "/usr/bin:/bin",
            "_IPVSCTL_COMPLETE": "complete_bash",
            "COMP_WORDS": words,
            "COMP_CWORD": str(len(words.split()) - 1 + words.endswith(" ")),
        }
        r = subprocess.run(
            [
                sys.executable,
                "-c",
                "from ipvsctl.cli.app import main; import sys; sys.argv[0] = 'ipvsctl'; main()",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        return r.stdout.split()

    assert complete("ipvsctl st") == ["status"]
    assert complete("ipvsctl status -o ") == ["table", "wide", "json", "yaml"]


def test_plan_stdin_that_does_not_parse_is_exit_2_naming_standard_input():
    r = invoke("plan", "-f", "-", input="a: [")
    assert r.exit_code == 2
    assert "ipvsctl: standard input:2:1: not valid YAML" in r.output

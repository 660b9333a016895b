"""Start-up errors: one clear line and exit 1 (CONTRACT.md `run` exit codes)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from ipvsctl.obs.logging import JSONFormatter, TextFormatter, fields


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ipvsctl", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def one_line(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 1, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ipvsctl: "), r.stderr
    return lines[0]


def test_unreadable_kubeconfig(tmp_path):
    line = one_line(
        cli("run", "--kubeconfig", str(tmp_path / "nope"), "--state-dir", str(tmp_path / "s"))
    )
    assert "kubeconfig" in line and "nope" in line


def test_invalid_kubeconfig(tmp_path):
    bad = tmp_path / "config"
    bad.write_text("clusters: [not: a kubeconfig")
    assert "kubeconfig" in one_line(
        cli("run", "--kubeconfig", str(bad), "--state-dir", str(tmp_path / "s"))
    )


def test_no_api_configuration_at_all(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    line = one_line(cli("run", "--state-dir", str(tmp_path / "s"), env=env))
    assert "--kubeconfig" in line


@pytest.mark.skipif(__import__("os").path.exists("/proc/net/ip_vs"), reason="host has IPVS")
def test_no_ipvs_in_the_kernel(tmp_path):
    (tmp_path / "m").mkdir()
    line = one_line(
        cli(
            "run",
            "--manifests",
            str(tmp_path / "m"),
            "--state-dir",
            str(tmp_path / "s"),
            "--listen",
            "127.0.0.1:0",
        )
    )
    assert "IPVS" in line and "modprobe" in line


def _record(msg: str, **kw: object) -> logging.LogRecord:
    rec = logging.LogRecord("ipvsctl.engine", logging.INFO, __file__, 1, msg, (), None)
    rec.fields = fields(**kw)["fields"]
    return rec


def test_json_logs_carry_object_and_action():
    out = json.loads(
        JSONFormatter().format(
            _record("drain started", service="default/web", rs="10.0.0.1:80", deadline_in=30.0)
        )
    )
    assert out["msg"] == "drain started" and out["service"] == "default/web"
    assert out["deadline_in"] == 30.0 and out["level"] == "info"


def test_text_logs_are_key_value():
    line = TextFormatter().format(
        _record("real server deleted", reason="drained", service="default/web app")
    )
    assert line.endswith('real server deleted reason=drained service="default/web app"')


def test_the_shipped_api_server_placeholder_is_refused_at_start(tmp_path):
    """daemonset/kustomization.yaml's placeholder, as the DaemonSet passes it (env): one line
    naming what to edit, exit 2, instead of a daemon retrying forever, never ready."""
    import re
    from pathlib import Path

    shipped = (Path(__file__).parents[2] / "daemonset" / "kustomization.yaml").read_text()
    url = re.search(r"IPVSCTL_APISERVER=(\S+)", shipped).group(1)  # type: ignore[union-attr]
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "IPVSCTL_APISERVER": url}
    r = cli("run", "--state-dir", str(tmp_path / "s"), env=env)
    assert r.returncode == 2, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert url in line and "daemonset/kustomization.yaml" in line
    assert not (tmp_path / "s").exists()  # refused before anything was set up


def test_a_fatal_start_up_line_is_json_with_log_format_json(tmp_path):
    r = cli(
        "run",
        "--log-format",
        "json",
        "--kubeconfig",
        str(tmp_path / "nope"),
        "--state-dir",
        str(tmp_path / "s"),
    )
    assert r.returncode == 1, r.stderr
    (line,) = r.stderr.strip().splitlines()
    doc = json.loads(line)
    assert doc["level"] == "critical" and "kubeconfig" in doc["msg"] and "nope" in doc["msg"]
    assert doc["exit_code"] == 1
    # a bad flag after the format is known is a JSON line too (exit 2)
    r = cli("run", "--log-format", "json", "--listen", "0.0.0.0:99999")
    assert r.returncode == 2 and json.loads(r.stderr)["msg"].startswith("--listen 0.0.0.0:99999")


def _bounded_memory() -> None:
    """The child's address space capped at 2 GiB: an unbounded read of /dev/zero fails
    there with MemoryError instead of taking the machine's memory."""
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


@pytest.mark.parametrize("named", ["kubeconfig", "tokenFile"])
@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_a_kubeconfig_file_that_is_a_fifo_or_dev_zero_is_one_line(tmp_path, named, kind):
    """Start-up reads every file a kubeconfig names bounded: a FIFO does not hang it (a
    plain open waits for a writer), /dev/zero does not exhaust the memory."""
    import os

    bad = tmp_path / "bad"
    if kind == "fifo":
        os.mkfifo(bad)
    else:
        bad = Path("/dev/zero")
    config = bad
    if named == "tokenFile":
        config = tmp_path / "kubeconfig"
        config.write_text(
            "apiVersion: v1\nkind: Config\n"
            "clusters: [{name: c, cluster: {server: 'https://192.0.2.1:6443'}}]\n"
            f"users: [{{name: u, user: {{tokenFile: '{bad}'}}}}]\n"
            "contexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n"
        )
    args = ["run", "--kubeconfig", str(config), "--state-dir", str(tmp_path / "s")]
    r = subprocess.run(
        [sys.executable, "-m", "ipvsctl", *args],
        capture_output=True,
        text=True,
        timeout=30,
        preexec_fn=_bounded_memory,
    )
    line = one_line(r)
    assert "not a regular file" in line and str(bad) in line

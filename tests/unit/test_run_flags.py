"""`ipvsctl run` flags of CONTRACT.md: --log-level, durations in every SECONDS flag."""

from __future__ import annotations

import logging

import pytest
from typer.testing import CliRunner

import ipvsctl.daemon.adapters
import ipvsctl.daemon.options
import ipvsctl.daemon.wiring
import ipvsctl.kernel.netlink.addresses
import ipvsctl.obs.logging
from ipvsctl.cli.app import app
from ipvsctl.daemon.options import SourceOptions
from ipvsctl.source.duration import MAX_SECONDS, parse_duration


def invoke(monkeypatch, tmp_path, *args: str):
    """Run `ipvsctl run` up to the daemon; the daemon is replaced by a recorder."""
    seen = []
    levels = []
    monkeypatch.setattr(
        ipvsctl.kernel.netlink.addresses,
        "node_addresses",
        lambda exclude_interfaces=(): ["192.0.2.10"],
    )
    monkeypatch.setattr(ipvsctl.daemon.wiring, "run", lambda opts: seen.append(opts) or 0)
    monkeypatch.setattr(
        ipvsctl.obs.logging, "setup", lambda fmt="text", level=logging.INFO: levels.append(level)
    )
    r = CliRunner().invoke(
        app, ["run", "--manifests", str(tmp_path), "--state-dir", str(tmp_path / "state"), *args]
    )
    return r, (seen[0] if seen else None), (levels[0] if levels else None)


@pytest.mark.parametrize(
    ("flag", "level"),
    [
        (None, logging.INFO),
        ("debug", logging.DEBUG),
        ("info", logging.INFO),
        ("warning", logging.WARNING),
        ("error", logging.ERROR),
        ("WARNING", logging.WARNING),
    ],
)
def test_log_level(monkeypatch, tmp_path, flag, level):
    r, _, got = invoke(monkeypatch, tmp_path, *(["--log-level", flag] if flag else []))
    assert r.exit_code == 0, r.output
    assert got == level


@pytest.mark.parametrize("bad", ["verbose", "", "warn ing", "10"])
def test_bad_log_level_is_exit_2_with_one_line(monkeypatch, tmp_path, bad):
    r, opts, _ = invoke(monkeypatch, tmp_path, "--log-level", bad)
    assert r.exit_code == 2 and opts is None
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and "--log-level" in lines[0], r.output


def test_setup_applies_the_level():
    root = logging.getLogger()
    before = (list(root.handlers), root.level)
    try:
        ipvsctl.obs.logging.setup("text", "warning")
        assert root.level == logging.WARNING
        ipvsctl.obs.logging.setup("json", logging.DEBUG)
        assert root.level == logging.DEBUG
    finally:
        root.handlers[:], _ = before[0], root.setLevel(before[1])


# --- durations -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30", 30.0),
        ("2.5", 2.5),
        ("0", 0.0),
        (".5", 0.5),
        (" 7 ", 7.0),
        ("30s", 30.0),
        ("5m", 300.0),
        ("1m30s", 90.0),
        ("1h", 3600.0),
        ("500ms", 0.5),
        ("1.5m", 90.0),
        ("1h2m3s", 3723.0),
        ("250us", 0.00025),
        ("0s", 0.0),
        (45, 45.0),
        (2.5, 2.5),
    ],
)
def test_durations_accepted(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "text",
    [
        "",
        " ",
        "s",
        "-1",
        "-5s",
        "+5s",
        "nan",
        "NaN",
        "inf",
        "-inf",
        "1e3",
        "1d",
        "1w",
        "1y",
        "5 m",
        "1m30",
        "30sec",
        "1h-5m",
        "0x10",
        "\uff11\uff10",
        "9" * 400,
        "9" * 400 + "h",
        "1e400",
        f"{MAX_SECONDS + 1:g}",
        "169h",
        True,
        None,
        float("nan"),
        float("inf"),
        -3,
    ],
)
def test_durations_rejected(text):
    with pytest.raises(ValueError):
        parse_duration(text)


@pytest.mark.parametrize(
    ("args", "field", "value"),
    [
        (["--drain-timeout", "5m"], "drain.timeout", 300.0),
        (["--drain-timeout", "2.5"], "drain.timeout", 2.5),
        (["--drain-check-interval", "500ms"], "drain.check_interval", 0.5),
        (["--ipvs-tcp-timeout", "15m"], "kernel.tcp_timeout", 900),
        (["--ipvs-tcpfin-timeout", "1m30s"], "kernel.tcpfin_timeout", 90),
        (["--ipvs-udp-timeout", "300"], "kernel.udp_timeout", 300),
        (
            ["--ipvs-udp-timeout", "500ms"],
            "kernel.udp_timeout",
            1,
        ),  # whole seconds, never "kernel's"
        ([], "drain.timeout", 30.0),
        ([], "drain.check_interval", 1.0),
        ([], "kernel.tcp_timeout", 0),
    ],
)
def test_run_seconds_flags_take_durations(monkeypatch, tmp_path, args, field, value):
    r, opts, _ = invoke(monkeypatch, tmp_path, *args)
    assert r.exit_code == 0, r.output
    group, name = field.split(".")
    assert getattr(getattr(opts, group), name) == value


@pytest.mark.parametrize(
    "args",
    [
        ["--drain-timeout", "5 minutes"],
        ["--drain-timeout", "-1"],
        ["--drain-timeout", "nan"],
        ["--drain-timeout", "inf"],
        ["--drain-timeout", "99999999h"],
        ["--drain-check-interval", "0"],
        ["--drain-check-interval", "10ms"],
        ["--ipvs-tcp-timeout", "1d"],
        ["--ipvs-udp-timeout", "-5s"],
    ],
)
def test_bad_seconds_flag_is_exit_2_with_one_line(monkeypatch, tmp_path, args):
    r, opts, _ = invoke(monkeypatch, tmp_path, *args)
    assert r.exit_code == 2 and opts is None, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and args[0] in lines[0], r.output


def test_help_names_seconds_flags_sensibly():
    r = CliRunner().invoke(app, ["run", "--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0
    for flag in ("--drain-timeout", "--drain-check-interval", "--ipvs-tcp-timeout", "--log-level"):
        assert flag in r.output
    assert "DURATION" in r.output and "30s" in r.output


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--timeout", "1m"),
        ("--check-interval", "250ms"),
        ("--check-delay", "1.5"),
    ],
)
def test_shutdown_manager_flags_take_durations_and_reject_garbage(flag, value):
    from ipvsctl.cli import shutdown_manager as sm

    assert sm.parse_duration(value) > 0
    r = CliRunner().invoke(app, ["shutdown-manager", "--pod-ip", "10.0.0.1", flag, "soon"])
    assert r.exit_code == 2
    assert flag in r.output.strip().splitlines()[-1]


@pytest.mark.parametrize(("proxy_name", "guarded"), [(None, True), ("other-proxy", False)])
def test_empty_list_guard_only_where_default_kubernetes_is_listed(proxy_name, guarded) -> None:
    # default/kubernetes carries no proxy-name label: with --service-proxy-name the selector
    # never lists it, and requiring it would refuse every Service list forever.
    from ipvsctl.kube.client import SENTINEL_SERVICE
    from ipvsctl.model import NodeContext
    from ipvsctl.obs.metrics import Metrics

    options = ipvsctl.daemon.options.DaemonOptions(
        node=NodeContext("node-a", service_proxy_name=proxy_name),
        source=SourceOptions(apiserver="http://127.0.0.1:9"),
    )
    source = ipvsctl.daemon.adapters.open_source(options, Metrics())
    assert source._sentinel == (SENTINEL_SERVICE if guarded else None)


def test_the_api_source_prepares_its_lists_as_the_engines_store_parses() -> None:
    # A Replace of prepared objects is applied only by a store of the same configuration.
    from ipvsctl.model import NodeContext
    from ipvsctl.obs.metrics import Metrics
    from ipvsctl.reconcile.intake import Intake

    node = NodeContext("node-a", default_scheduler="wrr", service_proxy_name="mine")
    options = ipvsctl.daemon.options.DaemonOptions(
        node=node, source=SourceOptions(apiserver="http://127.0.0.1:9")
    )
    source = ipvsctl.daemon.adapters.open_source(options, Metrics())
    assert source._prepare == Intake(node, Metrics()).store.preparer
    assert source._prepare.default_scheduler == "wrr"


def test_draining_taints_and_lb_grace(monkeypatch, tmp_path):
    r, opts, _ = invoke(monkeypatch, tmp_path)
    assert r.exit_code == 0, r.output
    assert opts.node_drain.draining_taints == (
        "ToBeDeletedByClusterAutoscaler",
        "karpenter.sh/disrupted",
    )
    assert opts.node_drain.lb_grace == 30.0
    r, opts, _ = invoke(
        monkeypatch,
        tmp_path,
        "--draining-taints",
        " example.com/retire,karpenter.sh/disrupted,example.com/retire",
        "--lb-grace",
        "1m30s",
    )
    assert r.exit_code == 0, r.output
    assert opts.node_drain.draining_taints == ("example.com/retire", "karpenter.sh/disrupted")
    assert opts.node_drain.lb_grace == 90.0
    r, opts, _ = invoke(monkeypatch, tmp_path, "--draining-taints", "")
    assert r.exit_code == 0 and opts.node_drain.draining_taints == ()


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--draining-taints", "bad key"),
        ("--draining-taints", "ok,/nope"),
        ("--lb-grace", "soon"),
        ("--lb-grace", "-5"),
    ],
)
def test_bad_node_drain_flags_are_exit_2_with_one_line(monkeypatch, tmp_path, flag, value):
    r, opts, _ = invoke(monkeypatch, tmp_path, flag, value)
    assert r.exit_code == 2 and opts is None
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and flag in lines[0], r.output

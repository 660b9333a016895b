"""`ipvsctl check-config FILE` (CONTRACT.md): a kube-proxy configuration file read as `run
--config` reads it. Every field it sets is printed with what ipvsctl does with it; exit 0
exactly when `run --config FILE` would start, 2 with run's own line when it would not; a file
of another kind is refused on its kind. And at start the daemon logs what it took."""

from __future__ import annotations

import logging

import pytest
import yaml
from typer.testing import CliRunner

import ipvsctl.daemon.wiring
import ipvsctl.kernel.netlink.addresses
import ipvsctl.obs.logging
from ipvsctl.cli.app import app
from ipvsctl.source.kubeproxy_config import KubeProxyConfigError, judge, translate

from .test_kubeproxy_config import ACCEPTED, BASE, HOSTILE, REFUSED, config_text

KUBELET = """\
apiVersion: kubelet.config.k8s.io/v1beta1
authentication:
  anonymous:
    enabled: false
kind: KubeletConfiguration
cgroupDriver: systemd
"""

# Files `run --config` refuses only once a flag's own check reads the file's value.
REFUSED_BY_A_FLAG = {
    "healthz": yaml.safe_dump({**BASE, "healthzBindAddress": "nope"}),
}


def check(tmp_path, body: str, name: str = "config.conf"):
    path = tmp_path / name
    path.write_text(body)
    return CliRunner().invoke(app, ["check-config", str(path)], env={})


def run_config(monkeypatch, tmp_path, body: str):
    """`ipvsctl run --config FILE` up to the daemon (a recorder), as the node would run it."""
    seen: list = []
    monkeypatch.setattr(ipvsctl.daemon.wiring, "run", lambda opts: seen.append(opts) or 0)
    monkeypatch.setattr(ipvsctl.obs.logging, "setup", lambda fmt="text", level=logging.INFO: None)
    monkeypatch.setattr(
        ipvsctl.kernel.netlink.addresses,
        "node_addresses",
        lambda exclude_interfaces=(): ["192.0.2.10"],
    )
    path = tmp_path / "run.conf"
    path.write_text(body)
    args = ["run", "--config", str(path), "--manifests", str(tmp_path)]
    r = CliRunner().invoke(app, [*args, "--state-dir", str(tmp_path / "s")], env={})
    return r, bool(seen)


def stderr_lines(r) -> list[str]:
    return [line for line in r.stderr.splitlines() if line.startswith("ipvsctl: ")]


def test_a_kubelet_configuration_is_refused_on_its_kind(tmp_path):
    with pytest.raises(KubeProxyConfigError) as err:
        translate(yaml.safe_load(KUBELET))
    assert err.value.path == "kind"
    r = check(tmp_path, KUBELET)
    assert r.exit_code == 2
    [line] = stderr_lines(r)
    assert ": kind: 'KubeletConfiguration': not kube-proxy's file" in line, line
    assert "authentication" not in r.output  # not judged field by field


@pytest.mark.parametrize("key", ["apiVersion", "kind"])
def test_another_version_or_kind_is_refused_before_any_unknown_field(key):
    doc = {"unknownFirst": 1, **BASE, key: "v9"}
    j = judge(doc)
    assert j.refusal is not None and j.refusal.path == key
    assert [v.path for v in j.verdicts if v.refused] == [key]


CASES = {
    **{f"corpus:{n}": config_text(n) for n in sorted(ACCEPTED) + sorted(REFUSED)},
    **{f"hostile:{n}": body for n, body in HOSTILE.items()},
    **{f"flag:{n}": body for n, body in REFUSED_BY_A_FLAG.items()},
    "kubelet": KUBELET,
    "good": yaml.safe_dump({**BASE, "clusterCIDR": "10.0.0.0/8", "mode": "ipvs"}),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_check_config_answers_as_run_would(monkeypatch, tmp_path, name):
    """The exit code is 0 exactly when `run --config` starts the daemon, and a refusal is
    run's own one line."""
    body = CASES[name]
    ran, started = run_config(monkeypatch, tmp_path, body)
    checked = check(tmp_path, body, name="run.conf")  # the same path: the same line
    assert checked.exit_code == (0 if started else 2), checked.output
    assert ran.exit_code == checked.exit_code
    if not started:
        assert stderr_lines(checked) == stderr_lines(ran), (checked.stderr, ran.stderr)
        assert len(stderr_lines(checked)) == 1


def test_every_field_set_is_printed_with_what_ipvsctl_does(tmp_path):
    doc = {
        **BASE,
        "clusterCIDR": "10.244.0.0/16",
        "conntrack": {"maxPerCore": 32768, "min": None},
        "mode": "ipvs",
        "ipvs": {"scheduler": "lc", "strictARP": True, "tcpTimeout": "0s"},
        "oomScoreAdj": -999,
        "logging": {"verbosity": 2},
    }
    r = check(tmp_path, yaml.safe_dump(doc))
    assert r.exit_code == 0, r.output
    rows = {line.split()[0]: line for line in r.stdout.splitlines() if line and line[0] != " "}
    assert rows["clusterCIDR"].endswith("sets --cluster-cidr")
    assert rows["ipvs.scheduler"].endswith("sets --scheduler")
    assert "sets: arp_ignore=1" in rows["ipvs.strictARP"]
    assert "not used: set net.netfilter.nf_conntrack_max" in rows["conntrack.maxPerCore"]
    assert "not used: the kubelet sets it" in rows["oomScoreAdj"]
    assert "checked: ipvsctl is IPVS only" in rows["mode"]
    assert rows["logging.verbosity"].endswith("nothing at this value")
    # left empty: not listed, counted
    assert "conntrack.min" not in rows and "ipvs.tcpTimeout" not in rows
    assert "(2 more fields left empty" in r.stdout
    settings = {line.split()[0]: line for line in r.stdout.splitlines() if line.startswith("  ")}
    assert settings["--cluster-cidr"].split()[1:] == ["10.244.0.0/16", "the", "file"]
    assert settings["--scheduler"].split()[1:] == ["lc", "the", "file"]
    assert settings["ipvs.strictARP"].split()[1:] == ["true", "the", "file"]
    assert settings["--masquerade-all"].split()[1:] == ["false", "default"]


def test_every_refused_field_is_marked_and_the_first_is_named(tmp_path):
    doc = {**BASE, "enableProfiling": True, "mode": "iptables", "bogus": 1}
    r = check(tmp_path, yaml.safe_dump(doc, sort_keys=False))
    assert r.exit_code == 2
    refused = [line.split()[0] for line in r.stdout.splitlines() if "refused:" in line]
    assert refused == ["enableProfiling", "mode", "bogus"]
    [line] = stderr_lines(r)
    assert ": enableProfiling: " in line


def test_a_value_a_flag_refuses_is_named_as_the_files_field(monkeypatch, tmp_path):
    body = REFUSED_BY_A_FLAG["healthz"]
    ran, started = run_config(monkeypatch, tmp_path, body)
    assert not started and ran.exit_code == 2
    [line] = stderr_lines(ran)
    assert ": healthzBindAddress: --healthz-bind-address nope" in line, line
    r = check(tmp_path, body)
    row = next(x for x in r.stdout.splitlines() if x.startswith("healthzBindAddress"))
    assert "refused: --healthz-bind-address nope" in row


def test_the_daemon_logs_the_settings_it_took_from_the_file(monkeypatch, tmp_path, caplog):
    body = yaml.safe_dump(
        {
            **BASE,
            "clusterCIDR": "10.244.0.0/16",
            "ipvs": {"scheduler": "lc", "excludeCIDRs": ["10.96.99.0/24"]},
            "hostnameOverride": "from-file",
            "oomScoreAdj": -999,
        }
    )
    monkeypatch.setattr(ipvsctl.daemon.wiring, "run", lambda opts: 0)
    monkeypatch.setattr(ipvsctl.obs.logging, "setup", lambda fmt="text", level=logging.INFO: None)
    path = tmp_path / "c.conf"
    path.write_text(body)
    args = ["run", "--config", str(path), "--manifests", str(tmp_path), "--node-ip", "192.0.2.1"]
    with caplog.at_level(logging.INFO, logger="ipvsctl.config"):
        r = CliRunner().invoke(
            app, [*args, "--scheduler", "wrr", "--state-dir", str(tmp_path / "s")], env={}
        )
    assert r.exit_code == 0, r.output
    read = [rec for rec in caplog.records if rec.getMessage() == "kube-proxy configuration read"]
    assert len(read) == 1
    settings = read[0].fields["settings"].split()
    # the command line's --scheduler won: not taken from the file
    assert settings == [
        "--cluster-cidr=10.244.0.0/16",
        "--node-name=from-file",
        "ipvs.excludeCIDRs=10.96.99.0/24",
    ]
    assert read[0].fields["config"] == str(path)

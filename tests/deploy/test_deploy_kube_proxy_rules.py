"""daemonset/monitoring-kube-proxy: kube-proxy's series recorded from ipvsctl's, so the
kubernetes-mixin's proxy dashboard and kube-proxy alerts keep working (promtool, with the
mixin's alerts as it renders them in tests/data)."""

from __future__ import annotations

import re
import shutil
import subprocess

import yaml

from .helpers import DAEMONSET_DIR, REPO, one, overlay_with, render
from .test_deploy_monitoring import exported_metrics, promtool

COMPAT = DAEMONSET_DIR / "monitoring-kube-proxy"
RULES = COMPAT / "kube-proxy.rules.yaml"
RULE_TESTS = COMPAT / "kube-proxy.rules.test.yaml"
MIXIN_ALERTS = REPO / "tests" / "data" / "kubernetes-mixin-kube-proxy.alerts.yaml"

# What the kubernetes-mixin reads of kube-proxy: dashboards/proxy.libsonnet's queries and
# template, alerts/kube_proxy.libsonnet's two alerts (kubernetes-monitoring/kubernetes-mixin).
MIXIN_SERIES = {
    "up",
    "kubeproxy_sync_proxy_rules_duration_seconds_count",
    "kubeproxy_sync_proxy_rules_duration_seconds_bucket",
    "kubeproxy_network_programming_duration_seconds_count",
    "kubeproxy_network_programming_duration_seconds_bucket",
    "rest_client_requests_total",
    "rest_client_request_duration_seconds_bucket",
    "process_resident_memory_bytes",
    "process_cpu_seconds_total",
    "go_goroutines",
}
# Read by the mixin, with no ipvsctl series to record them from, and why.
NOT_RECORDED = {
    "rest_client_requests_total": "ipvsctl makes one list and one watch per resource; "
    "ipvsctl_watch_restarts_total counts what goes wrong with them",
    "rest_client_request_duration_seconds_bucket": "as rest_client_requests_total",
    "go_goroutines": "ipvsctl is not a Go program",
}
# Recorded once the ipvsctl series they come from exists: {kube-proxy series: (ipvsctl
# series, the open issue that adds it)}. When that series is exported, the test fails until
# the rule is written (and the entry leaves).
PENDING: dict[str, tuple[str, str]] = {}


def rules() -> list[dict]:
    (group,) = yaml.safe_load(RULES.read_text())["groups"]
    return group["rules"]


def run_promtool(*args: str, cwd=COMPAT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def test_promtool_checks_and_tests_the_rules():
    r = run_promtool("check", "rules", str(RULES))
    assert r.returncode == 0, r.stdout + r.stderr
    r = run_promtool("test", "rules", str(RULE_TESTS))
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_tests_fail_without_the_up_record(tmp_path):
    """Without `up{job="kube-proxy"}` the mixin's KubeProxyDown fires while ipvsctl runs."""
    (tmp_path / "c").mkdir()
    shutil.copy(RULE_TESTS, tmp_path / "c")
    doc = yaml.safe_load(RULES.read_text())
    doc["groups"][0]["rules"] = [r for r in doc["groups"][0]["rules"] if r["record"] != "up"]
    (tmp_path / "c" / RULES.name).write_text(yaml.safe_dump(doc))
    data = tmp_path / "tests" / "data"
    data.mkdir(parents=True)
    shutil.copy(MIXIN_ALERTS, data)
    r = run_promtool("test", "rules", RULE_TESTS.name, cwd=tmp_path / "c")
    assert r.returncode != 0 and "KubeProxyDown" in r.stdout + r.stderr


def test_every_series_the_mixin_reads_is_recorded_or_said_why():
    recorded = {r["record"] for r in rules()}
    exported = exported_metrics()
    for series in MIXIN_SERIES:
        if series in NOT_RECORDED:
            assert series not in recorded
        elif series in PENDING:
            source, issue = PENDING[series]
            assert source not in exported or series in recorded, (
                f"{source} is exported now: record {series} and take it off PENDING ({issue})"
            )
            assert series not in recorded, f"{series} is recorded: take it off PENDING"
        else:
            assert series in recorded, series
    # the alerts' series, from the mixin's own rule text
    alert_exprs = " ".join(
        a["expr"] for g in yaml.safe_load(MIXIN_ALERTS.read_text())["groups"] for a in g["rules"]
    )
    assert set(re.findall(r"\b([a-z_]+)\{", alert_exprs)) <= MIXIN_SERIES


def test_every_rule_reads_one_exported_ipvsctl_series_and_says_job_kube_proxy():
    exported = exported_metrics() | {"up"}
    for r in rules():
        (source,) = re.findall(r"^([a-z_]+)\{job=\"ipvsctl\"\}$", r["expr"])
        assert source in exported, source
        assert r["labels"] == {"job": "kube-proxy"}


def test_prometheusrule_carries_the_rule_file_and_the_component_adds_it():
    pr = yaml.safe_load((COMPAT / "prometheusrule.yaml").read_text())
    assert pr["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]
    docs = render(overlay_with("monitoring-kube-proxy"))
    assert one(docs, "PrometheusRule")["metadata"]["name"] == "ipvsctl-kube-proxy-compat"

"""daemonset/monitoring (alert rules, PrometheusRule, Grafana dashboard) and
daemonset/servicemonitor: promtool checks and unit tests, schemas, and that every metric
they query is one ipvsctl exports."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from .helpers import DAEMONSET_DIR, NAMESPACE, REPO, find, one, overlay_with, render

MONITORING = DAEMONSET_DIR / "monitoring"
RULES = MONITORING / "ipvsctl.rules.yaml"
RULE_TESTS = MONITORING / "ipvsctl.rules.test.yaml"
DASHBOARD = MONITORING / "grafana-dashboard.json"
SCHEMAS = Path(__file__).parent / "schemas"


def promtool() -> str:
    exe = shutil.which("promtool") or str(Path(sys.executable).parent / "promtool")
    assert os.access(exe, os.X_OK), "promtool missing: tests/deploy/run.sh fetches it"
    return exe


def run_promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *args], capture_output=True, text=True, timeout=120,
                          cwd=MONITORING)


def exported_metrics() -> set[str]:
    """Every series name a daemon's /metrics can carry (histograms: _bucket, _sum, _count)."""
    from ipvsctl.obs.metrics import Metrics

    names: set[str] = set()
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", Metrics().render().decode(), re.M):
        names.add(name)
        if kind == "histogram":
            names.update(f"{name}{s}" for s in ("_bucket", "_sum", "_count"))
    return names


def metrics_in(expr: str) -> set[str]:
    return set(re.findall(r"\b((?:ipvsctl|process)_[a-z_]+)\b", expr))


def rule_groups() -> list[dict]:
    return yaml.safe_load(RULES.read_text())["groups"]


def alerts() -> list[dict]:
    return [r for g in rule_groups() for r in g["rules"] if "alert" in r]


def test_promtool_checks_the_rules():
    r = run_promtool("check", "rules", str(RULES))
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in r.stdout


def test_promtool_unit_tests_pass_and_cover_every_alert():
    r = run_promtool("test", "rules", str(RULE_TESTS))
    assert r.returncode == 0, r.stdout + r.stderr
    tests = yaml.safe_load(RULE_TESTS.read_text())
    tested = {t["alertname"] for case in tests["tests"] for t in case["alert_rule_test"]}
    assert tested == {a["alert"] for a in alerts()}


def test_promtool_unit_tests_can_fail(tmp_path):
    """A rule changed under the tests makes them fail (they are not vacuous)."""
    broken = RULES.read_text().replace("> 50", "> 40").replace("> 0.1", "> 100")
    (tmp_path / RULES.name).write_text(broken)
    shutil.copy(RULE_TESTS, tmp_path)
    r = subprocess.run([promtool(), "test", "rules", RULE_TESTS.name], capture_output=True,
                       text=True, timeout=120, cwd=tmp_path)
    assert r.returncode != 0
    assert "IpvsctlDrainQueueHigh" in r.stdout + r.stderr
    assert "IpvsctlWatchRestarts" in r.stdout + r.stderr


def test_prometheusrule_carries_the_rule_file():
    cr = yaml.safe_load((MONITORING / "prometheusrule.yaml").read_text())
    assert cr["spec"] == yaml.safe_load(RULES.read_text()), (
        "prometheusrule.yaml's spec must equal ipvsctl.rules.yaml: copy the groups over")


def test_alerts_are_documented_and_use_real_metrics():
    ops = (REPO / "docs/operations.md").read_text()
    section = ops[ops.index("## Dashboard and alerts"):]
    documented = set(re.findall(r"`(Ipvsctl\w+)`", section))
    assert documented == {a["alert"] for a in alerts()}
    exported = exported_metrics()
    for a in alerts():
        used = metrics_in(a["expr"])
        assert used and used <= exported, (a["alert"], sorted(used - exported))
        assert a["labels"]["severity"] in ("info", "warning", "critical")
        assert "{{ $labels.instance }}" in a["annotations"]["summary"]


def test_dashboard_queries_real_metrics_and_covers_the_topics():
    dash = json.loads(DASHBOARD.read_text())
    panels = dash["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    exported = exported_metrics()
    used: set[str] = set()
    for p in panels:
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        for t in p["targets"]:
            names = metrics_in(t["expr"])
            assert names and names <= exported, (p["title"], sorted(names - exported))
            assert 'node=~"$node"' in t["expr"], p["title"]
            used |= names
    for needed in ("ipvsctl_drain_queue_length", "ipvsctl_real_server_deletions_total",
                   "ipvsctl_event_to_kernel_seconds_bucket", "ipvsctl_watch_restarts_total",
                   "ipvsctl_netlink_errors_total", "ipvsctl_nft_errors_total",
                   "process_resident_memory_bytes", "ipvsctl_build_info"):
        assert needed in used, needed
    names = [v["name"] for v in dash["templating"]["list"]]
    assert names == ["datasource", "node"]


def test_exported_metrics_include_build_info_and_process_and_no_created():
    names = exported_metrics()
    assert {"ipvsctl_build_info", "process_resident_memory_bytes",
            "process_cpu_seconds_total"} <= names
    assert not [n for n in names if n.endswith("_created")]


def schema_validate(doc: dict, schema_file: str) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = yaml.safe_load((SCHEMAS / schema_file).read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.Draft202012Validator(schema).validate(doc)


def test_monitoring_component_adds_the_prometheusrule():
    import jsonschema

    base = render(DAEMONSET_DIR)
    docs = render(overlay_with("monitoring"))
    assert len(docs) == len(base) + 1
    pr = one(docs, "PrometheusRule")
    assert pr["metadata"]["namespace"] == NAMESPACE
    schema_validate(pr, "prometheusrule-v1.schema.yaml")
    bad = copy.deepcopy(pr)
    bad["spec"]["groups"][0]["rules"][0]["for"] = "10 minutes"
    with pytest.raises(jsonschema.ValidationError):
        schema_validate(bad, "prometheusrule-v1.schema.yaml")


def test_servicemonitor_scrapes_the_metrics_service():
    import jsonschema

    base = render(DAEMONSET_DIR)
    docs = render(overlay_with("servicemonitor"))
    assert len(docs) == len(base) + 1 and find(docs, "PodMonitor") == []
    sm = one(docs, "ServiceMonitor")
    schema_validate(sm, "servicemonitor-v1.schema.yaml")
    bad = copy.deepcopy(sm)
    bad["spec"]["endpoints"][0]["intervall"] = "30s"
    with pytest.raises(jsonschema.ValidationError):
        schema_validate(bad, "servicemonitor-v1.schema.yaml")
    svc = one(docs, "Service", "ipvsctl-metrics")
    for key, value in sm["spec"]["selector"]["matchLabels"].items():
        assert svc["metadata"]["labels"].get(key) == value
    assert sm["spec"]["namespaceSelector"]["matchNames"] == [svc["metadata"]["namespace"]]
    assert [e["port"] for e in sm["spec"]["endpoints"]] == [p["name"] for p in
                                                            svc["spec"]["ports"]]
    # the same node label as the PodMonitor's, which the dashboard and alerts expect
    pm = yaml.safe_load((DAEMONSET_DIR / "podmonitor" / "podmonitor.yaml").read_text())
    assert (sm["spec"]["endpoints"][0]["relabelings"]
            == pm["spec"]["podMetricsEndpoints"][0]["relabelings"])

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

from ipvsctl.daemon.options import DrainOptions, HTTPOptions, SourceOptions

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
    return subprocess.run(
        [promtool(), *args], capture_output=True, text=True, timeout=120, cwd=MONITORING
    )


def exported_metrics() -> set[str]:
    """Every series name a daemon's /metrics can carry (histograms: _bucket, _sum, _count)."""
    from ipvsctl.obs.metrics import Metrics, ServiceTrafficCollector

    metrics = Metrics()
    metrics.registry.register(ServiceTrafficCollector())  # the service-metrics feature's
    names: set[str] = set()
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", metrics.render().decode(), re.M):
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
    """Every alert is tested firing and staying silent (a near miss, or a healthy node)."""
    r = run_promtool("test", "rules", str(RULE_TESTS))
    assert r.returncode == 0, r.stdout + r.stderr
    tests = yaml.safe_load(RULE_TESTS.read_text())
    evals = [t for case in tests["tests"] for t in case["alert_rule_test"]]
    fired = {t["alertname"] for t in evals if t["exp_alerts"]}
    silent = {t["alertname"] for t in evals if not t["exp_alerts"]}
    names = {a["alert"] for a in alerts()}
    assert fired == names, f"never seen firing: {sorted(names - fired)}"
    assert silent == names, f"never seen silent: {sorted(names - silent)}"


# what to change in the rule file, and an alert whose tests must then fail
MUTATIONS = {
    "queue-threshold": ("> 50", "> 40", "IpvsctlDrainQueueHigh"),
    "watch-threshold": ("> 0.1", "> 100", "IpvsctlWatchRestarts"),
    # absent(up) alone misses targets that are there but down
    "absent-without-up": (
        'absent(up{job="ipvsctl"} == 1)',
        'absent(up{job="ipvsctl"})',
        "IpvsctlDown",
    ),
    "target-never-down": (
        '(up{job="ipvsctl"}) == 0',
        '(up{job="ipvsctl"}) < 0',
        "IpvsctlTargetDown",
    ),
    "never-ready": (
        "(ipvsctl_ready) == 0",
        "(ipvsctl_ready) < 0",
        "IpvsctlNotReady",
    ),
    "conflict-threshold": (
        "(ipvsctl_virtual_server_conflict_losers) > 0",
        "(ipvsctl_virtual_server_conflict_losers) > 5",
        "IpvsctlVirtualServerConflict",
    ),
    "source-not-its-own": (
        '(ipvsctl_degraded{condition="source"}) > 0',
        '(ipvsctl_degraded{condition="nftables"}) > 0',
        "IpvsctlSourceFailing",
    ),
    "source-twice": (
        '(ipvsctl_degraded{condition!="source"}) > 0',
        "(ipvsctl_degraded) > 0",
        "IpvsctlDegraded",
    ),
    "node-draining-threshold": (
        "(ipvsctl_node_draining_seconds) > 1800",
        "(ipvsctl_node_draining_seconds) > 3600",
        "IpvsctlNodeDrainingLong",
    ),
    "table-threshold": (
        "ipvsctl_table_entries_limit) > 0.8",
        "ipvsctl_table_entries_limit) > 0.9",
        "IpvsctlTableNearlyFull",
    ),
    "table-full-threshold": (
        "(ipvsctl_table_refused_services) > 0",
        "(ipvsctl_table_refused_services) > 10",
        "IpvsctlTableFull",
    ),
    # an aggregation that drops `node`: the alert loses the label the tests expect
    "node-dropped": (
        "max by (instance, node) (ipvsctl_virtual_server_conflict_losers)",
        "max by (instance) (ipvsctl_virtual_server_conflict_losers)",
        "IpvsctlVirtualServerConflict",
    ),
}


@pytest.mark.parametrize(("old", "new", "alert"), MUTATIONS.values(), ids=MUTATIONS.keys())
def test_promtool_unit_tests_can_fail(tmp_path, old, new, alert):
    """A rule changed under the tests makes them fail (they are not vacuous)."""
    text = RULES.read_text()
    assert old in text
    (tmp_path / RULES.name).write_text(text.replace(old, new))
    shutil.copy(RULE_TESTS, tmp_path)
    r = subprocess.run(
        [promtool(), "test", "rules", RULE_TESTS.name],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert r.returncode != 0
    assert f"alertname: {alert}," in r.stdout + r.stderr


def test_prometheusrule_carries_the_rule_file():
    cr = yaml.safe_load((MONITORING / "prometheusrule.yaml").read_text())
    assert cr["spec"] == yaml.safe_load(RULES.read_text()), (
        "prometheusrule.yaml's spec must equal ipvsctl.rules.yaml: copy the groups over"
    )


def operations_section() -> str:
    ops = (REPO / "docs/operations.md").read_text()
    start = ops.index("## Dashboard and alerts")
    end = ops.find("\n## ", start + 1)
    return ops[start : end if end > 0 else None]


def test_alerts_are_documented_and_use_real_metrics():
    documented = set(re.findall(r"`(Ipvsctl\w+)`", operations_section()))
    assert documented == {a["alert"] for a in alerts()}
    exported = exported_metrics() | {"up"}  # `up`: Prometheus's own, per scrape target
    for a in alerts():
        used = metrics_in(a["expr"]) | set(re.findall(r"\b(up)\{", a["expr"]))
        assert used and used <= exported, (a["alert"], sorted(used - exported))
        assert a["labels"]["severity"] in ("info", "warning", "critical")
        assert a["annotations"]["summary"] and a["annotations"]["description"], a["alert"]


def github_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a Markdown file's headings (code blocks aside)."""
    text = re.sub(r"```.*?```", "", markdown, flags=re.S)
    anchors: set[str] = set()
    for title in re.findall(r"^#{1,6} (.+?)\s*$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
        n, unique = 0, slug
        while unique in anchors:
            n += 1
            unique = f"{slug}-{n}"
        anchors.add(unique)
    return anchors


def test_every_runbook_url_is_a_section_of_operations_md():
    """runbook_url: docs/operations.md#<anchor>, a heading there that is the alert's own."""
    ops = (REPO / "docs/operations.md").read_text()
    anchors = github_anchors(ops)
    for a in alerts():
        url = a["annotations"].get("runbook_url", "")
        path, _, anchor = url.partition("#")
        assert path == "docs/operations.md", (a["alert"], url)
        assert anchor in anchors, f"{a['alert']}: no heading for #{anchor} in operations.md"
        assert anchor == a["alert"].lower(), (a["alert"], anchor)
        body = re.search(rf"^### {a['alert']}\n(.*?)(?=^##)", ops, re.S | re.M)
        assert body and len(body.group(1).split()) >= 30, f"{a['alert']}: runbook too short"


def test_the_anchor_check_knows_github_slugs():
    assert github_anchors(
        "# Dashboard and alerts\n## `ipvsctl cleanup`\n### IpvsctlDown\n"
        "```\n# not a heading\n```\n### IpvsctlDown\n"
    ) == {"dashboard-and-alerts", "ipvsctl-cleanup", "ipvsctldown", "ipvsctldown-1"}


# A PromQL aggregation operator (not the *_over_time functions) and its grouping clause.
AGGREGATION = re.compile(
    r"\b(?:sum|min|max|avg|group|stddev|stdvar|count|count_values|bottomk|topk|quantile)"
    r"\b(?!_)\s*(by|without)?\s*(\([^()]*\))?"
)
MATCHING = re.compile(r"\b(on|ignoring)\s*\(([^()]*)\)")
KEPT = {"instance", "node"}


def drops_node(expr: str) -> list[str]:
    """The aggregations and vector matchings in `expr` that lose `instance` or `node`: `by`
    and `on` must name both, `without` and `ignoring` neither."""
    bad = []
    for m in AGGREGATION.finditer(expr):
        names = set(re.findall(r"\w+", m[2] or ""))
        if not ((m[1] == "by" and names >= KEPT) or (m[1] == "without" and not KEPT & names)):
            bad.append(m[0])
    for m in MATCHING.finditer(expr):
        names = set(re.findall(r"\w+", m[2]))
        if not ((m[1] == "on" and names >= KEPT) or (m[1] == "ignoring" and not KEPT & names)):
            bad.append(m[0])
    return bad


def test_every_aggregation_keeps_instance_and_node():
    """The monitors add `node`: an aggregation that drops it loses the node an alert is
    about."""
    for a in alerts():
        assert not drops_node(a["expr"]), (a["alert"], drops_node(a["expr"]))
    aggregating = [a for a in alerts() if AGGREGATION.search(a["expr"])]
    assert len(aggregating) >= len(alerts()) - 1  # all but IpvsctlDown


def test_the_aggregation_check_catches_a_dropped_node():
    for expr, ok in (
        ("sum by (instance, node) (rate(x[5m]))", True),
        ("sum by (instance) (rate(x[5m]))", False),
        ("max(x)", False),
        ("min_over_time(x[5m]) > 1", True),
        ("sum without (pod) (x)", True),
        ("sum without (node) (x)", False),
        ("a and on (instance, node) b", True),
        ("a and on (instance) b", False),
    ):
        assert (not drops_node(expr)) == ok, expr


def monitor_jobs() -> dict[str, str]:
    """The `job` each shipped monitor gives its targets, as the Prometheus operator names
    it: its jobLabel's value on the pod (PodMonitor) or the Service (ServiceMonitor), else
    `namespace/name` (PodMonitor) or the Service's name (ServiceMonitor)."""
    jobs = {}
    pm = one(render(overlay_with("podmonitor")), "PodMonitor")
    pod_labels = one(render(DAEMONSET_DIR), "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    label = pm["spec"].get("jobLabel")
    jobs["PodMonitor"] = (
        pod_labels[label]
        if label in pod_labels
        else f"{pm['metadata']['namespace']}/{pm['metadata']['name']}"
    )
    docs = render(overlay_with("servicemonitor"))
    sm = one(docs, "ServiceMonitor")
    svc = one(docs, "Service", "ipvsctl-metrics")
    label = sm["spec"].get("jobLabel")
    svc_labels = svc["metadata"]["labels"]
    jobs["ServiceMonitor"] = svc_labels[label] if label in svc_labels else svc["metadata"]["name"]
    return jobs


def test_rules_ask_for_the_job_both_monitors_give():
    asked = {j for a in alerts() for j in re.findall(r'\bjob="([^"]+)"', a["expr"])}
    assert asked == {"ipvsctl"}
    assert monitor_jobs() == {"PodMonitor": "ipvsctl", "ServiceMonitor": "ipvsctl"}


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
    for needed in (
        "ipvsctl_drain_queue_length",
        "ipvsctl_real_server_deletions_total",
        "ipvsctl_event_to_kernel_seconds_bucket",
        "ipvsctl_watch_restarts_total",
        "ipvsctl_netlink_errors_total",
        "ipvsctl_nft_errors_total",
        "process_resident_memory_bytes",
        "ipvsctl_build_info",
        "ipvsctl_service_connections_total",
        "ipvsctl_service_bytes_total",
        "ipvsctl_service_metrics_dropped",
        "ipvsctl_node_draining_seconds",
        "ipvsctl_node_established_connections",
        "ipvsctl_ready",
        "ipvsctl_degraded",
        "ipvsctl_foreign_virtual_servers_total",
    ):
        assert needed in used, needed
    names = [v["name"] for v in dash["templating"]["list"]]
    assert names == ["datasource", "node"]


def test_exported_metrics_include_build_info_and_process_and_no_created():
    names = exported_metrics()
    assert {
        "ipvsctl_build_info",
        "process_resident_memory_bytes",
        "process_cpu_seconds_total",
    } <= names
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
    # its own namespace, the Service's (no namespaceSelector: test_deploy_namespaces.py)
    assert "namespaceSelector" not in sm["spec"]
    assert sm["metadata"]["namespace"] == svc["metadata"]["namespace"]
    assert [e["port"] for e in sm["spec"]["endpoints"]] == [p["name"] for p in svc["spec"]["ports"]]
    # the same node label as the PodMonitor's, which the dashboard and alerts expect
    pm = yaml.safe_load((DAEMONSET_DIR / "podmonitor" / "podmonitor.yaml").read_text())
    assert (
        sm["spec"]["endpoints"][0]["relabelings"]
        == pm["spec"]["podMetricsEndpoints"][0]["relabelings"]
    )


def test_a_real_scrape_with_per_service_series_passes_promtool_check_metrics(tmp_path):
    """The daemon's /metrics as Prometheus would scrape it, per-Service traffic series
    included (an annotated Service with traffic), linted by `promtool check metrics`."""
    import urllib.request

    import yaml as _yaml

    from devkit.builders import endpoint, endpoint_slice, service
    from devkit.harness import vs
    from ipvsctl.daemon.options import DaemonOptions
    from ipvsctl.daemon.wiring import Daemon
    from ipvsctl.kernel.fake import FakeKernel
    from ipvsctl.manifests import ManifestSource
    from ipvsctl.model import NodeContext, ServiceStats
    from ipvsctl.reconcile.loop import LoopConfig
    from ipvsctl.reconcile.service_traffic import ServiceTraffic

    folder = tmp_path / "m"
    folder.mkdir()
    objs = [
        service("web", annotations={"ipvsctl.io/metrics": "true"}),
        endpoint_slice("web", [endpoint("10.244.1.5", pod="web-1")]),
    ]
    (folder / "web.yaml").write_text(_yaml.safe_dump_all(objs))
    kernel = FakeKernel()
    d = Daemon(
        DaemonOptions(
            node=NodeContext("node-a", ("192.0.2.10",)),
            source=SourceOptions(manifests=str(folder)),
            drain=DrainOptions(state_dir=str(tmp_path / "state")),
            http=HTTPOptions(listen="127.0.0.1:0"),
        ),
        kernel,
        ManifestSource(folder, interval=0.05),
        loop_config=LoopConfig(idle_wakeup=0.05),
    )
    d.start()
    try:
        for _ in range(200):
            if (
                vs() in kernel.services
                and d.view.started
                and (t := d.part(ServiceTraffic)) is not None
                and t.read()[0]
            ):
                break
            __import__("time").sleep(0.05)
        kernel.add_traffic(vs(), ServiceStats(2, 10, 8, 900, 4000))
        with urllib.request.urlopen(f"http://127.0.0.1:{d.http.port}/metrics", timeout=10) as r:
            text = r.read().decode()
    finally:
        d.shutdown()
    assert 'ipvsctl_service_bytes_total{direction="out",namespace="default"' in text
    r = subprocess.run(
        [promtool(), "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stdout + r.stderr

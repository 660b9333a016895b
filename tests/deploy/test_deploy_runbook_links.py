"""The alerts' runbook links are set in one place: daemonset/monitoring/runbooks.env. The
real kubectl renders the monitoring component with another value there: every alert's
runbook_url is that value and its own anchor, and the ConfigMap that carries it stays out
of what is applied. The plain rule file takes the sed docs/operations.md gives."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import yaml

from .helpers import DAEMONSET_DIR, REPO, one, render
from .test_deploy_monitoring import RULES, alerts

PUBLISHED = "https://git.example.com/org/ipvsctl/blob/v9.9.9/docs/operations.md"


def test_every_runbook_url_comes_from_runbooks_env(tmp_path: Path):
    copy = tmp_path / "daemonset"
    shutil.copytree(DAEMONSET_DIR, copy)
    env = copy / "monitoring" / "runbooks.env"
    env.write_text(env.read_text().replace("RUNBOOKS=docs/operations.md", f"RUNBOOKS={PUBLISHED}"))
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump({"resources": ["../daemonset"], "components": ["../daemonset/monitoring"]})
    )
    docs = render(overlay)
    rules = [r for g in one(docs, "PrometheusRule")["spec"]["groups"] for r in g["rules"]]
    assert len(rules) == len(alerts()) >= 10
    for r in rules:
        assert r["annotations"]["runbook_url"] == f"{PUBLISHED}#{r['alert'].lower()}"
    assert not [d for d in docs if d["metadata"]["name"] == "ipvsctl-runbooks"]


def test_the_plain_rule_file_takes_the_sed_operations_md_gives():
    text = (REPO / "docs" / "operations.md").read_text()
    (sed,) = re.findall(r"^sed '([^']+)' \\\n  daemonset/monitoring/ipvsctl.rules.yaml", text, re.M)
    out = subprocess.run(["sed", sed, str(RULES)], capture_output=True, text=True, check=True)
    rules = [r for g in yaml.safe_load(out.stdout)["groups"] for r in g["rules"]]
    assert len(rules) == len(alerts())
    for r in rules:
        assert r["annotations"]["runbook_url"].startswith("https://") and r["annotations"][
            "runbook_url"
        ].endswith("/docs/operations.md#" + r["alert"].lower())

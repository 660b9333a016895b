"""The rendered manifests are valid Kubernetes objects (OpenAPI schemas, offline)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from .helpers import DAEMONSET_DIR, VAGRANT_DIR, one, overlay_with, render

kv = pytest.importorskip("kubernetes_validate", reason="tests/deploy/run.sh installs it")
jsonschema = pytest.importorskip("jsonschema")

# The oldest Kubernetes minor the manifests claim, and the newest schema the package ships.
VERSIONS = ["1.30", kv.latest_version()]
PODMONITOR_SCHEMA = Path(__file__).parent / "schemas" / "podmonitor-v1.schema.yaml"


def all_targets():
    return [DAEMONSET_DIR, overlay_with("podmonitor"), VAGRANT_DIR / "overlay"]


def builtin_docs():
    for target in all_targets():
        for d in render(target):
            if not d["apiVersion"].startswith("monitoring.coreos.com/"):
                yield target, d


@pytest.mark.parametrize("version", VERSIONS)
def test_builtin_objects_match_the_kubernetes_schema(version):
    checked = 0
    for target, d in builtin_docs():
        try:
            kv.validate(d, version, strict=True)
        except kv.ValidationError as e:
            pytest.fail(f"{target}: {d['kind']}/{d['metadata']['name']}: {e}")
        checked += 1
    assert checked >= 7


def test_strict_validation_catches_a_misspelt_field():
    """Guards against a validator that accepts anything."""
    ds = copy.deepcopy(one(render(DAEMONSET_DIR), "DaemonSet"))
    ds["spec"]["template"]["spec"]["hostNetWork"] = True
    with pytest.raises(kv.ValidationError):
        kv.validate(ds, VERSIONS[-1], strict=True)


def test_podmonitor_matches_the_operator_schema():
    schema = yaml.safe_load(PODMONITOR_SCHEMA.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    pm = one(render(overlay_with("podmonitor")), "PodMonitor")
    jsonschema.Draft202012Validator(schema).validate(pm)
    bad = copy.deepcopy(pm)
    bad["spec"]["podMetricsEndpoints"][0]["interval"] = "30 seconds"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(schema).validate(bad)


def test_podmonitor_scrapes_the_daemonset_port():
    docs = render(overlay_with("podmonitor"))
    pm = one(docs, "PodMonitor")
    pod = one(docs, "DaemonSet")["spec"]["template"]
    for key, value in pm["spec"]["selector"]["matchLabels"].items():
        assert pod["metadata"]["labels"].get(key) == value
    port_names = {p["name"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
    assert [e["port"] for e in pm["spec"]["podMetricsEndpoints"]] == ["metrics"]
    assert "metrics" in port_names
    assert pm["spec"]["podMetricsEndpoints"][0]["path"] == "/metrics"


@pytest.mark.parametrize("manifest", ["kube-router.yaml", "rollout-app.yaml"])
def test_lab_manifests_match_the_kubernetes_schema(manifest):
    text = (VAGRANT_DIR / "manifests" / manifest).read_text()
    # The placeholders control-plane.sh fills in.
    text = text.replace("__KUBE_ROUTER_VERSION__", "v2.11.1").replace(
        "__APISERVER_HOST__", "192.168.56.10"
    )
    docs = [d for d in yaml.safe_load_all(text) if d]
    assert docs
    for d in docs:
        kv.validate(d, VERSIONS[-1], strict=True)


def test_lab_kube_router_leaves_ipvs_alone():
    text = (VAGRANT_DIR / "manifests" / "kube-router.yaml").read_text()
    ds = one([d for d in yaml.safe_load_all(text) if d], "DaemonSet")
    args = ds["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--run-service-proxy=false" in args
    assert {"--run-router=true", "--run-firewall=true"} <= set(args)

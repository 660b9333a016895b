"""The kube-proxy takeover with every other part, in whichever namespace ipvsctl runs.

The migration guide's own overlay (its ```yaml block, with `<path>` made real and the
registry replaced by this test's) rendered by the real `kubectl kustomize`: the image it
sets is the one the pods pull, and every object lands in kube-system. The monitoring
components beside the takeover, in both orders, end up in the DaemonSet's namespace and
select its pods; the shutdown-manager's default lookup names the metrics Service of both
namespaces.
"""

from __future__ import annotations

import os
import re
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from .helpers import NAMESPACE, REPO, find, one, overlay_with, render

GUIDE = REPO / "docs" / "migrating-from-kube-proxy.md"
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding"}
MONITORS = ("podmonitor", "servicemonitor")
RULES = ("monitoring", "monitoring-kube-proxy")


def guide_overlay_block() -> dict[str, Any]:
    """The guide's overlay: its one ```yaml block that names the takeover component."""
    blocks = re.findall(r"^( *)```yaml\n(.*?)^\1```", GUIDE.read_text(), re.S | re.M)
    found = [
        yaml.safe_load(textwrap.dedent(body))
        for _, body in blocks
        if "daemonset/kube-proxy-takeover" in body
    ]
    assert len(found) == 1, "the guide's overlay block is gone"
    return found[0]


def write_overlay(block: dict[str, Any], tmp: Path, components: tuple[str, ...] = ()) -> Path:
    """The block as a kustomization in tmp, `<path>` pointing at this repository."""
    d = Path(tempfile.mkdtemp(dir=tmp))
    path = os.path.relpath(REPO, d)
    text = yaml.safe_dump(block).replace("<path>", path)
    k = yaml.safe_load(text)
    k["components"] = [*k.get("components", []), *(f"{path}/daemonset/{c}" for c in components)]
    (d / "kustomization.yaml").write_text(yaml.safe_dump(k))
    return d


def pod_labels(docs: list[dict]) -> dict[str, str]:
    return one(docs, "DaemonSet")["spec"]["template"]["metadata"]["labels"]


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def test_the_image_the_guides_overlay_sets_is_the_one_the_pods_pull(tmp_path):
    """Whatever registry and tag a user writes in the documented overlay lands in every
    container of the rendered DaemonSet (an `images:` entry whose name the base no longer
    has would match nothing, leaving the placeholder)."""
    block = guide_overlay_block()
    [entry] = block["images"]
    entry.update(newName="registry.test.invalid/team/ipvsctl", newTag="9.8.7")
    docs = render(write_overlay(block, tmp_path))
    spec = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    images = {c["image"] for c in spec["initContainers"] + spec["containers"]}
    assert images == {"registry.test.invalid/team/ipvsctl:9.8.7"}


def test_the_guides_overlay_puts_everything_in_kube_system(tmp_path):
    docs = render(write_overlay(guide_overlay_block(), tmp_path))
    assert not find(docs, "Namespace")
    for d in docs:
        if d["kind"] not in CLUSTER_SCOPED:
            assert d["metadata"]["namespace"] == "kube-system", d["kind"]
    ds = one(docs, "DaemonSet")
    assert selects(ds["spec"]["selector"]["matchLabels"], pod_labels(docs))
    svc = one(docs, "Service", "ipvsctl-metrics")
    assert selects(svc["spec"]["selector"], pod_labels(docs))


ORDERS = [
    order
    for m in MONITORS
    for order in (
        ("kube-proxy-takeover", m, *RULES),
        (m, *RULES, "kube-proxy-takeover"),
        (m, *RULES),
    )
]


@pytest.mark.parametrize("components", ORDERS, ids=lambda c: "+".join(c))
def test_monitoring_follows_the_daemonset_in_either_order(components):
    """Each monitoring object in the DaemonSet's namespace, selecting its pods (PodMonitor)
    or its metrics Service (ServiceMonitor) there: in kube-system beside the takeover,
    whichever of them is listed first, and in ipvsctl-system without it."""
    docs = render(overlay_with(*components))
    namespace = one(docs, "DaemonSet")["metadata"]["namespace"]
    assert namespace == ("kube-system" if "kube-proxy-takeover" in components else NAMESPACE)
    for kind in ("PodMonitor", "ServiceMonitor", "PrometheusRule"):
        for d in find(docs, kind):
            assert d["metadata"]["namespace"] == namespace, (kind, d["metadata"]["name"])
    labels = pod_labels(docs)
    for monitor in find(docs, "PodMonitor") + find(docs, "ServiceMonitor"):
        chosen = monitor["spec"].get("namespaceSelector", {})
        assert not chosen.get("any") and chosen.get("matchNames", [namespace]) == [namespace]
    for pm in find(docs, "PodMonitor"):
        assert selects(pm["spec"]["selector"]["matchLabels"], labels)
    for sm in find(docs, "ServiceMonitor"):
        svc = one(docs, "Service", "ipvsctl-metrics")
        assert selects(sm["spec"]["selector"]["matchLabels"], svc["metadata"]["labels"])
        assert selects(svc["spec"]["selector"], labels)
    assert len(find(docs, "PrometheusRule")) == 2


@pytest.mark.parametrize("components", [(), ("kube-proxy-takeover",)], ids=["base", "takeover"])
def test_the_shutdown_managers_default_lookup_names_the_metrics_service(components):
    from ipvsctl.shutdown import DEFAULT_DAEMON_PORT, DEFAULT_DAEMON_SERVICES

    docs = render(overlay_with(*components))
    svc = one(docs, "Service", "ipvsctl-metrics")
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"]
    name = f"{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc.cluster.local"
    assert name in DEFAULT_DAEMON_SERVICES
    assert [p["port"] for p in svc["spec"]["ports"]] == [DEFAULT_DAEMON_PORT]


def runbooks() -> str:
    """operations.md's alert runbooks: from the commands' preamble to the next section."""
    text = (REPO / "docs" / "operations.md").read_text()
    start = text.index("In the commands below, `NODE` is the alert's `node` label")
    return text[start : text.index("\n## ", start)]


def test_the_runbooks_name_no_fixed_namespace():
    text = runbooks()
    assert "### IpvsctlDown" in text and "### IpvsctlTableFull" in text
    assert "ipvsctl-system:" not in text and "-n ipvsctl-system" not in text
    namespaced = re.findall(r"kubectl\s+-n\s+(\S+)", text)
    assert len(namespaced) > 10 and set(namespaced) == {'"$NS"'}, sorted(set(namespaced))


@pytest.mark.parametrize("components", [(), ("kube-proxy-takeover",)], ids=["base", "takeover"])
def test_the_runbooks_find_the_daemonset_and_the_pod_in_either_namespace(components):
    """The preamble's two lookups, by label: the DaemonSet (its metadata's labels) across
    namespaces, then the node's pod (its template's labels) in that namespace."""
    block = re.search(r"```sh\n(NS=.*?)```", runbooks(), re.S)
    assert block, "the runbooks' NS= and pod= lookups are gone"
    commands = block.group(1).replace("\\\n", " ")
    ns_line, pod_line = (line for line in commands.splitlines() if line.strip())
    docs = render(overlay_with(*components))
    ds = one(docs, "DaemonSet")
    for line, labels in ((ns_line, ds["metadata"]["labels"]), (pod_line, pod_labels(docs))):
        (selector,) = re.findall(r"-l (\S+)", line)
        assert selects(dict(p.split("=") for p in selector.split(",")), labels), line
    assert " -A " in ns_line and "{.items[0].metadata.namespace}" in ns_line
    assert '-n "$NS"' in pod_line and "spec.nodeName=NODE" in pod_line

"""daemonset/ and its overlays, as `kubectl kustomize` renders them."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
import yaml

from .helpers import (
    DAEMONSET_DIR,
    NAMESPACE,
    REPO,
    VAGRANT_DIR,
    find,
    one,
    overlay,
    overlay_with,
    render,
)

BASE_KINDS = {
    "Namespace",
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "ConfigMap",
    "Service",
    "DaemonSet",
}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding"}


def test_base_renders_the_expected_objects():
    docs = render(DAEMONSET_DIR)
    assert sorted(d["kind"] for d in docs) == sorted(BASE_KINDS)


def test_every_namespaced_object_is_in_ipvsctl_system():
    for d in render(DAEMONSET_DIR):
        if d["kind"] in CLUSTER_SCOPED:
            assert "namespace" not in d["metadata"], d["kind"]
        else:
            assert d["metadata"]["namespace"] == NAMESPACE, d["kind"]
    assert one(render(DAEMONSET_DIR), "Namespace")["metadata"]["name"] == NAMESPACE


def test_podmonitor_component_adds_exactly_a_podmonitor():
    base = render(DAEMONSET_DIR)
    with_pm = render(overlay_with("podmonitor"))
    assert len(with_pm) == len(base) + 1
    pm = one(with_pm, "PodMonitor")
    assert pm["apiVersion"] == "monitoring.coreos.com/v1"
    assert pm["metadata"]["namespace"] == NAMESPACE


def test_base_ships_clear_placeholders():
    """The two settings a user must make are visible placeholders, not working defaults."""
    docs = render(DAEMONSET_DIR)
    cm = one(docs, "ConfigMap")
    assert cm["data"]["IPVSCTL_APISERVER"].startswith("https://apiserver.invalid")
    images = {c["image"] for c in one(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"]}
    assert images == {"registry.example.com/ipvsctl:0.2.0"}


def test_configmap_name_carries_content_hash():
    """So a new API server address rolls the DaemonSet."""
    docs = render(DAEMONSET_DIR)
    cm_name = one(docs, "ConfigMap")["metadata"]["name"]
    assert cm_name.startswith("ipvsctl-config-") and cm_name != "ipvsctl-config"
    container = one(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]
    refs = [
        e["valueFrom"]["configMapKeyRef"]["name"]
        for e in container["env"]
        if "configMapKeyRef" in e.get("valueFrom", {})
    ]
    assert refs == [cm_name]


def test_vagrant_overlay_sets_the_lab_settings():
    docs = render(VAGRANT_DIR / "overlay")
    cm = one(docs, "ConfigMap")
    assert cm["data"]["IPVSCTL_APISERVER"] == "https://192.168.56.10:6443"
    spec = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    for c in spec["initContainers"] + spec["containers"]:
        assert c["image"] == "localhost/ipvsctl:dev"
        assert c["imagePullPolicy"] == "IfNotPresent"
    assert find(docs, "PodMonitor") == []


def yaml_blocks(doc: Path) -> list[dict]:
    """The ```yaml blocks of a Markdown file that parse to a mapping (list items indented)."""
    blocks = re.findall(r"^( *)```yaml\n(.*?)^\1```", doc.read_text(), re.S | re.M)
    parsed = [yaml.safe_load(textwrap.dedent(body)) for _, body in blocks]
    return [b for b in parsed if isinstance(b, dict)]


def documented_patches() -> list[tuple[str, dict]]:
    return [
        (f"{doc.name}#{i}", block)
        for doc in sorted((REPO / "docs").glob("*.md"))
        for i, block in enumerate(yaml_blocks(doc))
        if "patches" in block
    ]


def lost(base: object, patched: object, where: str = "") -> list[str]:
    """What of `base` is missing or changed in `patched` (lists may grow at the end)."""
    if isinstance(base, dict) and isinstance(patched, dict):
        return [
            w
            for k, v in base.items()
            for w in (lost(v, patched[k], f"{where}/{k}") if k in patched else [f"{where}/{k}"])
        ]
    if isinstance(base, list) and isinstance(patched, list) and len(patched) >= len(base):
        return [w for i, v in enumerate(base) for w in lost(v, patched[i], f"{where}/{i}")]
    return [] if base == patched else [where or "/"]


def test_the_loss_check_sees_a_replaced_map():
    base = {"nodeSelector": {"kubernetes.io/os": "linux"}, "args": ["a"]}
    assert (
        lost(base, {"nodeSelector": {"kubernetes.io/os": "linux", "x": "1"}, "args": ["a", "b"]})
        == []
    )
    assert lost(base, {"nodeSelector": {"x": "1"}, "args": ["a"]}) == [
        "/nodeSelector/kubernetes.io/os"
    ]
    assert lost(base, {"nodeSelector": {"kubernetes.io/os": "linux"}, "args": []}) == ["/args"]


def test_the_guides_have_patches_to_check():
    names = {name.split("#")[0] for name, _ in documented_patches()}
    assert {"install.md", "migrating-from-kube-router.md"} <= names


@pytest.mark.parametrize(
    ("name", "block"), documented_patches(), ids=[n for n, _ in documented_patches()]
)
def test_documented_patches_render_and_only_add(name, block):
    """Each patch the guides show, in an overlay of daemonset/, renders with kubectl and
    keeps everything of the DaemonSet it patches (a JSON-patch `add` on a map replaces it)."""
    base = one(render(DAEMONSET_DIR), "DaemonSet")
    patched = one(render(overlay({"patches": block["patches"]})), "DaemonSet")
    assert patched != base, f"{name}: the patch changed nothing"
    assert lost(base, patched) == [], f"{name}: the patch drops or changes what daemonset/ has"


def test_kube_router_guide_node_selector_keeps_linux_and_is_the_takeovers():
    """One node-label scheme for both guides: the kube-router guide's patch selects the nodes
    the kube-proxy takeover component selects."""
    [block] = [b for n, b in documented_patches() if n.startswith("migrating-from-kube-router")]
    ds = one(render(overlay({"patches": block["patches"]})), "DaemonSet")
    takeover = one(render(overlay_with("kube-proxy-takeover")), "DaemonSet")
    assert ds["spec"]["template"]["spec"]["nodeSelector"] == {
        "kubernetes.io/os": "linux",
        "ipvsctl.io/proxy": "ipvsctl",
    }
    assert (
        takeover["spec"]["template"]["spec"]["nodeSelector"]
        == (ds["spec"]["template"]["spec"]["nodeSelector"])
    )


def test_install_guide_overlay_example_sets_image_and_api_server():
    """The overlay of install.md, step 2, with its path to daemonset/ made real."""
    [example] = [
        b for b in yaml_blocks(REPO / "docs" / "install.md") if b.get("kind") == "Kustomization"
    ]
    assert example["resources"] == ["../ipvsctl/daemonset"]
    docs = render(overlay({k: v for k, v in example.items() if k != "resources"}))
    spec = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    assert {c["image"] for c in spec["containers"]} == {"registry.mycorp.example/net/ipvsctl:0.2.0"}
    assert one(docs, "ConfigMap")["data"]["IPVSCTL_APISERVER"] == "https://10.0.0.10:6443"

"""daemonset/ and its overlays, as `kubectl kustomize` renders them."""

from __future__ import annotations

from .helpers import (
    DAEMONSET_DIR,
    NAMESPACE,
    VAGRANT_DIR,
    find,
    one,
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
    assert images == {"registry.example.com/ipvsctl:0.1.0"}


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

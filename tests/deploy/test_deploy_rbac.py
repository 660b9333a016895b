"""RBAC grants exactly ipvsctl.kube.permissions.REQUIRED_PERMISSIONS, both ways."""

from __future__ import annotations

import re

from ipvsctl.kube.permissions import REQUIRED_PERMISSIONS

from .helpers import DAEMONSET_DIR, NAMESPACE, REPO, find, one, render


def granted(role):
    out = set()
    for rule in role["rules"]:
        assert set(rule) <= {"apiGroups", "resources", "verbs"}, f"unexpected rule keys: {rule}"
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    out.add((group, resource, verb))
    return out


def required():
    return {(p.api_group, p.resource, verb) for p in REQUIRED_PERMISSIONS for verb in p.verbs}


def test_clusterrole_grants_exactly_the_required_permissions():
    role = one(render(DAEMONSET_DIR), "ClusterRole")
    g, r = granted(role), required()
    assert not (r - g), f"needed by the daemon but not granted: {sorted(r - g)}"
    assert not (g - r), f"granted but not in REQUIRED_PERMISSIONS: {sorted(g - r)}"


def test_no_wildcards_and_no_namespaced_roles():
    docs = render(DAEMONSET_DIR)
    for rule in one(docs, "ClusterRole")["rules"]:
        for field in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[field]
    assert find(docs, "Role") == [] and find(docs, "RoleBinding") == []


def test_binding_ties_the_role_to_the_daemonsets_service_account():
    docs = render(DAEMONSET_DIR)
    binding = one(docs, "ClusterRoleBinding")
    role = one(docs, "ClusterRole")
    sa = one(docs, "ServiceAccount")
    ds = one(docs, "DaemonSet")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": NAMESPACE}
    ]
    assert ds["spec"]["template"]["spec"]["serviceAccountName"] == sa["metadata"]["name"]


def test_install_guide_names_every_granted_resource():
    """docs/install.md's RBAC row ("What gets installed") and its RBAC bullet name each
    resource the ClusterRole grants, with its verbs."""
    text = (REPO / "docs" / "install.md").read_text()
    row = re.search(
        r"^\| ServiceAccount, ClusterRole, ClusterRoleBinding \|[^|]*\|(.*)\|$", text, re.M
    )
    bullet = re.search(r"^- \*\*RBAC\*\*:(.*?)(?=^- |^#)", text, re.S | re.M)
    assert row and bullet
    for where in (row.group(1), " ".join(bullet.group(1).split())):
        for p in REQUIRED_PERMISSIONS:
            kind, verbs = p.resource.removesuffix("s"), "/".join(p.verbs)
            assert re.search(rf"\b{kind}", where, re.I) and verbs in where, (
                f"install.md does not say {verbs} {p.resource}: {where!r}"
            )

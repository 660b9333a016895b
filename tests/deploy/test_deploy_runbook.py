"""The migration guides' node-by-node blocks, run by bash as a script would (`set -euo
pipefail`), against a stand-in kubectl over a simulated cluster (standin_cluster.py).

The simulated DaemonSets pick nodes as the real manifests do: ipvsctl's node selector from
the real `kubectl kustomize` render (the takeover component, or the kube-router guide's
patch), kube-proxy's affinity from kubeadm's DaemonSet patched by the real `kubectl patch`
with kube-proxy-steps-aside.yaml, kube-router-noproxy's from the guide's own block. A pod
appears some seconds after its node's label changes, as a DaemonSet controller makes it: a
block that waits for Ready right after labelling fails there as it does on a cluster.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from .helpers import DAEMONSET_DIR, REPO, kubectl, one, overlay, overlay_with, render
from .test_deploy_monitoring import exported_metrics

STANDIN = Path(__file__).with_name("standin_cluster.py")
KUBEADM_DAEMONSET = REPO / "tests" / "data" / "kubeadm-kube-proxy-daemonset.yaml"
STEPS_ASIDE = DAEMONSET_DIR / "kube-proxy-takeover" / "kube-proxy-steps-aside.yaml"
GUIDES = {
    "kube-proxy": REPO / "docs" / "migrating-from-kube-proxy.md",
    "kube-router": REPO / "docs" / "migrating-from-kube-router.md",
}
NODES = ("node-1", "node-2")
LABEL = "ipvsctl.io/proxy"


def sh_blocks(text: str) -> list[str]:
    return [
        textwrap.dedent(body)
        for _, body in re.findall(r"^( *)```sh\n(.*?)^\1```", text, re.S | re.M)
    ]


def move_block(guide: str) -> str:
    """The block that moves one node: it labels it for ipvsctl."""
    found = [b for b in sh_blocks(GUIDES[guide].read_text()) if f"{LABEL}=ipvsctl" in b]
    assert len(found) == 1, f"{guide}: {len(found)} blocks label a node {LABEL}=ipvsctl"
    return found[0]


def rollback_block(guide: str) -> str:
    text = GUIDES[guide].read_text()
    start = text.index("## Rolling back a node")
    section = text[start : text.find("\n## ", start + 1)]
    (block,) = sh_blocks(section)
    return block.replace("<path>", str(REPO))


def affinity_terms(spec: dict[str, Any]) -> list[dict[str, Any]]:
    affinity = spec.get("affinity", {}).get("nodeAffinity", {})
    return affinity.get("requiredDuringSchedulingIgnoredDuringExecution", {}).get(
        "nodeSelectorTerms", []
    )


def kube_proxy_stepped_aside() -> dict[str, Any]:
    """kubeadm's kube-proxy DaemonSet after the guides' patch, by the real kubectl."""
    r = subprocess.run(
        [
            *(kubectl(), "patch", "--local", "-f", str(KUBEADM_DAEMONSET)),
            *("--type", "strategic", "--patch-file", str(STEPS_ASIDE), "-o", "yaml"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    return yaml.safe_load(r.stdout)["spec"]["template"]


def daemonset(name: str, namespace: str, template: dict[str, Any], **timing: int) -> dict:
    spec = template["spec"]
    return {
        "name": name,
        "namespace": namespace,
        "podLabels": template["metadata"]["labels"],
        "nodeSelector": spec.get("nodeSelector", {}),
        "nodeSelectorTerms": affinity_terms(spec),
        "image": spec["containers"][0]["image"],
        "create": 5,
        "ready": 20,
        "delete": 15,
        **timing,
    }


def ipvsctl_daemonset(guide: str) -> dict[str, Any]:
    if guide == "kube-proxy":
        docs = render(overlay_with("kube-proxy-takeover"))
    else:  # the guide's node-selector patch over daemonset/
        text = GUIDES[guide].read_text()
        patch = next(
            yaml.safe_load(textwrap.dedent(body))
            for _, body in re.findall(r"^( *)```yaml\n(.*?)^\1```", text, re.S | re.M)
            if "nodeSelector/ipvsctl.io" in body
        )
        docs = render(overlay({"patches": patch["patches"]}))
    ds = one(docs, "DaemonSet")
    # the daemon's pod is Ready after its first sync: a minute here
    return daemonset("ipvsctl", ds["metadata"]["namespace"], ds["spec"]["template"], ready=60)


def cluster(guide: str) -> dict[str, Any]:
    kube_proxy = kube_proxy_stepped_aside()
    if guide == "kube-proxy":
        old = [daemonset("kube-proxy", "kube-system", kube_proxy)]
    else:
        text = GUIDES[guide].read_text()
        noproxy_affinity = next(
            yaml.safe_load(textwrap.dedent(body))
            for _, body in re.findall(r"^( *)```yaml\n(.*?)^\1```", text, re.S | re.M)
            if body.lstrip().startswith("affinity:")
        )
        linux = {"nodeSelector": {"kubernetes.io/os": "linux"}, "containers": [{"image": "kr"}]}
        old = [
            daemonset(  # kube-router with its proxy, patched as the guide says
                "kube-router",
                "kube-system",
                {
                    "metadata": {"labels": {"k8s-app": "kube-router"}},
                    "spec": {**linux, "affinity": kube_proxy["spec"]["affinity"]},
                },
            ),
            daemonset(
                "kube-router-noproxy",
                "kube-system",
                {
                    "metadata": {"labels": {"k8s-app": "kube-router-noproxy"}},
                    "spec": {**linux, **noproxy_affinity},
                },
            ),
        ]
    metrics = "".join(f"{n} 0\n" for n in sorted(exported_metrics()) if n.startswith("ipvsctl_"))
    return {
        "clock": 0,
        "nodes": {n: {"labels": {"kubernetes.io/os": "linux"}} for n in NODES},
        "daemonsets": [*old, ipvsctl_daemonset(guide)],
        "tracks": {},
        "pods": [],
        "created": [],
        "metrics": metrics,
        "log": [],
    }


def run_blocks(tmp_path: Path, state: dict[str, Any], *blocks: str) -> tuple[int, str, dict]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, args in (("kubectl", '"$@"'), ("sleep", '__sleep "$@"')):
        exe = bin_dir / name
        exe.write_text(f"#!/bin/sh\nexec {sys.executable} {STANDIN} {args}\n")
        exe.chmod(0o755)
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(state))
    script = "set -euo pipefail\n" + "\n".join(blocks)
    r = subprocess.run(
        ["bash", "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env={
            "PATH": f"{bin_dir}:/usr/bin:/bin",
            "STANDIN_STATE": str(path),
            "PYTHONPATH": os.pathsep.join(sys.path),
        },
    )
    return r.returncode, r.stdout + r.stderr, json.loads(path.read_text())


def pods_on(state: dict[str, Any], node: str) -> dict[str, bool]:
    """{owner DaemonSet (or pod name): ready} of the pods on `node`."""
    return {p.get("owner", p["name"]): p["ready"] for p in state["pods"] if p["node"] == node}


def old_proxy(guide: str) -> str:
    return "kube-proxy" if guide == "kube-proxy" else "kube-router"


@pytest.mark.parametrize("guide", GUIDES)
def test_the_guides_move_a_node_as_a_script_would(tmp_path, guide):
    """The node ends with ipvsctl Ready and without the old proxy's service proxy; the other
    node is untouched. The pod appears 5 s after the label: the block waits for it to exist,
    then for Ready (a minute), and checks it."""
    rc, out, state = run_blocks(tmp_path, cluster(guide), move_block(guide))
    assert rc == 0, out
    assert state["nodes"]["node-1"]["labels"][LABEL] == "ipvsctl"
    on_node = pods_on(state, "node-1")
    assert on_node.get("ipvsctl") is True, on_node
    assert old_proxy(guide) not in on_node
    if guide == "kube-router":  # routing stays on the node, without the service proxy
        assert on_node.get("kube-router-noproxy") is True
    assert pods_on(state, "node-2") == {old_proxy(guide): True}
    assert state["clock"] > 60  # it waited for the pod's first sync, not just its creation
    assert any(argv[:1] == ["ipvsctl"] for argv in state["log"])  # kubectl ipvsctl status


@pytest.mark.parametrize("guide", GUIDES)
def test_the_guides_roll_a_node_back_as_a_script_would(tmp_path, guide):
    """After the move, the rollback: the old proxy back and Ready, ipvsctl gone, and
    `ipvsctl cleanup --rollback` run once on that node with the DaemonSet's image, then
    its pod deleted."""
    state = cluster(guide)
    image = state["daemonsets"][-1]["image"]
    rc, out, state = run_blocks(tmp_path, state, move_block(guide), rollback_block(guide))
    assert rc == 0, out
    assert LABEL not in state["nodes"]["node-1"]["labels"]
    assert pods_on(state, "node-1") == {old_proxy(guide): True}
    (pod,) = state["created"]
    spec = pod["spec"]
    assert spec["nodeName"] == "node-1" and spec["hostNetwork"] is True
    assert spec["containers"][0]["image"] == image
    assert spec["containers"][0]["args"][:2] == ["cleanup", "--rollback"]
    assert "cleanup (rollback) done" in out


@pytest.mark.parametrize("guide", GUIDES)
def test_the_guides_name_only_metrics_the_daemon_has(guide):
    block = move_block(guide)
    (pattern,) = re.findall(r"grep -E '(\^ipvsctl_[^']+)'", block)
    names = re.findall(r"[a-z_]+", re.sub(r"^\^ipvsctl_\(|\)$", "", pattern))
    exported = exported_metrics()
    assert len(names) >= 5
    for name in names:
        assert f"ipvsctl_{name}" in exported, name


def test_kubectl_wait_on_no_pod_fails_in_the_stand_in_as_in_kubectl(tmp_path):
    """The stand-in is as strict as kubectl: a block that waits for Ready right after the
    label (before the DaemonSet made the pod) fails; one that waits for deletion of a pod
    already gone does not."""
    early = """
        kubectl label node node-1 ipvsctl.io/proxy=ipvsctl --overwrite
        kubectl -n kube-system wait --for=condition=Ready pod -l app.kubernetes.io/name=ipvsctl \\
          --field-selector spec.nodeName=node-1 --timeout=5m
    """
    rc, out, _ = run_blocks(tmp_path, cluster("kube-proxy"), textwrap.dedent(early))
    assert rc == 1 and "no matching resources found" in out
    gone = "kubectl -n kube-system wait pod -l k8s-app=nothing --for=delete --timeout=1m\n"
    rc, out, _ = run_blocks(tmp_path, cluster("kube-proxy"), gone)
    assert rc == 0, out


ROLLBACK_POD = DAEMONSET_DIR / "rollback-pod.yaml"


def rollback_pod(node: str = "node-1", image: str = "registry.test.invalid/ipvsctl:1") -> dict:
    """The manifest as the guides fill it in (sed over NODE_NAME and IMAGE)."""
    text = ROLLBACK_POD.read_text().replace("NODE_NAME", node).replace("IMAGE", image)
    return yaml.safe_load(text)


@pytest.mark.parametrize("components", [(), ("kube-proxy-takeover",)], ids=["base", "takeover"])
def test_the_rollback_pod_runs_cleanup_rollback_where_the_daemon_ran(components):
    """On the node's network namespace and state directory, as root with the daemon's own
    capabilities, unseen by whatever looks for the daemon's pods."""
    import typer.main

    from ipvsctl.cli.app import app

    pod = rollback_pod()
    spec = pod["spec"]
    ds = one(render(overlay_with(*components)), "DaemonSet")["spec"]["template"]
    daemon = next(c for c in ds["spec"]["containers"] if c["name"] == "ipvsctl")
    (c,) = spec["containers"]
    assert spec["nodeName"] == "node-1" and pod["metadata"]["name"] == "ipvsctl-rollback-node-1"
    assert spec["hostNetwork"] and spec["restartPolicy"] == "Never"
    assert spec["tolerations"] == [{"operator": "Exists"}]
    assert c["securityContext"] == daemon["securityContext"]
    mount = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}["state"]
    state = {v["name"]: v for v in spec["volumes"]}["state"]["hostPath"]["path"]
    daemon_state = {v["name"]: v for v in ds["spec"]["volumes"]}["state"]["hostPath"]["path"]
    assert (
        state == daemon_state and mount == daemon["args"][daemon["args"].index("--state-dir") + 1]
    )
    # a real command line of the program, with --rollback and the daemon's state dir
    command = typer.main.get_command(app).commands[c["args"][0]]  # type: ignore[attr-defined]
    params = command.make_context(c["args"][0], list(c["args"][1:])).params
    assert params["rollback"] is True and params["state_dir"] == mount
    labels = pod["metadata"]["labels"]
    assert not all(labels.get(k) == v for k, v in ds["metadata"]["labels"].items())


def test_the_rollback_pod_is_a_valid_pod():
    kv = pytest.importorskip("kubernetes_validate", reason="tests/deploy/run.sh installs it")
    kv.validate(rollback_pod(), kv.latest_version(), strict=True)
    lines = ROLLBACK_POD.read_text().splitlines()
    body = "\n".join(line for line in lines if not line.lstrip().startswith("#"))
    assert body.count("NODE_NAME") == 2 and body.count("IMAGE") == 1  # what the guides fill

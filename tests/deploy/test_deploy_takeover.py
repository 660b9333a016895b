"""daemonset/kube-proxy-takeover: ipvsctl in kube-proxy's place with kube-proxy's ConfigMap.

Rendered with the real `kubectl kustomize`, checked against kubeadm's kube-proxy DaemonSet
and ConfigMaps of several Kubernetes versions (tests/data), the pod's command line run
through the CLI against each ConfigMap as the kubelet would mount it, kube-proxy's patch
applied with the real `kubectl patch --local`, and node-prep's strict-ARP reading of the
file checked against the parser's.
"""

from __future__ import annotations

import logging
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from .helpers import DAEMONSET_DIR, REPO, kubectl, one, overlay_with, render

TAKEOVER = DAEMONSET_DIR / "kube-proxy-takeover"
DATA = REPO / "tests" / "data"
KUBEADM_DAEMONSET = DATA / "kubeadm-kube-proxy-daemonset.yaml"
CONFIGMAPS = sorted((DATA / "kube-proxy").glob("kubeadm-*.configmap.yaml"))
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def rendered() -> list[dict]:
    return render(overlay_with("kube-proxy-takeover"))


def ds_spec() -> dict:
    return one(rendered(), "DaemonSet")["spec"]["template"]["spec"]


def kube_proxy_spec() -> dict:
    return yaml.safe_load(KUBEADM_DAEMONSET.read_text())["spec"]["template"]["spec"]


def test_runs_in_kube_system_and_owns_no_namespace_or_api_address():
    docs = rendered()
    assert not [d for d in docs if d["kind"] == "Namespace"]
    assert not [d for d in docs if d["kind"] == "ConfigMap"]  # the API address's
    for d in docs:
        if d["kind"] not in ("ClusterRole", "ClusterRoleBinding"):
            assert d["metadata"]["namespace"] == "kube-system", d["kind"]
    binding = one(docs, "ClusterRoleBinding")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "ipvsctl", "namespace": "kube-system"}
    ]


def test_the_daemon_runs_from_kube_proxys_file_alone():
    spec = ds_spec()
    c = next(c for c in spec["containers"] if c["name"] == "ipvsctl")
    assert c["args"][:3] == ["run", "--config", "/var/lib/kube-proxy/config.conf"]
    # Nothing the file has a field for is given on the command line (it would win).
    from ipvsctl.source.kubeproxy_config import FIELDS

    flags = {f.ipvsctl.split()[0] for f in FIELDS if f.ipvsctl.startswith("--")}
    assert not flags & set(c["args"]), flags & set(c["args"])
    assert [e["name"] for e in c["env"]] == ["NODE_NAME"]  # no IPVSCTL_APISERVER
    for container in (c, next(i for i in spec["initContainers"] if i["name"] == "node-prep")):
        mount = next(m for m in container["volumeMounts"] if m["name"] == "kube-proxy")
        assert mount == {"name": "kube-proxy", "mountPath": "/var/lib/kube-proxy", "readOnly": True}
    volume = next(v for v in spec["volumes"] if v["name"] == "kube-proxy")
    assert volume == {"name": "kube-proxy", "configMap": {"name": "kube-proxy"}}


def test_same_tolerations_and_priority_as_kubeadms_kube_proxy():
    spec, kp = ds_spec(), kube_proxy_spec()
    assert spec["priorityClassName"] == kp["priorityClassName"]
    assert all(t in spec["tolerations"] for t in kp["tolerations"])
    # the mount path is where kube-proxy reads its file
    assert "--config=/var/lib/kube-proxy/config.conf" in kp["containers"][0]["command"]


def test_only_nodes_handed_over_get_ipvsctl():
    assert ds_spec()["nodeSelector"] == {
        "kubernetes.io/os": "linux",
        "ipvsctl.io/proxy": "ipvsctl",
    }


def test_kube_proxy_steps_aside_from_labelled_nodes():
    """The documented patch, applied by the real kubectl to kubeadm's DaemonSet: kube-proxy
    keeps every node without the label, and nothing else of it changes."""
    r = subprocess.run(
        [
            kubectl(),
            "patch",
            "--local",
            "-f",
            str(KUBEADM_DAEMONSET),
            "--type",
            "strategic",
            "--patch-file",
            str(TAKEOVER / "kube-proxy-steps-aside.yaml"),
            "-o",
            "yaml",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    patched = yaml.safe_load(r.stdout)["spec"]["template"]["spec"]
    terms = patched["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"] == [
        {"matchExpressions": [{"key": "ipvsctl.io/proxy", "operator": "DoesNotExist"}]}
    ]
    patched.pop("affinity")
    assert patched == kube_proxy_spec()


def mount_configmap(configmap: Path, root: Path) -> tuple[Path, str]:
    """The ConfigMap's keys as the kubelet mounts them (one file each) under root, the
    service-account paths moved there too; returns (the mount dir, the control plane)."""
    cm = yaml.safe_load(configmap.read_text())
    sa = root / "sa"
    sa.mkdir()
    (sa / "token").write_text("a-projected-token")
    (sa / "ca.crt").write_text("a CA")
    mount = root / "kube-proxy"
    mount.mkdir()
    for key, text in cm["data"].items():
        (mount / key).write_text(
            text.replace(SA_DIR, str(sa)).replace("/var/lib/kube-proxy", str(mount))
        )
    server = yaml.safe_load(cm["data"]["kubeconfig.conf"])["clusters"][0]["cluster"]["server"]
    return mount, server


@pytest.mark.parametrize("configmap", CONFIGMAPS, ids=lambda p: p.name.split(".")[0])
def test_the_pod_starts_from_each_kubeadm_configmap(monkeypatch, tmp_path, configmap):
    """The rendered container's args, run through the CLI with kubeadm's ConfigMap mounted:
    the daemon gets the kubeconfig.conf, whose server is the control plane, and the
    service account's token; no --apiserver anywhere."""
    from typer.testing import CliRunner

    import ipvsctl.daemon.wiring
    import ipvsctl.kernel.netlink.addresses
    import ipvsctl.obs.logging
    from ipvsctl.cli.app import app
    from ipvsctl.kube.config import load_configuration

    mount, server = mount_configmap(configmap, tmp_path)
    c = next(c for c in ds_spec()["containers"] if c["name"] == "ipvsctl")
    args = [a.replace("/var/lib/kube-proxy", str(mount)) for a in c["args"]]
    args = [a.replace("/var/lib/ipvsctl", str(tmp_path / "state")) for a in args]
    seen = []
    monkeypatch.setattr(ipvsctl.daemon.wiring, "run", lambda o: seen.append(o) or 0)
    monkeypatch.setattr(
        ipvsctl.kernel.netlink.addresses, "node_addresses", lambda exclude_interfaces=(): []
    )
    monkeypatch.setattr(ipvsctl.obs.logging, "setup", lambda fmt="text", level=logging.INFO: None)
    r = CliRunner().invoke(app, args, env={"NODE_NAME": "node-1", "KUBECONFIG": None})
    assert r.exit_code == 0, r.output
    (opts,) = seen
    assert opts.source.apiserver is None and opts.node.node_name == "node-1"
    assert opts.source.kubeconfig == str(mount / "kubeconfig.conf")
    cfg = load_configuration(opts.source.kubeconfig, None, environ={})
    assert cfg.host == server
    assert cfg.get_api_key_with_prefix("BearerToken") == "Bearer a-projected-token"


NODE_PREP = DAEMONSET_DIR / "node-prep.sh"
CORPUS = sorted((DATA / "kube-proxy").iterdir())


@pytest.mark.parametrize("file", CORPUS, ids=lambda p: p.name)
def test_node_prep_reads_strict_arp_as_the_parser_does(tmp_path, file):
    from ipvsctl.source.kubeproxy_config import KubeProxyConfigError, translate

    text = file.read_text()
    doc = yaml.safe_load(text)
    if doc.get("kind") == "ConfigMap":
        text = doc["data"]["config.conf"]
    try:
        want = translate(yaml.safe_load(text)).strict_arp
    except KubeProxyConfigError:
        return  # the daemon refuses it: nothing to agree on
    proc = tmp_path / "proc"
    for name, value in {
        "net.ipv4.ip_forward": "1",
        "net.ipv4.vs.conntrack": "1",
        "net.ipv4.vs.expire_nodest_conn": "1",
        "net.ipv4.vs.expire_quiescent_template": "1",
        "net.ipv4.vs.conn_reuse_mode": "0",
        "net.ipv4.conf.all.arp_ignore": "0",
        "net.ipv4.conf.all.arp_announce": "0",
    }.items():
        path = proc.joinpath(*name.split("."))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(value)
    (tmp_path / "config.conf").write_text(text)
    env = {
        "PATH": os.environ["PATH"],
        "IPVSCTL_PROC_SYS": str(proc),
        "IPVSCTL_MODULES": "",
        "IPVSCTL_REQUIRED_MODULES": "",
        "IPVSCTL_KUBE_PROXY_CONFIG": str(tmp_path / "config.conf"),
    }
    r = subprocess.run(["bash", str(NODE_PREP)], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    arp = (proc / "net/ipv4/conf/all/arp_ignore").read_text().strip()
    assert arp == ("1" if want else "0"), r.stderr

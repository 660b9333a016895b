"""The DaemonSet has what a node proxy needs, and agrees with CONTRACT.md and the Dockerfile."""

from __future__ import annotations

import json
import re

import pytest

from .helpers import (
    DAEMONSET_DIR,
    REPO,
    cli_run_options,
    contract_run_options,
    flags_in,
    one,
    render,
)

PORT = 9796
HEALTHZ_PORT = 10256  # kube-proxy's, --healthz-bind-address
UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "K": 10**3, "M": 10**6, "G": 10**9}


def quantity(q: str) -> int:
    m = re.fullmatch(r"(\d+)([KMG]i?)?", str(q))
    assert m, q
    return int(m.group(1)) * UNITS.get(m.group(2) or "", 1)


@pytest.fixture(scope="module")
def docs():
    return render(DAEMONSET_DIR)


@pytest.fixture(scope="module")
def pod(docs):
    return one(docs, "DaemonSet")["spec"]["template"]


@pytest.fixture(scope="module")
def main(pod):
    (c,) = [c for c in pod["spec"]["containers"] if c["name"] == "ipvsctl"]
    return c


def all_containers(pod):
    return pod["spec"].get("initContainers", []) + pod["spec"]["containers"]


def arg_value(container, flag, default=None):
    args = container["args"]
    for i, a in enumerate(args):
        if a == flag:
            return args[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return default


def test_runs_on_every_node_in_the_host_network(docs, pod):
    spec = pod["spec"]
    assert spec["hostNetwork"] is True
    # The node's resolver: the cluster DNS is a ClusterIP this daemon programs itself, so
    # a fresh node could never resolve a named API server (a boot deadlock).
    assert spec["dnsPolicy"] == "Default"
    assert spec["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert spec["priorityClassName"] == "system-node-critical"
    assert {"operator": "Exists"} in spec["tolerations"]
    strategy = one(docs, "DaemonSet")["spec"]["updateStrategy"]
    assert strategy["type"] == "RollingUpdate"
    assert strategy["rollingUpdate"]["maxUnavailable"] == 1


def test_stops_cleanly(pod):
    # Long enough to save the drain queue and exit; the table is left in the kernel.
    assert 10 <= pod["spec"]["terminationGracePeriodSeconds"] <= 120


def test_node_name_comes_from_the_downward_api(main):
    env = {e["name"]: e for e in main["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}


def test_apiserver_address_comes_from_the_configmap(docs, main):
    cm = one(docs, "ConfigMap")
    env = {e["name"]: e for e in main["env"]}
    ref = env["IPVSCTL_APISERVER"]["valueFrom"]["configMapKeyRef"]
    assert ref["name"] == cm["metadata"]["name"]
    assert ref["key"] in cm["data"]
    assert ref.get("optional") is not True


def test_probes_use_the_contract_paths_on_the_listen_port(main):
    listen = arg_value(main, "--listen")
    assert listen == f"0.0.0.0:{PORT}"
    ports = {p["name"]: p["containerPort"] for p in main["ports"]}
    assert ports == {"metrics": PORT, "healthz": HEALTHZ_PORT}
    live, ready = main["livenessProbe"]["httpGet"], main["readinessProbe"]["httpGet"]
    assert live["path"] == "/healthz"
    assert ready["path"] == "/readyz"
    for probe in (live, ready):
        assert ports.get(probe["port"], probe["port"]) == PORT


def test_kube_proxy_health_port_is_served_and_declared(main):
    # Cloud load balancers probe kube-proxy's port on every node (KEP-3836).
    assert arg_value(main, "--healthz-bind-address", "0.0.0.0:10256") == (f"0.0.0.0:{HEALTHZ_PORT}")
    (port,) = [p for p in main["ports"] if p["name"] == "healthz"]
    assert port["containerPort"] == HEALTHZ_PORT and port.get("protocol", "TCP") == "TCP"


def test_state_dir_is_a_host_directory(pod, main):
    state_dir = arg_value(main, "--state-dir", "/var/lib/ipvsctl")
    mounts = {m["mountPath"]: m for m in main["volumeMounts"]}
    vol_name = mounts[state_dir]["name"]
    assert not mounts[state_dir].get("readOnly")
    (vol,) = [v for v in pod["spec"]["volumes"] if v["name"] == vol_name]
    assert vol["hostPath"] == {"path": "/var/lib/ipvsctl", "type": "DirectoryOrCreate"}


def test_modules_come_from_the_host_read_only(pod):
    (init,) = pod["spec"]["initContainers"]
    mounts = {m["mountPath"]: m for m in init["volumeMounts"]}
    assert mounts["/lib/modules"]["readOnly"] is True
    vols = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert vols[mounts["/lib/modules"]["name"]]["hostPath"]["path"] == "/lib/modules"


def test_not_privileged_only_the_capabilities_needed(pod, main):
    for c in all_containers(pod):
        sc = c.get("securityContext", {})
        assert sc.get("privileged") is not True, c["name"]
        assert sc["allowPrivilegeEscalation"] is False, c["name"]
        assert sc["readOnlyRootFilesystem"] is True, c["name"]
        assert sc["capabilities"]["drop"] == ["ALL"], c["name"]
        assert set(sc["capabilities"]["add"]) <= {"NET_ADMIN", "SYS_MODULE"}, c["name"]
    assert main["securityContext"]["capabilities"]["add"] == ["NET_ADMIN"]
    assert pod["spec"].get("hostPID") is not True
    assert pod["spec"].get("hostIPC") is not True


def test_writable_paths_are_only_the_state_dir_tmp_and_host_sysctls(pod):
    vols = {v["name"]: v for v in pod["spec"]["volumes"]}
    writable = set()
    for c in all_containers(pod):
        for m in c.get("volumeMounts", []):
            assert m["name"] in vols, f"{c['name']} mounts undeclared volume {m['name']}"
            if not m.get("readOnly"):
                writable.add((c["name"], m["mountPath"]))
    assert writable == {
        ("ipvsctl", "/var/lib/ipvsctl"),
        ("ipvsctl", "/tmp"),
        ("node-prep", "/host/proc/sys/net"),
        # the one sysctl the daemon writes while running (1 around its own deletions)
        ("ipvsctl", "/host/proc/sys/net/ipv4/vs/expire_nodest_conn"),
    }
    (sysctl,) = [v for v in vols.values() if v["name"] == "host-expire-nodest-conn"]
    assert sysctl["hostPath"] == {
        "path": "/proc/sys/net/ipv4/vs/expire_nodest_conn",
        "type": "File",
    }


def test_resources_fit_the_memory_target(pod, main):
    res = main["resources"]
    assert set(res["requests"]) == {"cpu", "memory"}
    # The daemon targets < 250 MB at 10,000 Services: the limit leaves headroom above that.
    assert quantity(res["limits"]["memory"]) >= 256 * 2**20
    assert quantity(res["requests"]["memory"]) <= quantity(res["limits"]["memory"])
    for c in all_containers(pod):
        assert "memory" in c["resources"]["limits"], c["name"]


def test_headless_metrics_service_selects_the_pods(docs, pod):
    svc = one(docs, "Service")
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["ports"] == [
        {"name": "metrics", "port": PORT, "targetPort": "metrics", "protocol": "TCP"}
    ]
    for key, value in svc["spec"]["selector"].items():
        assert pod["metadata"]["labels"][key] == value
    ds = one(docs, "DaemonSet")
    assert ds["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()


# --- against shared/CONTRACT.md -----------------------------------------------------------


def test_args_use_only_real_flags(main):
    flags, _ = cli_run_options()
    assert main["args"][0] == "run"
    used = flags_in(main["args"])
    assert used, "no flags at all?"
    assert set(used) <= flags, f"`ipvsctl run` has no {sorted(set(used) - flags)}"


def test_env_uses_only_variables_the_daemon_reads(contract, main):
    _, contract_envs = contract_run_options(contract)
    _, envs = cli_run_options()
    assert {e["name"] for e in main["env"]} <= envs | contract_envs


def test_contract_still_names_the_paths_and_port(contract):
    for needle in ("/healthz", "/readyz", "/metrics", f"0.0.0.0:{PORT}", "/var/lib/ipvsctl"):
        assert needle in contract, needle


# --- against daemonset/Dockerfile ---------------------------------------------------------


def dockerfile():
    return (DAEMONSET_DIR / "Dockerfile").read_text()


def instruction(name):
    return [
        line.split(None, 1)[1]
        for line in dockerfile().splitlines()
        if line.upper().startswith(name + " ")
    ]


def test_dockerfile_entrypoint_and_base():
    assert [json.loads(x) for x in instruction("ENTRYPOINT")] == [["ipvsctl"]]
    assert [json.loads(x) for x in instruction("CMD")] == [["run"]]
    (base,) = instruction("FROM")
    assert base.removeprefix("docker.io/library/").startswith("python:3.11-slim")
    (user,) = instruction("USER")
    assert user not in ("0", "root")


def test_init_container_runs_the_script_the_image_ships(pod):
    (init,) = pod["spec"]["initContainers"]
    copies = [c.split() for c in instruction("COPY")]
    assert ["daemonset/node-prep.sh", init["command"][0]] in copies
    for c in all_containers(pod):
        assert c["image"] == pod["spec"]["containers"][0]["image"]


def test_dockerignore_sends_what_pip_install_needs():
    """A small .dockerignore matcher: last matching rule wins, as in Docker."""
    rules = []
    for line in (REPO / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            rules.append((line.startswith("!"), line.lstrip("!").rstrip("/")))

    def included(rel: str) -> bool:
        keep = True
        parts = rel.split("/")
        for negate, pattern in rules:
            matched = any(_glob(pattern, "/".join(parts[: i + 1])) for i in range(len(parts)))
            if matched:
                keep = negate
        return keep

    for needed in ["pyproject.toml", "README.md", "daemonset/node-prep.sh"]:
        assert included(needed), needed
    for py in (REPO / "ipvsctl").rglob("*.py"):
        if "__pycache__" not in py.parts:
            assert included(str(py.relative_to(REPO))), py
    for unwanted in [".git/HEAD", ".venv/bin/python", "tests/deploy/run.sh", "docs/install.md"]:
        assert not included(unwanted), unwanted


def _glob(pattern: str, path: str) -> bool:
    import fnmatch

    if pattern.startswith("**/"):
        return fnmatch.fnmatch(path.rsplit("/", 1)[-1], pattern[3:]) or fnmatch.fnmatch(
            path, pattern[3:]
        )
    return fnmatch.fnmatch(path, pattern) and path.count("/") == pattern.count("/")

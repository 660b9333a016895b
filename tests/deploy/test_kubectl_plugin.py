"""daemonset/kubectl-ipvsctl against a stand-in kubectl that records its calls."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import DAEMONSET_DIR, NAMESPACE, one, render

PLUGIN = DAEMONSET_DIR / "kubectl-ipvsctl"

# The stand-in: logs argv as JSON; `get pods` answers the pods listed in $PODS.
FAKE = """#!{python}
import json, os, sys
with open(os.environ["LOG"], "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
if "get" in sys.argv:
    sys.stdout.write(os.environ.get("PODS", ""))
"""


@pytest.fixture
def kubectl(tmp_path) -> Path:
    exe = tmp_path / "kubectl"
    exe.write_text(FAKE.format(python=sys.executable))
    exe.chmod(0o755)
    return exe


def plugin(
    kubectl: Path, *args: str, pods: str = ""
) -> tuple[subprocess.CompletedProcess, list[list[str]]]:
    log = kubectl.parent / "log"
    log.write_text("")
    r = subprocess.run(
        [str(PLUGIN), *args],
        capture_output=True,
        text=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
        env={"PATH": "/usr/bin:/bin", "KUBECTL": str(kubectl), "LOG": str(log), "PODS": pods},
    )
    return r, [json.loads(line) for line in log.read_text().splitlines()]


def test_execs_into_the_pod_on_that_node(kubectl):
    r, calls = plugin(
        kubectl, "status", "--node", "worker-2", "-o", "wide", pods="ipvsctl-abcde\nipvsctl-old\n"
    )
    assert r.returncode == 0, r.stderr
    get, exe = calls
    assert get[:2] == ["get", "pods"]
    assert get[get.index("--field-selector") + 1] == "spec.nodeName=worker-2,status.phase=Running"
    assert get[get.index("--namespace") + 1] == NAMESPACE
    assert exe[:2] == ["exec", "--stdin"] and "--tty" not in exe
    assert exe[exe.index("--container") + 1] == "ipvsctl"
    assert exe[exe.index("--") + 1 :] == ["ipvsctl", "status", "-o", "wide"]
    assert "ipvsctl-abcde" in exe


def test_selector_matches_the_daemonsets_pods(kubectl):
    """The default selector is the DaemonSet's own: a relabelled DaemonSet breaks this test."""
    _, (get, _) = plugin(kubectl, "--node=n1", pods="p\n")
    key, _, value = get[get.index("--selector") + 1].partition("=")
    ds = one(render(DAEMONSET_DIR), "DaemonSet", "ipvsctl")
    assert ds["spec"]["template"]["metadata"]["labels"][key] == value
    assert ds["spec"]["template"]["spec"]["containers"][0]["name"] == "ipvsctl"
    assert ds["metadata"]["namespace"] == NAMESPACE


def test_options_and_defaults(kubectl):
    r, calls = plugin(
        kubectl,
        "--context",
        "prod",
        "-n",
        "kube-system",
        "--node",
        "n1",
        "--",
        "plan",
        "-f",
        "-",
        "--node",
        "x",
        pods="p1\n",
    )
    assert r.returncode == 0, r.stderr
    get, exe = calls
    assert get[0] == "--context=prod" and exe[0] == "--context=prod"
    assert get[get.index("--namespace") + 1] == "kube-system"
    assert exe[exe.index("--") + 1 :] == ["ipvsctl", "plan", "-f", "-", "--node", "x"]
    _, (_, exe) = plugin(kubectl, "--node", "n1", pods="p1\n")
    assert exe[exe.index("--") + 1 :] == ["ipvsctl", "status"]
    _, (_, exe) = plugin(kubectl, "--node", "n1", "status", "--help", pods="p1\n")
    assert exe[-1] == "--help"  # after a command, --help is ipvsctl's


def test_errors(kubectl):
    r, calls = plugin(kubectl, "status")
    assert r.returncode == 2 and "--node" in r.stderr and calls == []
    r, calls = plugin(kubectl, "status", "--node", "n9")
    assert r.returncode == 1 and "no running pod" in r.stderr and "n9" in r.stderr
    assert len(calls) == 1  # no exec
    r, _ = plugin(kubectl, "--node")
    assert r.returncode == 2 and "needs a value" in r.stderr
    r, calls = plugin(kubectl, "--help")
    assert r.returncode == 0 and "kubectl ipvsctl status --node NODE" in r.stdout
    assert calls == [] and "set -euo" not in r.stdout

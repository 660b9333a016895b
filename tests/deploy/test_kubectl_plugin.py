"""daemonset/kubectl-ipvsctl against a stand-in kubectl that records its calls."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from .helpers import DAEMONSET_DIR, NAMESPACE, one, overlay_with, render

PLUGIN = DAEMONSET_DIR / "kubectl-ipvsctl"

# The stand-in: logs argv as JSON; `get events.events.k8s.io` answers the Event list in
# $EVENTS; `get pods` answers, as the plugin's jsonpath asks ("NAMESPACE NAME" lines), the
# pods of $PODS ("namespace/name" words) in the namespace asked for (--namespace NS, or
# every one with --all-namespaces, which fails as RBAC would when $FORBID_ALL is set).
FAKE = """#!{python}
import json, os, sys
argv = sys.argv[1:]
with open(os.environ["LOG"], "a") as f:
    f.write(json.dumps(argv) + "\\n")
if "events.events.k8s.io" in argv:
    sys.stdout.write(os.environ.get("EVENTS", ""))
elif "get" in argv:
    if "--all-namespaces" in argv:
        if os.environ.get("FORBID_ALL"):
            sys.stderr.write("Error from server (Forbidden): pods is forbidden\\n")
            sys.exit(1)
        want = None
    else:
        want = argv[argv.index("--namespace") + 1]
    for pod in os.environ.get("PODS", "").split():
        ns, name = pod.split("/")
        if want in (None, ns):
            sys.stdout.write(ns + " " + name + "\\n")
"""


@pytest.fixture
def kubectl(tmp_path) -> Path:
    exe = tmp_path / "kubectl"
    exe.write_text(FAKE.format(python=sys.executable))
    exe.chmod(0o755)
    return exe


def plugin(
    kubectl: Path, *args: str, pods: str = "", events: str = "", **env: str
) -> tuple[subprocess.CompletedProcess, list[list[str]]]:
    log = kubectl.parent / "log"
    log.write_text("")
    r = subprocess.run(
        [str(PLUGIN), *args],
        capture_output=True,
        text=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
        env={
            "PATH": "/usr/bin:/bin",
            "KUBECTL": str(kubectl),
            "LOG": str(log),
            "PODS": pods,
            "EVENTS": events,
            **env,
        },
    )
    return r, [json.loads(line) for line in log.read_text().splitlines()]


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


@pytest.mark.parametrize("namespace", [NAMESPACE, "kube-system"])
def test_execs_into_the_pod_on_that_node_in_whichever_namespace_it_runs(kubectl, namespace):
    r, calls = plugin(
        kubectl,
        "status",
        "--node",
        "worker-2",
        "-o",
        "wide",
        pods=f"{namespace}/ipvsctl-abcde {namespace}/ipvsctl-old",
    )
    assert r.returncode == 0, r.stderr
    get, exe = calls
    assert get[:2] == ["get", "pods"] and "--all-namespaces" in get
    assert flag(get, "--field-selector") == "spec.nodeName=worker-2,status.phase=Running"
    assert exe[:2] == ["exec", "--stdin"] and "--tty" not in exe
    assert flag(exe, "--namespace") == namespace
    assert flag(exe, "--container") == "ipvsctl"
    assert exe[exe.index("--") + 1 :] == ["ipvsctl", "status", "-o", "wide"]
    assert "ipvsctl-abcde" in exe


@pytest.mark.parametrize("components", [(), ("kube-proxy-takeover",)], ids=["base", "takeover"])
def test_selector_matches_the_daemonsets_pods(kubectl, components):
    """The default selector is the DaemonSet's own, in both shipped namespaces: a relabelled
    DaemonSet breaks this test."""
    _, (get, _) = plugin(kubectl, "--node=n1", pods="kube-system/p")
    ds = one(render(overlay_with(*components)), "DaemonSet", "ipvsctl")
    labels = ds["spec"]["template"]["metadata"]["labels"]
    for pair in flag(get, "--selector").split(","):
        key, _, value = pair.partition("=")
        assert labels[key] == value, pair
    assert ds["spec"]["template"]["spec"]["containers"][0]["name"] == "ipvsctl"
    assert ds["metadata"]["namespace"] in ("ipvsctl-system", "kube-system")


def test_without_the_right_to_list_every_namespace_the_shipped_ones_are_tried(kubectl):
    r, calls = plugin(kubectl, "--node", "n1", pods="kube-system/ipvsctl-x", FORBID_ALL="1")
    assert r.returncode == 0, r.stderr
    *gets, exe = calls
    assert [flag(g, "--namespace") for g in gets[1:]] == [NAMESPACE, "kube-system"]
    assert flag(exe, "--namespace") == "kube-system" and "ipvsctl-x" in exe
    r, calls = plugin(kubectl, "--node", "n1", FORBID_ALL="1")
    assert r.returncode == 1
    assert "in namespace ipvsctl-system or kube-system" in r.stderr, r.stderr


def test_daemons_in_two_namespaces_on_one_node_ask_for_one(kubectl):
    r, calls = plugin(kubectl, "--node", "n1", pods="kube-system/a ipvsctl-system/b")
    assert r.returncode == 1 and len(calls) == 1
    assert "ipvsctl-system,kube-system" in r.stderr and "-n" in r.stderr
    r, (_, exe) = plugin(
        kubectl, "-n", "kube-system", "--node", "n1", pods="kube-system/a ipvsctl-system/b"
    )
    assert r.returncode == 0 and flag(exe, "--namespace") == "kube-system" and "a" in exe


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
        pods="kube-system/p1",
    )
    assert r.returncode == 0, r.stderr
    get, exe = calls
    assert get[0] == "--context=prod" and exe[0] == "--context=prod"
    assert flag(get, "--namespace") == "kube-system" and "--all-namespaces" not in get
    assert exe[exe.index("--") + 1 :] == ["ipvsctl", "plan", "-f", "-", "--node", "x"]
    _, (_, exe) = plugin(kubectl, "--node", "n1", pods=f"{NAMESPACE}/p1")
    assert exe[exe.index("--") + 1 :] == ["ipvsctl", "status"]
    _, (_, exe) = plugin(kubectl, "--node", "n1", "status", "--help", pods=f"{NAMESPACE}/p1")
    assert exe[-1] == "--help"  # after a command, --help is ipvsctl's
    _, (get, exe) = plugin(kubectl, "--node", "n1", pods="x/p1", IPVSCTL_NAMESPACE="x")
    assert flag(get, "--namespace") == "x" and flag(exe, "--namespace") == "x"


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


# --- kubectl ipvsctl drains: the Events ipvsctl writes, as the writer writes them ---------


def recorded(spec, age: float, count: int = 1) -> dict:
    """An Event exactly as kube/events.py sends it, `age` seconds old."""
    from ipvsctl.kube.events import event_body
    from ipvsctl.plan.events import Write, event_name

    now = time.time()
    w = Write(
        True, event_name(spec.regarding.name, now - age), spec, now - age - 5, count, now - age
    )
    return event_body(w, "ipvsctl-node-b")


def cluster_events() -> str:
    from ipvsctl.model import (
        ConnectionsCut,
        PodRef,
        Protocol,
        RealServerKey,
        ServiceKey,
        ServiceRef,
    )
    from ipvsctl.plan.events import connections_cut, quiesce_outcome

    cut = ConnectionsCut(
        PodRef("shop", "web-1", "u1"),
        ServiceRef("shop", "web"),
        ServiceKey(Protocol.TCP, "10.96.0.10", 80),
        RealServerKey("10.244.1.5", 8080),
        3,
        30.0,
    )
    items = [
        recorded(connections_cut(cut, 1, "node-b"), age=3000, count=2),
        recorded(quiesce_outcome(PodRef("shop", "web-2"), quiesced=True, nodes=3, seconds=1.2), 20),
        recorded(
            quiesce_outcome(
                PodRef("blog", "wp-0"),
                quiesced=False,
                nodes=3,
                seconds=25,
                still_sending=["10.0.0.7"],
                established=2,
            ),
            age=40,
        ),
        {  # someone else's Event: never listed
            "metadata": {"name": "web-3.1", "namespace": "shop"},
            "reason": "Scheduled",
            "reportingController": "default-scheduler",
            "eventTime": recorded(
                quiesce_outcome(PodRef("shop", "x"), quiesced=True, nodes=1, seconds=1), 1
            )["eventTime"],
            "regarding": {"kind": "Pod", "namespace": "shop", "name": "web-3"},
            "note": "Successfully assigned",
        },
    ]
    return json.dumps({"kind": "EventList", "apiVersion": "events.k8s.io/v1", "items": items})


def test_drains_lists_cuts_and_barrier_outcomes_in_a_table(kubectl):
    r, calls = plugin(kubectl, "drains", events=cluster_events())
    assert r.returncode == 0, r.stderr
    (get,) = calls  # one list of Events, no exec into any daemon
    assert get[:2] == ["get", "events.events.k8s.io"] and "--all-namespaces" in get
    lines = r.stdout.splitlines()
    assert lines[0].split() == [
        "LAST",
        "SEEN",
        "NAMESPACE",
        "POD",
        "REASON",
        "FROM",
        "COUNT",
        "MESSAGE",
    ]
    rows = [line.split(None, 6) for line in lines[1:]]
    assert [(row[1], row[2], row[3], row[5]) for row in rows] == [
        ("shop", "web-1", "ConnectionsCut", "2"),  # oldest first
        ("blog", "wp-0", "QuiesceTimeout", "1"),
        ("shop", "web-2", "Quiesced", "1"),
    ]
    assert "3 established connections cut through node node-b" in lines[1]
    assert "still sending: 10.0.0.7" in lines[2]
    assert "Scheduled" not in r.stdout


def test_drains_namespace_since_and_outputs(kubectl):
    r, (get,) = plugin(kubectl, "drains", "-n", "shop", "--since", "10m", events=cluster_events())
    assert r.returncode == 0, r.stderr
    assert get[get.index("--namespace") + 1] == "shop"
    lines = r.stdout.splitlines()
    assert "NAMESPACE" not in lines[0] and len(lines) == 3  # the 50-minute-old cut is out
    r, _ = plugin(kubectl, "drains", "--since=1h", "-o", "json", events=cluster_events())
    doc = json.loads(r.stdout)
    assert [e["reason"] for e in doc["items"]] == ["ConnectionsCut", "QuiesceTimeout", "Quiesced"]
    events = cluster_events()
    as_yaml = yaml.safe_load(plugin(kubectl, "drains", "-o", "yaml", events=events)[0].stdout)
    as_json = json.loads(plugin(kubectl, "drains", "-o", "json", events=events)[0].stdout)
    assert as_yaml == as_json and len(as_json["items"]) == 3


def test_drains_with_nothing_to_show_and_errors(kubectl):
    r, _ = plugin(kubectl, "drains", "--since", "1s", events=cluster_events())
    assert r.returncode == 0 and r.stdout == "" and "No drain events found" in r.stderr
    r, _ = plugin(kubectl, "drains", "-o", "yaml", "--since", "1s", events=cluster_events())
    assert yaml.safe_load(r.stdout)["items"] == []
    r, calls = plugin(kubectl, "drains", "--since", "soon", events=cluster_events())
    assert r.returncode == 2 and "--since soon" in r.stderr
    r, calls = plugin(kubectl, "drains", "-o", "wide")
    assert r.returncode == 2 and calls == []
    r, _ = plugin(kubectl, "drains", events="<html>proxy error</html>")
    assert r.returncode == 2 and "did not answer JSON" in r.stderr

"""A stand-in kubectl over a simulated cluster, for running the migration guides' node-by-node
blocks as a script would (tests/deploy/test_deploy_runbook.py).

The cluster is a JSON file (`STANDIN_STATE`): nodes with labels, DaemonSets with the node
selector and node affinity of the real manifests (rendered by the real kubectl) and their
timing, Pods created from a template, and a clock. Time moves one second per kubectl call and
by the seconds of `sleep` (a stub that calls this file). A DaemonSet's pod appears on a node
`create` seconds after the node's labels start to select it (the controller's reaction: a
`kubectl wait` in between finds no pod), is Ready `ready` seconds later, and is gone `delete`
seconds after the labels stop selecting it (its graceful termination).

`kubectl wait` behaves as kubectl's own (staging/src/k8s.io/kubectl/pkg/cmd/wait/wait.go):
with no matching object it fails at once ("no matching resources found", exit 1), except
`--for=delete`, which then succeeds; otherwise it blocks until the condition or the timeout.
Any command this stand-in does not know fails loudly (exit 99): the guides may only use what
it models.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

State = dict[str, Any]


def load() -> State:
    return json.loads(Path(os.environ["STANDIN_STATE"]).read_text())


def save(state: State) -> None:
    Path(os.environ["STANDIN_STATE"]).write_text(json.dumps(state, indent=1))


def fail(message: str, code: int = 1) -> None:
    sys.stderr.write(message + "\n")
    sys.exit(code)


def term_matches(term: dict[str, Any], labels: dict[str, str]) -> bool:
    for e in term.get("matchExpressions", []):
        key, op, values = e["key"], e["operator"], e.get("values", [])
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
    return True


def selects(ds: dict[str, Any], labels: dict[str, str]) -> bool:
    """The DaemonSet's nodeSelector and required node affinity, as the scheduler reads them."""
    if any(labels.get(k) != v for k, v in ds.get("nodeSelector", {}).items()):
        return False
    terms = ds.get("nodeSelectorTerms")
    return not terms or any(term_matches(t, labels) for t in terms)


def label_selected(selector: str, labels: dict[str, str]) -> bool:
    for part in selector.split(","):
        key, _, value = part.partition("=")
        if labels.get(key) != value:
            return False
    return True


def reconcile(state: State) -> None:
    """Each DaemonSet's pod on each node, as of the clock."""
    now = state["clock"]
    for ds in state["daemonsets"]:
        for node, info in state["nodes"].items():
            key = f"{ds['namespace']}/{ds['name']}/{node}"
            track = state["tracks"].setdefault(key, {"wanted": None, "since": -1e9, "gen": 0})
            wanted = selects(ds, info["labels"])
            if track["wanted"] is None:  # as the cluster was before the script: settled
                track.update(wanted=wanted, gen=1 if wanted else 0)
            elif wanted != track["wanted"]:
                track.update(wanted=wanted, since=now, gen=track["gen"] + (1 if wanted else 0))
            name = f"{ds['name']}-{node}-{track['gen']}"
            pods = state["pods"]
            existing = next((p for p in pods if p["name"] == name), None)
            if wanted and existing is None and now >= track["since"] + ds["create"]:
                pods.append(
                    {
                        "namespace": ds["namespace"],
                        "name": name,
                        "labels": ds["podLabels"],
                        "node": node,
                        "readyAt": track["since"] + ds["create"] + ds["ready"],
                        "owner": ds["name"],
                    }
                )
            if not wanted and existing and now >= track["since"] + ds["delete"]:
                pods.remove(existing)
    for pod in state["pods"]:
        pod["ready"] = now >= pod["readyAt"]


def option(argv: list[str], *names: str) -> str | None:
    for i, a in enumerate(argv):
        for n in names:
            if a == n and i + 1 < len(argv):
                return argv[i + 1]
            if a.startswith(n + "="):
                return a.split("=", 1)[1]
    return None


def seconds(text: str) -> int:
    m = re.fullmatch(r"(\d+)([smh]?)", text)
    if not m:
        fail(f"stand-in: --timeout {text}", 99)
    assert m is not None
    return int(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[m.group(2)]


def matching(state: State, argv: list[str]) -> list[dict[str, Any]]:
    ns = option(argv, "-n", "--namespace") or "default"
    target = next((a for a in argv if a.startswith("pod/")), None)
    selector = option(argv, "-l", "--selector")
    field = option(argv, "--field-selector")
    node = field.removeprefix("spec.nodeName=") if field else None
    if field and field == node:
        fail(f"stand-in: --field-selector {field}", 99)
    found = []
    for p in state["pods"]:
        if p["namespace"] != ns:
            continue
        if target and p["name"] != target.removeprefix("pod/"):
            continue
        if selector is not None and not label_selected(selector, p["labels"]):
            continue
        if node is not None and p["node"] != node:
            continue
        found.append(p)
    return found


def wait(state: State, argv: list[str]) -> None:
    condition = option(argv, "--for")
    timeout = seconds(option(argv, "--timeout") or "30s")
    deadline = state["clock"] + timeout
    while True:
        reconcile(state)
        pods = matching(state, argv)
        if condition == "delete":
            if not pods:
                return
        elif not pods:
            fail("error: no matching resources found")
        elif condition == "condition=Ready":
            if all(p["ready"] for p in pods):
                return
        elif condition == "jsonpath={.status.phase}=Succeeded":
            if all(p.get("phase") == "Succeeded" for p in pods):
                return
        else:
            fail(f"stand-in: --for={condition}", 99)
        if state["clock"] >= deadline:
            save(state)
            fail(f"error: timed out waiting for the condition on pods ({condition})")
        state["clock"] += 1


def main(argv: list[str]) -> None:
    state = load()
    state["log"].append(argv)
    if argv[:1] == ["__sleep"]:
        state["clock"] += int(float(argv[1]))
        reconcile(state)
        save(state)
        return
    state["clock"] += 1
    reconcile(state)
    verb = next((a for a in argv if not a.startswith("-") and a not in _values(argv)), "")
    try:
        run(state, verb, argv)
    finally:
        save(state)


def _values(argv: list[str]) -> set[str]:
    """The arguments that are values of options (-n NS, -l SEL...), not the verb."""
    out = set()
    for i, a in enumerate(argv[:-1]):
        if a in ("-n", "--namespace", "-l", "--selector", "--field-selector", "-o", "--output"):
            out.add(argv[i + 1])
    return out


def run(state: State, verb: str, argv: list[str]) -> None:
    if verb == "label":
        node, change = argv[argv.index("node") + 1], argv[argv.index("node") + 2]
        labels = state["nodes"][node]["labels"]
        if change.endswith("-"):
            labels.pop(change[:-1], None)
        else:
            key, value = change.split("=", 1)
            if key in labels and labels[key] != value and "--overwrite" not in argv:
                fail(f"error: '{key}' already has a value ({labels[key]}), --overwrite is false")
            labels[key] = value
        reconcile(state)
    elif verb == "wait":
        wait(state, argv)
    elif verb == "get" and "pod" in argv and option(argv, "-o", "--output") == "name":
        sys.stdout.write("".join(f"pod/{p['name']}\n" for p in matching(state, argv)))
    elif verb == "get" and "--raw" in argv:
        url = option(argv, "--raw") or ""
        m = re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods/([^/:]+):9796/proxy/metrics", url)
        if not m or not any((p["namespace"], p["name"]) == m.groups() for p in state["pods"]):
            fail(f"Error from server (NotFound): {url}")
        sys.stdout.write(state["metrics"])
    elif verb == "get" and "daemonset" in argv:
        ds = next(d for d in state["daemonsets"] if d["name"] == argv[argv.index("daemonset") + 1])
        sys.stdout.write(ds["image"])
    elif verb == "create" and option(argv, "-f") == "-":
        create(state, argv)
    elif verb == "logs":
        (pod,) = matching(state, argv)
        sys.stdout.write(pod.get("logs", ""))
    elif verb == "delete" and any(a.startswith("pod/") for a in argv):
        for pod in matching(state, argv):
            state["pods"].remove(pod)
    elif verb == "ipvsctl":  # the kubectl-ipvsctl plugin
        node = option(argv, "--node")
        if node is not None and not any(
            p["node"] == node and p.get("owner") == "ipvsctl" and p["ready"] for p in state["pods"]
        ):
            fail(f"kubectl-ipvsctl: no running pod on node {node}")
    else:
        fail(f"stand-in kubectl: not modelled: {argv}", 99)


def create(state: State, argv: list[str]) -> None:
    import yaml

    doc = yaml.safe_load(sys.stdin.read())
    ns = option(argv, "-n", "--namespace") or "default"
    text = json.dumps(doc)
    if "NODE_NAME" in text or '"IMAGE"' in text:
        fail(f"error: placeholders left in the manifest: {text}")
    spec = doc["spec"]
    state["pods"].append(
        {
            "namespace": ns,
            "name": doc["metadata"]["name"],
            "labels": doc["metadata"].get("labels", {}),
            "node": spec["nodeName"],
            "readyAt": 1e18,
            "phase": "Succeeded",
            "image": spec["containers"][0]["image"],
            "args": spec["containers"][0]["args"],
            "logs": "cleanup (rollback) done: nftables table, drain queue state\n",
        }
    )
    state["created"].append(doc)


if __name__ == "__main__":
    main(sys.argv[1:])

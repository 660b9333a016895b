"""After `make cluster-lab`, on the host: the run's results.json into the compact
cluster-lab.json that `python -m bench.report` renders into docs/benchmarks.md ("Rollout
under load"), with where it ran: the guest's kernel and CPUs, the host's load before and
after the run, the commit.

    python -m clusterlab.publish --in out/cluster-lab

Only a complete run (every scenario, both modes, no error) is published; a part of one
(`CLUSTER_LAB_ARGS=...`) says so and leaves the table as it is.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from clusterlab.cluster import MODES
from clusterlab.report import prestops, udp_verdicts
from clusterlab.scenarios import SCENARIOS

KEEP_FAILURES = 20  # per scenario and mode: the first ones, with their times


def compact(doc: dict[str, Any], host_load: dict[str, str], commit: str) -> dict[str, Any]:
    rows: dict[str, dict[str, Any]] = {}
    for r in doc["results"]:
        row = rows.setdefault(r["scenario"], {"scenario": r["scenario"], "what": r["what"]})
        s = dict(r["summary"])
        s["failures"] = s["failures"][:KEEP_FAILURES]
        row[r["mode"]] = s
        row[f"{r['mode']}_seconds"] = r["duration"]
        if r["scenario"] == "slow-node":
            row[f"{r['mode']}_barrier"] = barrier_story(r)
        row[f"{r['mode']}_prestops"] = prestops(r["pods"])
        if s["udp_queries"]:
            row[f"{r['mode']}_udp"] = udp_verdicts(r["udp_failed"], r["expected_windows"])
        if r["scenario"] == "scale-zero" or r["expected_windows"]:
            row[f"{r['mode']}_expected_windows"] = r["expected_windows"]
    return {
        "machine": doc["machine"] | {"host_load": host_load, "commit": commit},
        "elapsed": doc["elapsed"],
        "rows": [rows[name] for name in SCENARIOS if name in rows],
    }


def barrier_story(r: dict[str, Any]) -> dict[str, Any]:
    """The held-back node in numbers: when its daemon was stopped and continued, when it
    started draining the pod, when the pod's preStop returned, and what the barrier waited
    for meanwhile."""
    notes = r["notes"]
    victim = next(p for p in r["pods"] if p["name"] == notes["victim"]["pod"])
    drained = [
        row["t"]
        for row in r["daemon_log"].get(notes["slow_node"], [])
        if row.get("msg") in ("drain started", "real server deleted")
        and str(row.get("rs", "")).startswith(victim["ip"] + ":")
    ]
    return {
        "slow_node": notes["slow_node"],
        "daemon_stopped": notes["daemon_stopped"],
        "pod_deleted": notes["pod_deleted"],
        "daemon_continued": notes["daemon_continued"],
        "slow_node_stopped_sending": min(drained) if drained else None,
        "prestop": [victim["prestop_start"], victim["prestop_end"]],
        "prestop_outcome": (victim.get("prestop_answer") or {}).get("outcome"),
        "sigterm": victim["sigterm"],
        "barrier": notes.get("barrier", []),
    }


def complete(doc: dict[str, Any]) -> str | None:
    """Why the run cannot be published, or None."""
    have = {(r["scenario"], r["mode"]) for r in doc["results"] if not r["error"]}
    missing = [f"{s}/{m}" for s in SCENARIOS for m in MODES if (s, m) not in have]
    return f"missing or failed: {', '.join(missing)}" if missing else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m clusterlab.publish", description=__doc__)
    p.add_argument("--in", dest="src", default="out/cluster-lab")
    args = p.parse_args(argv)
    src = Path(args.src)
    doc = json.loads((src / "results.json").read_text())
    why = complete(doc)
    if why:
        print(f"cluster-lab: a partial run, not published to docs/benchmarks.md ({why})")
        (src / "cluster-lab.json").unlink(missing_ok=True)
        return 0
    before = (
        (src / "host-load-before").read_text().split()[:3]
        if (src / "host-load-before").exists()
        else []
    )
    with open("/proc/loadavg") as f:
        after = f.read().split()[:3]
    # the commit the run ran (make wrote it before the boot): the tree may move meanwhile
    commit = (
        (src / "commit").read_text().strip()
        if (src / "commit").exists()
        else subprocess.run(
            ["git", "describe", "--always", "--dirty"], capture_output=True, text=True, check=False
        ).stdout.strip()
    )
    out = compact(doc, {"before": " ".join(before), "after": " ".join(after)}, commit)
    (src / "cluster-lab.json").write_text(json.dumps(out, indent=1) + "\n")
    print(f"cluster-lab: wrote {src / 'cluster-lab.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Run the cluster lab's scenarios inside the lab VM (`make cluster-lab`):

    python -m clusterlab [--scenarios all|NAME,...] [--modes ipvsctl,nodrain] [--out DIR]

Builds the cluster once (3 nodes, their `ipvsctl run` daemons, the API server, the load
balancer, the `web` Deployment), then runs every scenario with ipvsctl as shipped, then
restarts the daemons with draining off and runs them again. Writes DIR/results.json (every
record's summary, failures with their times, notes), DIR/report.txt (printed too) and
DIR/table.md (the "rollout under load" table of docs/benchmarks.md). Needs root and IPVS.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

MODULES = (
    "ip_vs", "ip_vs_rr", "dummy", "veth", "bridge", "nf_conntrack", "nf_conntrack_netlink",
    "nf_tables",
)  # fmt: skip


_T0 = time.monotonic()


def say(*parts: Any) -> None:
    print(f"cluster-lab: [{time.monotonic() - _T0:6.0f}s]", *parts, flush=True)


def render(results: list[dict[str, Any]]) -> str:
    from clusterlab.report import cell, render_failures, udp_verdicts

    out = []
    for r in results:
        s = r["summary"]
        out.append(f"== {r['scenario']} ({r['what']}), {r['mode']} ==")
        if r["error"]:
            out.append(f"  ERROR: {r['error']}")
        kinds = f": {s['failed_by_kind']}" if s["failed_by_kind"] else ""
        expected = (
            f"; {s['expected_failed']} more in the expected windows {r['expected_windows']}"
            if r["expected_windows"]
            else ""
        )
        out.append(f"  {s['requests']} requests, {s['failed']} failed{kinds}{expected}")
        out.append(
            f"  {s['streams']} streams ({s['cut_streams']} cut), {s['resets']} resets, "
            f"connect p99 {s['connect_p99_ms']} ms"
            + (
                f"; {s['udp_queries']} UDP queries ({s['udp_failed']} failed, longest stall "
                f"{s['udp_longest_stall']} s)"
                if s["udp_queries"]
                else ""
            )
            + f"; {r['duration']:.0f} s"
        )
        out.append(f"  row: {cell(s)}")
        out.append(f"  CPU seconds: {r['cpu']}")
        if s["failures"]:
            out.append("  failures:")
            out += render_failures(s["failures"])
        if r.get("udp_failed"):
            fate = udp_verdicts(r["udp_failed"], r["expected_windows"])
            out.append(
                f"  unanswered UDP queries: {fate['lost']} never reached a pod, {fate['late']} "
                f"answered late, {fate['unanswered']} reached a pod, no answer back"
            )
        for key, value in r["notes"].items():
            if key == "barrier":
                out.append("  barrier (the victim's sidecar /status while its preStop waited):")
                for b in value:
                    out.append(
                        f"    t={b['t']:7.2f}s stage={b['stage']} established={b['established']} "
                        f"waiting for {b['not_quiesced'] or 'nobody'}"
                    )
            elif key == "node_drain":
                out.append(
                    f"  node-drain --wait: exit {value['returncode']}, "
                    f"{value['started']} s -> {value['ended']} s"
                )
                out += [f"    t={t:7.2f}s {line}" for t, line in value["lines"][-6:]]
            else:
                out.append(f"  {key}: {value}")
        for p in r["pods"]:
            if p.get("prestop_answer"):
                a = p["prestop_answer"]
                out.append(
                    f"  preStop of {p['name']}: {p['prestop_start']} s -> {p['prestop_end']} s, "
                    f"{a.get('outcome')}: {a.get('message', a.get('error', ''))}"
                )
            if p.get("killed_connections"):
                out.append(
                    f"  {p['name']}: {p['killed_connections']} connections killed at SIGKILL"
                )
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    from clusterlab.scenarios import SCENARIOS

    p = argparse.ArgumentParser(
        prog="python -m clusterlab",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", default="out/cluster-lab")
    p.add_argument("--scenarios", default="all", help=f"all, or some of: {', '.join(SCENARIOS)}")
    p.add_argument("--modes", default="ipvsctl,nodrain")
    args = p.parse_args(argv)
    names = list(SCENARIOS) if args.scenarios == "all" else args.scenarios.split(",")
    modes = [m for m in args.modes.split(",") if m]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        sys.exit(f"cluster-lab: unknown scenarios {unknown}; known: {', '.join(SCENARIOS)}")
    if os.geteuid() != 0:
        sys.exit("cluster-lab: needs root and IPVS: run `make cluster-lab` (boots the lab VM)")
    for m in MODULES:
        subprocess.run(["modprobe", m], capture_output=True, check=False)
    if not Path("/proc/net/ip_vs").exists():
        sys.exit("cluster-lab: no IPVS in this kernel: run `make cluster-lab`")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    from clusterlab.cluster import Lab
    from clusterlab.report import markdown_table
    from clusterlab.scenarios import run_scenario

    started = time.monotonic()
    machine = {
        "kernel": platform.release(),
        "cpus": os.cpu_count(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }
    results: list[dict[str, Any]] = []
    lab = Lab(out)
    try:
        say(f"starting the cluster in mode {modes[0]} (three daemons: minutes in the VM)")
        lab.start(modes[0])
        say(f"cluster up after {time.monotonic() - started:.0f} s")
        for mode in modes:
            for name in names:
                t = time.monotonic()
                say(f"--- {name}, {mode}")
                result = run_scenario(lab, name, mode)
                results.append(result)
                s = result["summary"]
                say(
                    f"{name}, {mode}: failed {s['failed']}, resets {s['resets']}, cut streams "
                    f"{s['cut_streams']}, connect p99 {s['connect_p99_ms']} ms"
                    + (f", UDP failed {s['udp_failed']}" if s["udp_queries"] else "")
                    + f" ({time.monotonic() - t:.0f} s)"
                    + (f" ERROR {result['error']}" if result["error"] else "")
                )
                write(out, machine, results, started)
    finally:
        lab.close()
    text = render(results)
    (out / "report.txt").write_text(text + "\n")
    rows = []
    for name in names:
        row: dict[str, Any] = {"scenario": name}
        for r in results:
            if r["scenario"] == name:
                row[r["mode"]] = r["summary"]
        rows.append(row)
    (out / "table.md").write_text(markdown_table(rows) + "\n")
    print(text)
    print(markdown_table(rows))
    say(f"done in {time.monotonic() - started:.0f} s; {out}/report.txt, results.json, table.md")
    return 0


def write(
    out: Path, machine: dict[str, Any], results: list[dict[str, Any]], started: float
) -> None:
    with open("/proc/loadavg") as f:
        machine["loadavg_guest"] = f.read().split()[:3]
    doc = {"machine": machine, "elapsed": round(time.monotonic() - started, 1), "results": results}
    (out / "results.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")


if __name__ == "__main__":
    sys.exit(main())

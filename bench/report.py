"""Render docs/benchmarks.md and the plots from the benchmark JSON files.

    python -m bench.report [--in out/bench] [--no-copy]

Copies out/bench/{e2k,drain,rollout,memory,memory-vm}.json into bench/results/ (the numbers
the document shows, kept in git), draws bench/results/*.png, and writes docs/benchmarks.md:
bench/summary.md (the results against the targets, hand-written), the generated tables,
then bench/notes.md (method, profile findings, hot spots, caveats), both verbatim.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

from bench.common import REPO, RESULTS

PARTS = ("e2k", "e2k-repeat", "e2k-host", "drain", "rollout", "memory", "memory-vm")


def load(src: Path, copy: bool) -> dict[str, dict[str, Any]]:
    docs: dict[str, dict[str, Any]] = {}
    RESULTS.mkdir(parents=True, exist_ok=True)
    for part in PARTS:
        f = src / f"{part}.json"
        if not f.exists() and part == "e2k" and (src / "e2k.partial.json").exists():
            f = src / "e2k.partial.json"
        if copy and f.exists() and f.resolve() != (RESULTS / f"{part}.json").resolve():
            shutil.copyfile(f, RESULTS / f"{part}.json")
        g = RESULTS / f"{part}.json"
        if g.exists():
            docs[part] = json.loads(g.read_text())
    return docs


def fmt(x: Any, unit: str = "") -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        if x >= 1000:
            return f"{x:,.0f}{unit}"
        if x >= 10:
            return f"{x:.1f}{unit}"
        return f"{x:.2f}{unit}"
    if isinstance(x, int):
        return f"{x:,}{unit}"
    return f"{x}{unit}"


def machine_line(doc: dict[str, Any]) -> str:
    m = doc.get("machine", {})
    return (f"{m.get('where')}, kernel {m.get('kernel')}, {m.get('cpus')} vCPU "
            f"({m.get('cpu') or 'unknown CPU'}), {m.get('memory_mb')} MB, Python "
            f"{m.get('python')}, {m.get('date')}")


def e2k_tables(doc: dict[str, Any]) -> list[str]:
    sizes = sorted(doc["result"]["sizes"], key=lambda s: s["services"])
    out = ["| Services (real servers) | ipvsctl engine p50 / p99 | ipvsctl via the daemon loop "
           "p50 / p99 | baseline: change done p50 / p99 (mean) | baseline: full resync p50 | "
           "kernel calls per change (ipvsctl / baseline) | changes (ipvsctl / loop / "
           "baseline) | baseline p50 / ipvsctl p50 |",
           "|---|---|---|---|---|---|---|---|"]
    for s in sizes:
        e, lp, b = s.get("ipvsctl_engine", {}), s.get("ipvsctl_loop", {}), s.get("baseline", {})
        ratio = (b["p50"] / e["p50"]) if b.get("p50") and e.get("p50") else None
        out.append(
            f"| {s['services']:,} ({s['real_servers']:,}) | {fmt(e.get('p50'))} / "
            f"{fmt(e.get('p99'))} ms | {fmt(lp.get('p50'))} / {fmt(lp.get('p99'))} ms | "
            f"{fmt(b.get('p50'))} / {fmt(b.get('p99'))} ({fmt(b.get('mean'))}) ms | "
            f"{fmt((b.get('resync') or {}).get('p50'))} ms | "
            f"{fmt(e.get('netlink_calls_per_change'))} / "
            f"{fmt(b.get('netlink_calls_per_change'))} | {e.get('n', 0)} / {lp.get('n', 0)} / "
            f"{b.get('n', 0)} | {fmt(ratio)}x |")
    first, last = sizes[0].get("ipvsctl_engine", {}), sizes[-1].get("ipvsctl_engine", {})
    if first.get("p99") and last.get("p99"):
        out.append("")
        out.append(f"ipvsctl p99 at {sizes[-1]['services']:,} Services / p99 at "
                   f"{sizes[0]['services']:,}: **{last['p99'] / first['p99']:.2f}x** "
                   f"(target: within 1.5x); p50: {last['p50'] / first['p50']:.2f}x "
                   "(this table's rows only; see the summary at the top).")
    for s in sizes:
        if s["services"] == 3200 and s.get("baseline", {}).get("p50"):
            r = s["baseline"]["p50"] / s["ipvsctl_engine"]["p50"]
            out.append(f"At 3,200 Services the baseline takes **{r:,.0f}x** as long as "
                       "ipvsctl (p50 to p50; target: at least 100x).")
    out.append("")
    out.append("Initial sync (ipvsctl's Engine programming an empty kernel, one kernel call "
               "per virtual and real server):")
    out.append("")
    out.append("| Services | real servers | seconds | ops | per op |")
    out.append("|---|---|---|---|---|")
    for s in sizes:
        i = s.get("initial_sync", {})
        if i.get("primed"):
            out.append(f"| {s['services']:,} | {s['real_servers']:,} | not timed: table "
                       f"primed with the lean client in {fmt(i.get('prime_seconds'))} s | - | - |")
        elif "seconds" in i:
            per = i["seconds"] / i["ops"] * 1000 if i.get("ops") else None
            out.append(f"| {s['services']:,} | {s['real_servers']:,} | {fmt(i['seconds'])} | "
                       f"{i.get('ops')} | {fmt(per)} ms |")
    return out


def plot_e2k(doc: dict[str, Any], repeat: dict[str, Any] | None = None) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    sizes = sorted(doc["result"]["sizes"], key=lambda s: s["services"])
    xs = [s["services"] for s in sizes]
    fig, ax = plt.subplots(figsize=(11, 5))
    series = [("ipvsctl_engine", "ipvsctl (engine)", "#1b7837"),
              ("ipvsctl_loop", "ipvsctl (daemon loop, audit on)", "#5aae61"),
              ("baseline", "full resync (kube-router style): change done", "#b2182b")]
    for key, label, color in series:
        pts = [(s["services"], s[key]) for s in sizes if s.get(key, {}).get("p50")]
        if not pts:
            continue
        ax.plot([p[0] for p in pts], [p[1]["p50"] for p in pts], "o-", color=color,
                label=f"{label} p50")
        ax.plot([p[0] for p in pts], [p[1]["p99"] for p in pts], "s--", color=color,
                alpha=0.6, label=f"{label} p99")
    if repeat and "result" in repeat:
        pts = sorted((s["services"], s["ipvsctl_engine"]) for s in repeat["result"]["sizes"]
                     if s.get("ipvsctl_engine", {}).get("p99"))
        ax.plot([p[0] for p in pts], [p[1]["p99"] for p in pts], "^:", color="#00441b",
                label="ipvsctl (engine) p99, second boot")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(xs, [f"{x:,}" for x in xs])
    ax.set_xlabel("Services (10 endpoints each)")
    ax.set_ylabel("event to kernel (ms, log)")
    m = doc.get("machine", {})
    ax.set_title(f"Endpoint change to netlink change done ({m.get('where')}, kernel "
                 f"{m.get('kernel')})", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    path = RESULTS / "event_to_kernel.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return "../bench/results/event_to_kernel.png"


def render(docs: dict[str, dict[str, Any]]) -> str:
    lines = ["# Benchmarks", "",
             "Generated by `make bench` (`python -m bench.report`) from `bench/results/*.json`; "
             "the reading of the numbers (method, profiles, caveats) follows the tables and is "
             "kept in `bench/notes.md`. Benchmarks never fail a build; `make bench-smoke` runs "
             "the host parts at toy sizes (and `tests/unit/test_bench_smoke.py` runs that).",
             ""]
    summary_md = REPO / "bench" / "summary.md"
    if summary_md.exists():
        lines += [summary_md.read_text().rstrip(), ""]
    if "e2k" in docs:
        d = docs["e2k"]
        lines += ["## Event to kernel, ipvsctl vs a full resync", "",
                  f"Machine: {machine_line(d)}.", ""]
        if "error" in d:
            lines += [f"**This run failed part-way:** `{d['error']}`", ""]
        lines += e2k_tables(d)
        img = plot_e2k(d, docs.get("e2k-repeat"))
        if img:
            lines += ["", f"![event to kernel]({img})"]
        lines.append("")
        if "e2k-repeat" in docs and "result" in docs["e2k-repeat"]:
            rep = docs["e2k-repeat"]
            lines += ["Run to run: ipvsctl (engine) in the run above and in a second boot "
                      f"({machine_line(rep)}):", "",
                      "| Services | run 1 p50 / p99 | run 2 p50 / p99 |", "|---|---|---|"]
            first = {s["services"]: s.get("ipvsctl_engine", {}) for s in d["result"]["sizes"]}
            for s in sorted(rep["result"]["sizes"], key=lambda s: s["services"]):
                a, b = first.get(s["services"], {}), s.get("ipvsctl_engine", {})
                lines.append(f"| {s['services']:,} | {fmt(a.get('p50'))} / {fmt(a.get('p99'))} "
                             f"ms | {fmt(b.get('p50'))} / {fmt(b.get('p99'))} ms |")
            lines.append("")
    if "e2k-host" in docs and "result" in docs["e2k-host"]:
        d = docs["e2k-host"]
        lines += ["## The same on the host, in-memory kernel (no netlink)", "",
                  f"Machine: {machine_line(d)}.", "",
                  "The engine and the baseline on `FakeKernel`: what each costs in Python "
                  "alone, without the emulator's noise or netlink's price. Same changes, "
                  "more of them.", ""]
        lines += e2k_tables(d)
        lines.append("")
    if "drain" in docs and "result" in docs["drain"]:
        d = docs["drain"]
        r = d["result"]
        z = r["zero_to_deleted"]
        lines += ["## Drain: counts reach zero -> real server deleted", "",
                  f"Machine: {machine_line(d)}.", "",
                  f"{r['samples']} draining real servers, `--drain-check-interval "
                  f"{r['check_interval_s']:g}`: p50 {fmt(z.get('p50'))} ms, p90 "
                  f"{fmt(z.get('p90'))} ms, max {fmt(z.get('max'))} ms (target: within "
                  f"{r['target_s']:g} s).", "",
                  "| real server | counts 0 at | ipvsctl deleted at | gone from the kernel at "
                  "| reason |", "|---|---|---|---|---|"]
        for row in r["real_servers"]:
            lines.append(f"| {row['rs']} | {fmt(row['zero_at'])} s | {fmt(row['deleted_at'])} s "
                         f"| {fmt(row['kernel_gone_at'])} s | {row['reason']} |")
        lines.append("")
    if "rollout" in docs and "result" in docs["rollout"]:
        d = docs["rollout"]
        lines += ["## The rollout from `make demo`", "", f"Machine: {machine_line(d)}.", "",
                  "| draining | short requests sent | failed | long-lived connection breaks "
                  "(connections) | v1 real servers deleted (reason) |", "|---|---|---|---|---|"]
        for s in d["result"]["summary"]:
            reasons = ", ".join(f"{b['pod']} {b['reason']}" for b in s["backends"])
            lines.append(f"| {'on' if s['mode'] == 'drain' else 'off'} | {s['short_sent']} | "
                         f"{s['short_failed']} | {s['long_broken']} ({s['long_lived']}) | "
                         f"{reasons} |")
        lines.append("")
    for part, title in (("memory", "host, in-memory kernel"),
                        ("memory-vm", "lab VM, real kernel")):
        if part in docs and "result" in docs[part]:
            d = docs[part]
            r = d["result"]
            lines += [f"## Daemon memory and CPU ({title})", "",
                      f"Machine: {machine_line(d)}.", "",
                      f"`Daemon` + `KubeSource` + {r['kernel']}, following "
                      f"{r['services']:,} Services / {r['endpoints']:,} endpoints served by the "
                      "fake API server in another process: the list, then "
                      f"{r['watch_events']:,} EndpointSlice watch events.", "",
                      "| | value |", "|---|---|",
                      f"| time to ready (list -> kernel) | {fmt(r['time_to_ready_s'])} s |",
                      f"| RSS after the list | {fmt(r['rss_after_list_mb'])} MB |",
                      f"| **peak RSS** (VmHWM; target < 250 MB) | **{fmt(r['rss_peak_mb'])} MB** |",
                      f"| CPU time, list + initial sync | {fmt(r['cpu_after_list_s'])} s |",
                      f"| CPU time, {r['watch_events']:,} events | {fmt(r['cpu_events_s'])} s |",
                      f"| events applied / wall time | {r['events_applied']:,} in "
                      f"{fmt(r['events_seconds'])} s |"]
            if r.get("runs", 1) > 1:
                lines += [f"| runs (the table shows the one with the highest peak) | "
                          f"{r['runs']} |",
                          f"| peak RSS, every run | "
                          f"{', '.join(fmt(x) for x in r['rss_peak_runs_mb'])} MB |",
                          f"| RSS after the list, every run | "
                          f"{', '.join(fmt(x) for x in r['rss_after_list_runs_mb'])} MB |",
                          f"| CPU time in total, every run | "
                          f"{', '.join(fmt(x) for x in r['cpu_total_runs_s'])} s |"]
            lines.append("")
    notes = REPO / "bench" / "notes.md"
    if notes.exists():
        lines += [notes.read_text().rstrip(), ""]
    e = docs.get("e2k", {}).get("result", {}).get("sizes", [])
    profiles = [(s["services"], s[k], k) for s in e for k in
                ("ipvsctl_engine_profile", "baseline_profile") if s.get(k)]
    if profiles:
        lines += ["## Raw profiles (cProfile, cumulative, from this run)", ""]
        for n, text, k in profiles:
            what = "ipvsctl, 100 changes" if k.startswith("ipvsctl") else "baseline, one resync"
            lines += [f"{what} at {n:,} Services:", "", "```", text, "```", ""]
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.report")
    p.add_argument("--in", dest="src", default=str(REPO / "out" / "bench"))
    p.add_argument("--no-copy", action="store_true")
    args = p.parse_args(argv)
    docs = load(Path(args.src), not args.no_copy)
    out = REPO / "docs" / "benchmarks.md"
    out.write_text(render(docs))
    print(f"bench: wrote {out} from {sorted(docs)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

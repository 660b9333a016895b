"""Render docs/benchmarks.md and the plots from the benchmark JSON files.

    python -m bench.report [--in out/bench] [--no-copy]

Copies out/bench/{e2k,drain,rollout,memory,memory-vm}.json (and, with `--in
out/cluster-lab`, `make cluster-lab`'s cluster-lab.json) into bench/results/ (the numbers
the document shows, kept in git), draws bench/results/*.png, and writes docs/benchmarks.md:
bench/summary.md (the results against the targets, hand-written), the generated tables,
then bench/extra.md (the parts measured apart) and bench/method.md (how the numbers were
taken), all verbatim; bench/cluster-lab.md (what the published cluster-lab run's failures
were, hand-written with each run published) follows that run's table. bench/notes.md
(profiles along the way, hot spots found and fixed, the benchmark's own faults, older
runs) is for developers and stays out of the document.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

from bench.common import REPO, RESULTS

PARTS = (
    "e2k",
    "e2k-host",
    "restart-host",
    "change-host",
    "drain",
    "rollout",
    "cluster-lab",
    "memory",
    "memory-vm",
)


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
    return (
        f"{m.get('where')}, kernel {m.get('kernel')}, {m.get('cpus')} vCPU "
        f"({m.get('cpu') or 'unknown CPU'}), {m.get('memory_mb')} MB, Python "
        f"{m.get('python')}, {m.get('date')}"
        + (f", main at {m['commit']}" if m.get("commit") else "")
    )


def _pm(d: dict[str, Any] | None) -> str:
    d = d or {}
    return f"{fmt(d.get('p50'))} / {fmt(d.get('p99'))}"


def _x(r: Any) -> str:
    return "-" if r is None else f"{r:.1f}x"


def _load(s: dict[str, Any]) -> str:
    load = s.get("load_after_size") or s.get("load_before")
    return f"{load[0]:.1f}" if load else "-"


def daemon_table(doc: dict[str, Any]) -> list[str]:
    """Event to kernel through the daemon, per size: every phase (ms)."""
    sizes = sorted(doc["result"]["sizes"], key=lambda s: s["services"])
    out = [
        "| Services (real servers) | one change, lock held: wall p50 / p99, CPU p50 | "
        "daemon idle p50 / p99 | during an audit p50 / p99 (p99 vs idle; target 2x) | "
        "N draining: p50 / p99 (p99 vs idle; target 2x) | drain reaction p50 / max "
        "(target 1,500) | burst of B: all done in, p50 / p99 | idle CPU, % of a core "
        "(loop steps/s) | load avg |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in sizes:
        d, e = s.get("daemon"), s.get("ipvsctl_engine", {})
        if not d:
            continue
        dr, b, c = d["drain_reaction"], d["burst"], d["idle_cpu"]
        out.append(
            f"| {s['services']:,} ({s['real_servers']:,}) | {_pm(e)}, "
            f"{fmt(e.get('cpu', {}).get('p50'))} | {_pm(d['idle'])} | {_pm(d['audit'])} "
            f"(**{_x(d['audit'].get('over_idle_p99'))}**) | N={d['draining']['draining']:,}: "
            f"{_pm(d['draining'])} (**{_x(d['draining'].get('over_idle_p99'))}**) | "
            f"{fmt(dr.get('p50'))} / **{fmt(dr.get('max'))}** | B={b['changes']:,}: "
            f"{fmt(b['all_done_s'] * 1000)}, {_pm(b)} | {fmt(c['cpu_pct_of_one_core'])} "
            f"({fmt(c['loop_steps_per_s'])}) | {_load(s)} |"
        )
    out += [
        "",
        "Changes per phase: "
        + ", ".join(
            f"{s['services']:,}: {s['daemon']['idle']['n']} idle / {s['daemon']['audit']['n']} "
            f"audit / {s['daemon']['draining']['n']} draining / "
            f"{s['daemon']['drain_reaction']['n']} reactions"
            for s in sizes
            if s.get("daemon")
        )
        + ".",
    ]
    return out


def table_rows(docs: list[dict[str, Any]]) -> list[str]:
    """Initial sync and restart rows from any e2k-like documents."""
    out = [
        "| where | Services (real servers) | how | /readyz after | kernel writes | "
        "yardstick, same run | ratio (target) |",
        "|---|---|---|---|---|---|---|",
    ]
    for doc in docs:
        where = "VM" if "VM" in doc.get("machine", {}).get("where", "") else "host"
        for s in sorted(doc["result"]["sizes"], key=lambda s: s["services"]):
            i, r = s.get("initial_sync"), s.get("restart")
            size = f"{s['services']:,} ({s['real_servers']:,})"
            if i:
                lean = i.get("lean_prime_seconds")
                out.append(
                    f"| {where} | {size} | initial sync from empty | {fmt(i['readyz_seconds'])} s"
                    f" | {i['kernel_writes']:,} | "
                    + (
                        f"lean client priming the same table: {fmt(lean)} s | "
                        f"**{fmt(i.get('over_lean'))}x** (2x) |"
                        if lean
                        else f"- (no lean client on the host: {fmt(i['per_write_ms'])} ms a write) "
                        "| - |"
                    )
                )
            if r:
                out.append(
                    f"| {where} | {size} | restart over the table | {fmt(r['readyz_seconds'])} s"
                    f" | **{r['kernel_writes']:,}** (0) | one full-table read through ipvsctl's "
                    f"adapter: {fmt(r['full_read_seconds'])} s | "
                    f"**{fmt(r['readyz_over_full_read'])}x** (10x) |"
                )
    return out


def baseline_table(doc: dict[str, Any]) -> list[str]:
    sizes = sorted(doc["result"]["sizes"], key=lambda s: s["services"])
    out = [
        "| Services | ipvsctl daemon idle p50 / p99 (ms) | kube-router style: change done "
        "p50 / p99 (n), full resync p50, calls per change | kube-proxy style: change done "
        "p50 / p99 (n), calls per change | kube-router p50 / ipvsctl p50 | kube-proxy "
        "p50 / ipvsctl p50 |",
        "|---|---|---|---|---|---|",
    ]
    for s in sizes:
        d = (s.get("daemon") or {}).get("idle", {})
        kr, kp = s.get("baseline"), s.get("baseline_kube_proxy")
        if not kr and not kp:
            continue

        def cell(b: dict[str, Any] | None, resync: bool) -> str:
            if not b:
                return "not run"
            flag = " **(time budget hit: fewer than 10)**" if b.get("stopped_by_budget") else ""
            rs = f", {fmt(b['resync'].get('p50'))} ms" if resync else ""
            return f"{_pm(b)} ms ({b['n']}{flag}){rs}, {b['netlink_calls_per_change']:,}"

        def ratio(b: dict[str, Any] | None, d: dict[str, Any] = d) -> str:
            return f"{b['p50'] / d['p50']:,.0f}x" if b and d.get("p50") else "-"

        out.append(
            f"| {s['services']:,} | {_pm(d)} | {cell(kr, True)} | {cell(kp, False)} | "
            f"{ratio(kr)} | {ratio(kp)} |"
        )
    return out


def profile_lines(doc: dict[str, Any], top: int = 6) -> list[str]:
    """What the sampler saw in the daemon's threads during the audit and draining phases,
    at the largest size."""
    sizes = [s for s in doc["result"]["sizes"] if s.get("daemon")]
    if not sizes:
        return []
    s = max(sizes, key=lambda s: s["services"])
    every = next(
        (
            p.get("every_ms", 5.0)
            for ph in ("audit", "draining")
            for p in (s["daemon"][ph].get("profile") or {}).values()
        ),
        5.0,
    )
    out = [
        f"Sampled stacks of the daemon's threads at {s['services']:,} Services, every "
        f"{every:g} ms (time shares; for busy samples, the share with each function on the "
        "stack):",
        "",
    ]
    for phase in ("idle", "audit", "draining", "drain_reaction", "burst", "idle_cpu"):
        prof = s["daemon"][phase].get("profile") or {}
        for thread, p in prof.items():
            state = ", ".join(f"{k} {v}%" for k, v in sorted(p["state_pct"].items()))
            top_fns = "; ".join(
                f"`{w}` {pct}%" for w, pct in list(p["busy_on_stack_pct"].items())[:top]
            )
            out.append(
                f"- {phase}, thread `{thread}` ({p['samples']} samples): {state}"
                + (f". Busy in: {top_fns}" if top_fns else "")
            )
    return [*out, ""]


def cluster_lab_section(d: dict[str, Any]) -> list[str]:
    """`make cluster-lab`'s table (clusterlab.publish wrote the file): per scenario, with
    ipvsctl as shipped and with draining off, and the held-back node's story."""
    from clusterlab.report import markdown_table

    m = d["machine"]
    load = m.get("host_load", {})
    lines = [
        "## Rollout under load (`make cluster-lab`)",
        "",
        f"Machine: lab VM (qemu TCG, software emulation) on this repository's 2-core host, "
        f"kernel {m['kernel']}, {m['cpus']} vCPU, started {m['started']}, commit "
        f"{m.get('commit') or '?'}; the whole run (boot excluded) took {d['elapsed']:.0f} s. "
        f"Host load average (1, 5, 15 min) before: {load.get('before') or '?'}, after: "
        f"{load.get('after') or '?'}; the guest's at the end: "
        f"{' '.join(m.get('loadavg_guest', [])) or '?'}.",
        "",
        "Three nodes (network namespaces in one VM), each running `ipvsctl run` as its "
        "DaemonSet would, one API server, a load balancer health-checking every node's "
        "`:10256/healthz`; short requests (1/s) and two 8 s streams at a time from a pod "
        "on every node, the same from outside through the load balancer (four streams); "
        "DNS-like UDP queries (8/s per node, failed after 2 s unanswered) for the UDP "
        "rollout. **ipvsctl** is as "
        "shipped, pods with the shutdown-manager's preStop; **draining off** is "
        "`--drain-timeout 0 --service-drain-timeout 0`, every Service annotated "
        '`ipvsctl.io/drain-timeout: "0"` (without it a terminating endpoint still drains '
        "for its pod's life) and no preStop. A cell is failed requests / resets / cut "
        "streams / connect p99; docs/demo.md says how each is counted and how to read a "
        "run. The connect p99 is the clients' view in an emulated guest whose one harness "
        "process runs every client and app: it measures the machine more than the proxy.",
        "",
        markdown_table(d["rows"]),
        "",
    ]
    for row in d["rows"]:
        notes = []
        for mode, label in (("ipvsctl", "ipvsctl"), ("nodrain", "draining off")):
            s = row.get(mode)
            if s is None:
                continue
            kinds = ", ".join(f"{k} {v}" for k, v in s["failed_by_kind"].items())
            cuts: dict[str, int] = {}
            for f in s["failures"]:
                if f["what"] == "cut stream":
                    cuts[f["kind"]] = cuts.get(f["kind"], 0) + 1
            parts = [
                f"{s['requests']} requests, {s['failed']} failed" + (f" ({kinds})" if kinds else "")
            ]
            if s["expected_failed"] or s["udp_expected_failed"]:
                windows = row.get(mode + "_expected_windows")
                parts.append(
                    f"{s['expected_failed'] + s['udp_expected_failed']} more while the "
                    f"Service had nothing to answer (windows {windows} s)"
                )
            shown = ", ".join(f"{k} {v}" for k, v in cuts.items())
            if cuts and sum(cuts.values()) < s["cut_streams"]:  # only the first failures kept
                shown = f"of those among the first {len(s['failures'])} failures kept: {shown}"
            parts.append(
                f"{s['streams']} streams, {s['cut_streams']} cut" + (f" ({shown})" if cuts else "")
            )
            if s["udp_queries"]:
                fate = row.get(mode + "_udp")
                parts.append(
                    f"{s['udp_queries']} UDP queries, {s['udp_failed']} unanswered"
                    + (
                        f" ({fate['lost']} never reached a pod, {fate['late']} answered after "
                        f"the client's timeout, {fate['unanswered']} reached a pod and got no "
                        "answer back)"
                        if fate and s["udp_failed"]
                        else ""
                    )
                    + f", longest stall {s['udp_longest_stall']:g} s"
                )
            stops = row.get(mode + "_prestops")
            if stops and (stops["drained"] or stops["timeout"]):
                parts.append(
                    f"preStops: {stops['drained']} drained, {stops['timeout']} at the "
                    f"shutdown-manager's timeout, longest {stops['longest_s']:g} s"
                )
            if stops and stops["killed"]:
                parts.append(f"{stops['killed']} connections open at SIGKILL")
            parts.append(f"{row.get(mode + '_seconds', 0):.0f} s")
            if mode == "ipvsctl" and s["failures"]:  # each one, where the claim is 0
                parts.append(
                    "what failed: "
                    + ", ".join(
                        f"{f['t']:.1f} s {f['client']} {f['what']} {f['kind']}"
                        for f in s["failures"]
                    )
                )
            notes.append(f"{label}: " + "; ".join(parts))
        lines.append(f"- **{row['scenario']}** ({row['what']}): " + ". ".join(notes) + ".")
    lines.append("")
    notes_md = REPO / "bench" / "cluster-lab.md"  # hand-written: this run read
    if notes_md.exists():
        lines += [notes_md.read_text().strip(), ""]
    story = d["rows"] and next(
        (r.get("ipvsctl_barrier") for r in d["rows"] if r.get("ipvsctl_barrier")), None
    )
    if story:
        lines += [
            f"The barrier waiting for a slow node (slow-node, ipvsctl; seconds since the "
            f"scenario began): {story['slow_node']}'s daemon stopped (SIGSTOP) at "
            f"{story['daemon_stopped']:.1f}, the pod deleted at {story['pod_deleted']:.1f} and "
            f"its preStop called at {story['prestop'][0]:.1f}; once the first round of "
            f"questions was answered, the barrier waited for {story['slow_node']} alone (its "
            "/status, sampled every 0.5 s, where it changed):",
            "",
        ]
        for b in story["barrier"]:
            waiting = ", ".join(f"{k} ({v})" for k, v in b["not_quiesced"].items()) or "nobody"
            lines.append(f"- {b['t']:.1f}: stage {b['stage']}, waiting for {waiting}")
        stopped = story["slow_node_stopped_sending"]
        lines += [
            "",
            f"The daemon continued (SIGCONT) at {story['daemon_continued']:.1f}, its node "
            f"stopped sending the pod new connections at "
            f"{'?' if stopped is None else f'{stopped:.1f}'}, the preStop returned at "
            f"{story['prestop'][1]:.1f} ({story['prestop_outcome']}) and SIGTERM followed at "
            f"{story['sigterm']:.1f}.",
            "",
        ]
    return lines


def render(docs: dict[str, dict[str, Any]]) -> str:
    lines = [
        "# Benchmarks",
        "",
        "Generated by `make bench` (`python -m bench.report`) from `bench/results/*.json`; "
        "how the numbers were taken follows the tables. The development notes (profiles "
        "along the way, the hot spots found and fixed, the benchmark's own faults) are in "
        "`bench/notes.md`. Benchmarks never fail a build on their timings; `make bench-smoke` "
        "runs the host parts at toy sizes (and `tests/unit/test_bench_smoke.py` runs that). "
        "Two memory guards do fail it: `plan` of a 10,000-Service cluster's dump within "
        "300 MB (`tests/unit/test_plan_memory.py`) and the daemon at 10,000 Services within "
        "170 MB (`tests/unit/test_daemon_memory.py`), each a fresh process's peak RSS.",
        "",
    ]
    summary_md = REPO / "bench" / "summary.md"
    if summary_md.exists():
        lines += [summary_md.read_text().rstrip(), ""]
    for part, title in (
        ("e2k", "lab VM, real kernel (ratios only: software emulation)"),
        ("e2k-host", "host, in-memory kernel, writes packed as over netlink (absolute)"),
    ):
        if part not in docs or "result" not in docs[part]:
            continue
        d = docs[part]
        lines += [
            f"## Event to kernel through the daemon ({title})",
            "",
            f"Machine: {machine_line(d)}.",
            "",
        ]
        if "error" in d:
            lines += [f"**This run failed part-way:** `{d['error']}`", ""]
        lines += [*daemon_table(d), ""]
        lines += ["### Against the baselines (same table, same run)", ""]
        lines += [*baseline_table(d), ""]
        lines += profile_lines(d)
    if "change-host" in docs and "result" in docs["change-host"]:
        d = docs["change-host"]
        lines += [
            "## One change's cost on the host (in-memory kernel, each write packed, sent "
            "and acknowledged as over netlink)",
            "",
            f"Machine: {machine_line(d)}.",
            "",
            "| Services | wall p50 / p99 (ms) | CPU p50 / p99 (ms) | changes |",
            "|---|---|---|---|",
        ]
        for s in d["result"]["sizes"]:
            e = s["ipvsctl_engine"]
            lines.append(f"| {s['services']:,} | {_pm(e)} | {_pm(e['cpu'])} | {e['n']:,} |")
        lines.append("")
    tables = [
        docs[p] for p in ("e2k", "e2k-host", "restart-host") if p in docs and "result" in docs[p]
    ]
    if tables:
        lines += ["## Initial sync and restart to ready", "", *table_rows(tables), ""]
    if "drain" in docs and "result" in docs["drain"]:
        d = docs["drain"]
        r = d["result"]
        if "closed_to_deleted" in r:  # since 2026-11-25: from the last connection's close
            z = r["closed_to_deleted"]
            title, since = "last connection closed -> real server deleted", "closed at"
        else:
            z = r["zero_to_deleted"]
            title, since = "counts reach zero -> real server deleted", "counts 0 at"
        lines += [
            f"## Drain with real connections: {title}",
            "",
            f"Machine: {machine_line(d)}.",
            "",
            f"{r['samples']} draining real servers, `--drain-check-interval "
            f"{r['check_interval_s']:g}`: p50 {fmt(z.get('p50'))} ms, p90 "
            f"{fmt(z.get('p90'))} ms, max {fmt(z.get('max'))} ms (target: within "
            f"{r['target_s']:g} s).",
            "",
            f"| real server | {since} | counts 0 at | ipvsctl deleted at | gone from "
            "the kernel at | reason |",
            "|---|---|---|---|---|---|",
        ]
        for row in r["real_servers"]:
            lines.append(
                f"| {row['rs']} | {fmt(row.get('closed_at', row['zero_at']))} s | "
                f"{fmt(row['zero_at'])} s | {fmt(row['deleted_at'])} s "
                f"| {fmt(row['kernel_gone_at'])} s | {row['reason']} |"
            )
        lines.append("")
    if "rollout" in docs and "result" in docs["rollout"]:
        d = docs["rollout"]
        lines += [
            "## The rollout from `make demo`",
            "",
            f"Machine: {machine_line(d)}.",
            "",
            "| draining | short requests sent | failed | long-lived connection breaks "
            "(connections) | v1 real servers deleted (reason) |",
            "|---|---|---|---|---|",
        ]
        for s in d["result"]["summary"]:
            reasons = ", ".join(f"{b['pod']} {b['reason']}" for b in s["backends"])
            lines.append(
                f"| {'on' if s['mode'] == 'drain' else 'off'} | {s['short_sent']} | "
                f"{s['short_failed']} | {s['long_broken']} ({s['long_lived']}) | "
                f"{reasons} |"
            )
        lines.append("")
    if "cluster-lab" in docs:
        lines += cluster_lab_section(docs["cluster-lab"])
    for part, title in (("memory", "host, in-memory kernel"), ("memory-vm", "lab VM, real kernel")):
        if part in docs and "result" in docs[part]:
            d = docs[part]
            r = d["result"]
            lines += [
                f"## Daemon memory and CPU ({title})",
                "",
                f"Machine: {machine_line(d)}.",
                "",
                f"`Daemon` + `KubeSource` + {r['kernel']}, following "
                f"{r['services']:,} Services / {r['endpoints']:,} endpoints served by the "
                "fake API server in another process: the list, then "
                f"{r['watch_events']:,} EndpointSlice watch events.",
                "",
                "| | value |",
                "|---|---|",
                f"| time to ready (list -> kernel) | {fmt(r['time_to_ready_s'])} s |",
                f"| RSS after the list | {fmt(r['rss_after_list_mb'])} MB |",
                f"| **peak RSS** (VmHWM; target <= 150 MB) | **{fmt(r['rss_peak_mb'])} MB** |",
                f"| CPU time, list + initial sync | {fmt(r['cpu_after_list_s'])} s |",
                f"| CPU time, {r['watch_events']:,} events | {fmt(r['cpu_events_s'])} s |",
                f"| events applied / wall time | {r['events_applied']:,} in "
                f"{fmt(r['events_seconds'])} s |",
            ]
            if "events_merged_in_backlog" in r:
                lines.append(
                    "| updates merged into a waiting one of the same slice (a pair that "
                    f"ends where it began reaches no kernel) | {r['events_merged_in_backlog']:,} |"
                )
            if r.get("runs", 1) > 1:
                lines += [
                    f"| runs (the table shows the one with the highest peak) | {r['runs']} |",
                    f"| peak RSS, every run | "
                    f"{', '.join(fmt(x) for x in r['rss_peak_runs_mb'])} MB |",
                    f"| RSS after the list, every run | "
                    f"{', '.join(fmt(x) for x in r['rss_after_list_runs_mb'])} MB |",
                    f"| CPU time in total, every run | "
                    f"{', '.join(fmt(x) for x in r['cpu_total_runs_s'])} s |",
                ]
            lines.append("")
    for part in ("extra.md", "method.md"):
        f = REPO / "bench" / part
        if f.exists():
            lines += [f.read_text().rstrip(), ""]
    profiles = [
        (part, s["services"], s[k], k)
        for part in ("e2k", "e2k-host", "change-host")
        for s in docs.get(part, {}).get("result", {}).get("sizes", [])
        for k in ("ipvsctl_engine_profile",)
        if s.get(k)
    ]
    for part in ("e2k", "e2k-host"):
        for s in docs.get(part, {}).get("result", {}).get("sizes", []):
            for k in ("baseline", "baseline_kube_proxy"):
                if (s.get(k) or {}).get("profile"):
                    profiles.append((part, s["services"], s[k]["profile"], k))
    if profiles:
        lines += ["## Raw profiles (cProfile, cumulative, from these runs)", ""]
        for part, n, text, k in profiles:
            what = {
                "ipvsctl_engine_profile": "ipvsctl, 100 changes",
                "baseline": "kube-router-style baseline, one resync",
                "baseline_kube_proxy": "kube-proxy-style baseline, one sync",
            }[k]
            lines += [f"{what} at {n:,} Services ({part}):", "", "```", text, "```", ""]
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

"""Run the benchmarks; each part writes one JSON file into --out.

    python -m bench.run vm    [--out out/bench] [--sizes ...] [--mode initial|restart]
                              [--parts e2k,drain,rollout] [--drain-only]
    python -m bench.run host  [--out out/bench] [--parts e2k,restart,memory]
    python -m bench.run smoke [--out out/bench-smoke]        (also BENCH_SMOKE=1)

`vm` runs inside the lab VM (`make bench` boots it): bench/event_to_kernel.py on the real
kernel (the table, the daemon's phases, both baselines), the drain reaction with real
connections, the demo's rollout. `host` runs the same on the in-memory kernel, the restart
over a 1,000 and a 10,000-Service table, and the memory/CPU benchmark. `smoke` runs every
host part at tiny sizes, in seconds (tests/unit/test_bench_smoke.py).

`--drain-only` keeps of the VM's e2k part the draining phase and the drain reaction (the
rows issue 32 worked on): 15 min at 10,000 on a loaded machine, most of it the table's
set-up and the daemon's restart. One read of 1,000 draining counts
by each path is `python -m bench.drain_read` (its docstring).

Scale (sizes, changes per phase, baseline samples and budgets, initial sync or restart per
size) is in VM_PLAN / HOST_PLAN below; see docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import REPO, log, machine, write_json
from bench.event_to_kernel import Plan

# per size: (how the table gets there, the plan); see bench/event_to_kernel.py
VM_PLAN: dict[int, tuple[str, Plan]] = {
    # 100 changes a phase: a p99 over 40 was the phase's maximum, one outlier from a 10x
    # swing in a ratio
    100: (
        "initial",
        Plan(
            engine_changes=200,
            loop_changes=100,
            baseline_changes=10,
            baseline_budget_s=120.0,
            idle_cpu_s=15.0,
        ),
    ),
    1000: (
        "initial",
        Plan(
            engine_changes=200,
            loop_changes=100,
            baseline_changes=10,
            baseline_budget_s=240.0,
            idle_cpu_s=15.0,
        ),
    ),
    3200: (
        "restart",
        Plan(
            engine_changes=200,
            loop_changes=30,
            baseline_changes=2,
            baseline_budget_s=240.0,
            idle_cpu_s=15.0,
        ),
    ),
    10000: (
        "restart",
        Plan(engine_changes=100, loop_changes=100, baseline_changes=0, idle_cpu_s=12.0),
    ),
}
HOST_PLAN: dict[int, tuple[str, Plan]] = {
    n: (
        "initial",
        Plan(
            engine_changes=2000,
            loop_changes=100,
            gap=0.2,
            baseline_changes=10,
            baseline_budget_s=600.0,
            idle_cpu_s=20.0,
        ),
    )
    for n in (100, 1000, 3200, 10000)
}
# The next scale (--sizes 50000): every daemon phase, no baselines (a full resync per change
# at 500,000 endpoints is minutes each).
HOST_PLAN[50000] = (
    "initial",
    Plan(engine_changes=2000, loop_changes=100, gap=0.2, baseline_changes=0, idle_cpu_s=20.0),
)
# restart over an existing table, nothing else (host part "restart")
RESTART_PLAN = Plan(phases=False, baseline_changes=0)
SMOKE_PLAN: dict[int, tuple[str, Plan]] = {
    50: (
        "initial",
        Plan(
            engine_changes=40,
            loop_changes=4,
            gap=0.02,
            draining=40,
            reactions=3,
            burst=30,
            idle_cpu_s=1.0,
            baseline_changes=2,
        ),
    ),
    300: (
        "restart",
        Plan(
            engine_changes=40,
            loop_changes=4,
            gap=0.02,
            draining=40,
            reactions=3,
            burst=30,
            idle_cpu_s=1.0,
            baseline_changes=2,
        ),
    ),
}


def _part(out: Path, name: str, fn: Callable[[], Any]) -> bool:
    """Run one part, write out/NAME.json; a failing part is recorded, never fatal."""
    log(f"--- {name}")
    t0 = time.monotonic()
    doc: dict[str, Any] = {"part": name, "machine": machine()}
    ok = True
    try:
        doc["result"] = fn()
    except Exception as exc:
        ok = False
        doc["error"] = f"{type(exc).__name__}: {exc}"
        doc["traceback"] = traceback.format_exc()
        log(f"{name} failed: {doc['error']}")
        traceback.print_exc()
    doc["seconds"] = round(time.monotonic() - t0, 1)
    doc["machine"]["load_after"] = os.getloadavg()
    write_json(out / f"{name}.json", doc)
    log(f"{name}: {doc['seconds']} s -> {out / (name + '.json')}")
    return ok


def e2k(
    name: str,
    sizes: list[int],
    plan: dict[int, tuple[str, Plan]],
    kernel: str,
    profile_size: int | None,
    out: Path,
    mode: str | None = None,
    only: Plan | None = None,
    endpoints: int = 10,
) -> dict[str, Any]:
    from bench.event_to_kernel import run_size

    results = []
    for n in sizes:
        m, p = plan.get(n, plan.get(-1, ("restart", Plan())))
        r = run_size(n, endpoints, kernel, only or p, mode=mode or m, profile=(n == profile_size))
        r["load_after_size"] = os.getloadavg()
        results.append(r)
        # written after every size: a long run that is cut short keeps what it measured
        write_json(
            out / f"{name}.partial.json",
            {"part": name, "machine": machine(), "result": {"sizes": results}},
        )
    return {"sizes": results, "kernel": kernel, "endpoints_per_service": endpoints}


def rollout(out: Path) -> dict[str, Any]:
    import argparse as ap

    from demo import rollout as demo

    args = ap.Namespace(
        rate=8.0,
        long=3,
        warmup=4.0,
        readiness_delay=1.5,
        pre_stop=5.0,
        grace=30.0,
        long_until=25.0,
        load_until=30.0,
    )
    docs = [demo.run_mode(m, args) for m in ("drain", "nodrain")]
    # the summary only; the full timeline is the demo's business (out/demo/)
    return {"summary": [demo.mode_summary(d) for d in docs], "settings": docs[0]["settings"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.run",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("where", choices=("vm", "host", "smoke"))
    p.add_argument("--out", default=None)
    p.add_argument("--sizes", default=None, help="comma-separated Service counts")
    p.add_argument(
        "--mode",
        choices=("initial", "restart"),
        default=None,
        help="how every size's table gets there (default: per size, see VM_PLAN)",
    )
    p.add_argument(
        "--parts",
        default=None,
        help="vm: e2k,drain,rollout[,memory] (default the first three); "
        "host: e2k,restart,memory,change,status (default e2k,restart,memory)",
    )
    p.add_argument(
        "--table-only",
        action="store_true",
        help="vm e2k: the table only (initial sync or restart, timed), no phases "
        "or baselines; a size given twice runs twice",
    )
    p.add_argument(
        "--no-baselines",
        action="store_true",
        help="vm e2k: the daemon's phases without the two baselines",
    )
    p.add_argument(
        "--drain-only",
        action="store_true",
        help="vm e2k: of the daemon's phases only draining and the drain reaction (no "
        "idle, audit, burst or idle CPU phases, no baselines, 20 changes' cost)",
    )
    p.add_argument(
        "--endpoints-per-service",
        type=int,
        default=10,
        help="vm e2k: ready endpoints per Service (5000 x 50: the 250,000-endpoint row)",
    )
    p.add_argument("--memory-services", type=int, default=10000)
    p.add_argument("--memory-events", type=int, default=10000)
    p.add_argument("--memory-repeat", type=int, default=3)
    p.add_argument(
        "--memory-trace",
        action="store_true",
        help="host memory: one more run with tracemalloc in the daemon (where the memory "
        "goes, by file, line and type; bench/memprofile.py), written to memory-trace.json",
    )
    p.add_argument(
        "--status-events", type=int, default=3000, help="host part status: watch events per run"
    )
    p.add_argument(
        "--status-rate", type=float, default=100.0, help="host part status: watch events per second"
    )
    args = p.parse_args(argv)
    where = "smoke" if os.environ.get("BENCH_SMOKE") == "1" else args.where
    out = Path(args.out or (REPO / "out" / ("bench-smoke" if where == "smoke" else "bench")))
    out.mkdir(parents=True, exist_ok=True)
    ok = True
    if where == "vm":
        from bench.kernels import load_modules

        load_modules()
        sizes = [int(s) for s in (args.sizes or "100,1000,10000").split(",")]
        parts = (args.parts or "e2k,drain,rollout").split(",")
        if "e2k" in parts:
            plan = VM_PLAN
            if args.no_baselines:
                plan = {
                    n: (mode, dataclasses.replace(size_plan, baseline_changes=0))
                    for n, (mode, size_plan) in VM_PLAN.items()
                }
            if args.drain_only:
                # -1: a size VM_PLAN does not name (44,000): restarted over the lean
                # client's table, as 10,000 is
                plan = {
                    n: (
                        mode,
                        dataclasses.replace(
                            size_plan, baseline_changes=0, engine_changes=20, drain_only=True
                        ),
                    )
                    for n, (mode, size_plan) in {**VM_PLAN, -1: VM_PLAN[10000]}.items()
                }
            ok &= _part(
                out,
                "e2k",
                lambda: e2k(
                    "e2k",
                    sizes,
                    plan,
                    "netlink",
                    1000,
                    out,
                    mode=args.mode,
                    only=RESTART_PLAN if args.table_only else None,
                    endpoints=args.endpoints_per_service,
                ),
            )
        if "drain" in parts:
            from bench.drain import run_drain

            ok &= _part(out, "drain", run_drain)
        if "rollout" in parts:
            ok &= _part(out, "rollout", lambda: rollout(out))
        if "memory" in parts:  # the daemon on the real kernel (slow under emulation)
            from bench.kernels import Netns
            from bench.memory import run_memory

            def mem() -> dict[str, Any]:
                ns = Netns("benchmem")
                try:
                    return run_memory(args.memory_services, 10, args.memory_events, ns.name)
                finally:
                    ns.close()

            ok &= _part(out, "memory-vm", mem)
    elif where == "host":
        from bench.memory import run_memory

        host_parts = (args.parts or "e2k,restart,memory").split(",")
        host_sizes = [int(x) for x in (args.sizes or "100,1000,3200,10000").split(",")]
        if "e2k" in host_parts:
            ok &= _part(
                out,
                "e2k-host",
                lambda: e2k("e2k-host", host_sizes, HOST_PLAN, "packed", None, out, mode=args.mode),
            )
        # one change's cost only: quick, after a merge; --sizes 10000,50000 for the next
        # scale (the initial sync is timed too)
        if "change" in host_parts:
            ok &= _part(
                out,
                "change-host",
                lambda: e2k(
                    "change-host",
                    [int(x) for x in (args.sizes or "1000,10000").split(",")],
                    {},
                    "packed",
                    10000,
                    out,
                    mode="initial",
                    only=Plan(engine_changes=2000, loop_changes=0, baseline_changes=0),
                ),
            )
        if "restart" in host_parts:
            ok &= _part(
                out,
                "restart-host",
                lambda: e2k(
                    "restart-host",
                    [1000, 10000],
                    {},
                    "packed",
                    None,
                    out,
                    mode="restart",
                    only=RESTART_PLAN,
                ),
            )

        def mem_host() -> dict[str, Any]:
            runs = [
                run_memory(args.memory_services, 10, args.memory_events)
                for _ in range(args.memory_repeat)
            ]
            out = dict(max(runs, key=lambda r: r["rss_peak_mb"]))  # the worst run
            out["runs"] = len(runs)
            out["rss_peak_runs_mb"] = [r["rss_peak_mb"] for r in runs]
            out["rss_after_list_runs_mb"] = [r["rss_after_list_mb"] for r in runs]
            out["cpu_total_runs_s"] = [r["cpu_total_s"] for r in runs]
            out["cpu_events_runs_s"] = [r["cpu_events_s"] for r in runs]
            return out

        if "memory" in host_parts:
            if args.memory_repeat > 0:
                ok &= _part(out, "memory", mem_host)
            if args.memory_trace:
                ok &= _part(
                    out,
                    "memory-trace",
                    lambda: run_memory(
                        args.memory_services, 10, args.memory_events, trace=True, timeout=7200
                    ),
                )

        def status_host() -> dict[str, Any]:
            # Paced events (latency, not queueing), without and with 4 /status pollers.
            runs = {
                f"clients_{c}": run_memory(
                    args.memory_services,
                    10,
                    args.status_events,
                    rate=args.status_rate,
                    status_clients=c,
                )
                for c in (0, 4)
            }
            a, b = runs["clients_0"], runs["clients_4"]
            return runs | {
                "p99_ratio": round(
                    b["event_to_kernel_ms"]["p99"] / a["event_to_kernel_ms"]["p99"], 2
                ),
                "rss_peak_delta_mb": round(b["rss_peak_mb"] - a["rss_peak_mb"], 1),
            }

        if "status" in host_parts:
            ok &= _part(out, "status-host", status_host)
    else:
        from bench.memory import run_memory

        sizes = [int(s) for s in (args.sizes or "50,300").split(",")]
        ok &= _part(out, "e2k", lambda: e2k("e2k", sizes, SMOKE_PLAN, "fake", sizes[-1], out))
        ok &= _part(out, "memory", lambda: run_memory(300, 10, 300))
    log("done" if ok else "done, with failures (see the JSON files)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

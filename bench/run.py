"""Run the benchmarks; each part writes one JSON file into --out.

    python -m bench.run vm    [--out out/bench] [--sizes ...] [--parts e2k,drain,rollout]
    python -m bench.run host  [--out out/bench] [--parts e2k,memory] [--memory-services 10000]
    python -m bench.run smoke [--out out/bench-smoke]        (also BENCH_SMOKE=1)

`vm` runs inside the lab VM (`make bench` boots it): event to kernel for ipvsctl and the
full-resync baseline on the real kernel, initial sync, drain reaction, the demo's rollout.
`host` runs the memory/CPU benchmark with the in-memory kernel. `smoke` runs every part that
needs no VM at tiny sizes on the in-memory kernel, in seconds (tests/unit/test_bench_smoke.py).

Scale (sizes, number of changes per size, which sizes get a real initial sync) is chosen so
a full `make bench` fits in a couple of hours of software emulation; see docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import REPO, log, machine, write_json

# per size: (ipvsctl changes, loop changes, loop budget s, baseline changes)
VM_PLAN: dict[int, tuple[int, int, float, int]] = {
    100: (400, 40, 60.0, 10),
    1000: (400, 30, 90.0, 4),
    3200: (400, 20, 120.0, 2),
    10000: (400, 12, 180.0, 1),
}
HOST_PLAN: dict[int, tuple[int, int, float, int]] = {
    100: (2000, 20, 10.0, 10),
    1000: (2000, 20, 10.0, 6),
    3200: (2000, 20, 10.0, 4),
    10000: (2000, 20, 10.0, 4),
}
SMOKE_PLAN: dict[int, tuple[int, int, float, int]] = {
    50: (40, 4, 5.0, 2),
    300: (40, 4, 5.0, 2),
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
    write_json(out / f"{name}.json", doc)
    log(f"{name}: {doc['seconds']} s -> {out / (name + '.json')}")
    return ok


def e2k(sizes: list[int], plan: dict[int, tuple[int, int, float, int]], kernel: str,
        real_initial: set[int], profile_size: int | None, out: Path) -> dict[str, Any]:
    from bench.event_to_kernel import run_size

    results = []
    for n in sizes:
        changes, loop_changes, budget, base = plan.get(n, (200, 10, 60.0, 2))
        r = run_size(n, 10, kernel, changes=changes, loop_changes=loop_changes,
                     loop_budget_s=budget, baseline_changes=base,
                     profile=(n == profile_size), real_initial=(n in real_initial))
        results.append(r)
        # written after every size: a long run that is cut short keeps what it measured
        write_json(out / "e2k.partial.json", {"part": "e2k", "machine": machine(),
                                              "result": {"sizes": results}})
    return {"sizes": results, "kernel": kernel, "endpoints_per_service": 10}


def rollout(out: Path) -> dict[str, Any]:
    import argparse as ap

    from demo import rollout as demo

    args = ap.Namespace(rate=8.0, long=3, warmup=4.0, readiness_delay=1.5, pre_stop=5.0,
                        grace=30.0, long_until=25.0, load_until=30.0)
    docs = [demo.run_mode(m, args) for m in ("drain", "nodrain")]
    # the summary only; the full timeline is the demo's business (out/demo/)
    return {"summary": [demo.mode_summary(d) for d in docs], "settings": docs[0]["settings"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("where", choices=("vm", "host", "smoke"))
    p.add_argument("--out", default=None)
    p.add_argument("--sizes", default=None, help="comma-separated Service counts")
    p.add_argument("--real-initial", default=None,
                   help="sizes whose initial sync is programmed by ipvsctl and timed "
                        "(others are primed with the lean client); default: all")
    p.add_argument("--parts", default=None,
                   help="vm: e2k,drain,rollout[,memory] (default the first three); "
                        "host: e2k,memory,status (default e2k,memory)")
    p.add_argument("--repeat-only", action="store_true",
                   help="e2k again, ipvsctl engine only (no loop, no baseline), written to "
                        "e2k-repeat.json: the spread between runs")
    p.add_argument("--memory-services", type=int, default=10000)
    p.add_argument("--memory-events", type=int, default=10000)
    p.add_argument("--memory-repeat", type=int, default=3)
    p.add_argument("--status-events", type=int, default=3000,
                   help="host part status: watch events per run")
    p.add_argument("--status-rate", type=float, default=100.0,
                   help="host part status: watch events per second")
    args = p.parse_args(argv)
    where = "smoke" if os.environ.get("BENCH_SMOKE") == "1" else args.where
    out = Path(args.out or (REPO / "out" / ("bench-smoke" if where == "smoke" else "bench")))
    out.mkdir(parents=True, exist_ok=True)
    ok = True
    if where == "vm":
        from bench.kernels import load_modules

        load_modules()
        sizes = [int(s) for s in (args.sizes or "100,1000,3200,10000").split(",")]
        real = ({int(s) for s in args.real_initial.split(",") if s} if args.real_initial
                is not None else set(sizes))
        parts = (args.parts or "e2k,drain,rollout").split(",")
        if args.repeat_only:
            plan = {n: (VM_PLAN.get(n, (400,))[0], 0, 0.0, 0) for n in sizes}
            ok &= _part(out, "e2k-repeat", lambda: e2k(sizes, plan, "netlink", real, None,
                                                       out))
            parts = []
        if "e2k" in parts:
            ok &= _part(out, "e2k", lambda: e2k(sizes, VM_PLAN, "netlink", real, 1000, out))
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

        host_parts = (args.parts or "e2k,memory").split(",")
        host_sizes = [int(x) for x in (args.sizes or "100,1000,3200,10000").split(",")]
        if "e2k" in host_parts:
            ok &= _part(out, "e2k-host", lambda: e2k(host_sizes, HOST_PLAN, "fake",
                                                     set(host_sizes), None, out))

        def mem_host() -> dict[str, Any]:
            runs = [run_memory(args.memory_services, 10, args.memory_events)
                    for _ in range(args.memory_repeat)]
            out = dict(max(runs, key=lambda r: r["rss_peak_mb"]))  # the worst run
            out["runs"] = len(runs)
            out["rss_peak_runs_mb"] = [r["rss_peak_mb"] for r in runs]
            out["rss_after_list_runs_mb"] = [r["rss_after_list_mb"] for r in runs]
            out["cpu_total_runs_s"] = [r["cpu_total_s"] for r in runs]
            out["cpu_events_runs_s"] = [r["cpu_events_s"] for r in runs]
            return out

        if "memory" in host_parts:
            ok &= _part(out, "memory", mem_host)

        def status_host() -> dict[str, Any]:
            # Paced events (latency, not queueing), without and with 4 /status pollers.
            runs = {f"clients_{c}": run_memory(args.memory_services, 10,
                                               args.status_events, rate=args.status_rate,
                                               status_clients=c)
                    for c in (0, 4)}
            a, b = runs["clients_0"], runs["clients_4"]
            return runs | {"p99_ratio": round(b["event_to_kernel_ms"]["p99"]
                                              / a["event_to_kernel_ms"]["p99"], 2),
                           "rss_peak_delta_mb": round(b["rss_peak_mb"] - a["rss_peak_mb"], 1)}

        if "status" in host_parts:
            ok &= _part(out, "status-host", status_host)
    else:
        from bench.memory import run_memory

        sizes = [int(s) for s in (args.sizes or "50,300").split(",")]
        ok &= _part(out, "e2k", lambda: e2k(sizes, SMOKE_PLAN, "fake", set(sizes),
                                            sizes[-1], out))
        ok &= _part(out, "memory", lambda: run_memory(300, 10, 300))
    log("done" if ok else "done, with failures (see the JSON files)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

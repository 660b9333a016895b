"""`ipvsctl plan` on a live cluster's dump: peak memory and time of `plan -f FILE --json`
(or `-f -` from a pipe) in its own process, as a user runs it.

    python -m bench.plan_memory [--services 10000] [--endpoints 10] [--runs 2] [--tree DIR]

The dumps (bench/plan_input.py) are written once into --cache. Each run is a fresh process
that reports its own peak RSS (VmHWM) and CPU; `--tree` runs another checkout's ipvsctl
(e.g. main's) on the same files, alternated with this one's, for a before/after in one
window. The machine's load (`uptime`) is recorded beside every run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.plan_input import write

_CHILD = r"""
import os, resource, sys, time
t0 = time.monotonic()
sys.argv = ["ipvsctl", "plan", "-f", sys.argv[1], "--node-name", "node-0", "--json"]
from ipvsctl.cli.app import main
try:
    main()
except SystemExit as exc:
    code = exc.code or 0
else:
    code = 0
u = resource.getrusage(resource.RUSAGE_SELF)
hwm = next(l for l in open("/proc/self/status") if l.startswith("VmHWM"))
sys.stderr.write(f"\nPLAN-REPORT {int(hwm.split()[1])} {time.monotonic() - t0:.3f} "
                 f"{u.ru_utime + u.ru_stime:.3f} {code}\n")
"""


def run_plan(path: Path, *, tree: Path | None = None, stdin: bool = False) -> dict[str, Any]:
    """One `plan` of `path` in a fresh process: peak RSS (MB), wall and CPU seconds, exit
    code, and its output's size. `tree`: the checkout whose ipvsctl runs (default this)."""
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    with open(os.devnull, "w") as out, open(path if stdin else os.devnull) as inp:
        proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD, "-" if stdin else str(path)],
            stdin=inp,
            stdout=out,
            stderr=subprocess.PIPE,
            env=env,
            cwd=str(tree) if tree is not None else None,
        )
        _, err = proc.communicate()
    lines = err.decode(errors="replace").splitlines()
    report = lines[-1].split()[1:] if lines and lines[-1].startswith("PLAN-REPORT") else []
    if proc.returncode != 0 or len(report) != 4:
        raise RuntimeError(f"plan failed ({proc.returncode}): {err.decode()[-500:]}")
    hwm_kb, wall, cpu, code = report
    return {
        "peak_rss_mb": round(int(hwm_kb) / 1024, 1),
        "wall_seconds": float(wall),
        "cpu_seconds": float(cpu),
        "exit_code": int(code),
        "stderr_lines": len(lines) - 2,
    }


def dumps(cache: Path, services: int, endpoints: int) -> dict[str, Path]:
    cache.mkdir(parents=True, exist_ok=True)
    out = {}
    for fmt in ("json", "yaml"):
        path = cache / f"cluster-{services}x{endpoints}.{fmt}"
        if not path.exists():
            tmp = path.with_suffix(".tmp" + path.suffix)
            write(tmp, services, endpoints)
            tmp.rename(path)
        out[fmt] = path
    return out


def _uptime() -> str:
    return Path("/proc/loadavg").read_text().split(" ", 3)[:3].__str__()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--services", type=int, default=10_000)
    p.add_argument("--endpoints", type=int, default=10, help="per Service")
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--tree", type=Path, help="another checkout to alternate with")
    p.add_argument("--cache", type=Path, default=Path("/tmp/ipvsctl-bench-plan"))
    p.add_argument("--out", type=Path)
    p.add_argument(
        "--inputs",
        default="json-file,json-stdin,yaml-file,yaml-stdin",
        help="which of json-file, json-stdin, yaml-file, yaml-stdin",
    )
    args = p.parse_args(argv)
    files = dumps(args.cache, args.services, args.endpoints)
    trees: list[tuple[str, Path | None]] = [("this", None)]
    if args.tree:
        trees.insert(0, ("other", args.tree))
    rows = []
    for n in range(args.runs):
        for fmt, how in (i.split("-") for i in args.inputs.split(",")):
            for label, tree in trees if n % 2 == 0 else trees[::-1]:
                load = _uptime()
                r = run_plan(files[fmt], tree=tree, stdin=how == "stdin")
                row = {"tree": label, "format": fmt, "input": how, "load_before": load, **r}
                row["load_after"] = _uptime()
                rows.append(row)
                print(json.dumps(row), flush=True)
    if args.out:
        args.out.write_text(
            json.dumps(
                {
                    "services": args.services,
                    "endpoints_per_service": args.endpoints,
                    "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "rows": rows,
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

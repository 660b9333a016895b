"""The daemon at the sizes IPVS users run (issue: 44,000 Services; 250,000 endpoints), on
the host's in-memory kernel, beside the 10,000 row: memory after the list and at the peak,
time to ready (first full list in the kernel, from an empty table), idle CPU, one change's
event-to-kernel latency (changes paced, so latency and not queueing).

    python -m bench.scale [--sizes 10000x10,44000x10,5000x50] [--events 2000] [--rate 50]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from bench.memory import run_memory


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="10000x10,44000x10,5000x50")
    p.add_argument("--events", type=int, default=2000)
    p.add_argument("--rate", type=float, default=50.0)
    p.add_argument("--idle", type=float, default=30.0)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    rows = []
    for size in args.sizes.split(","):
        services, endpoints = (int(x) for x in size.split("x"))
        before = _load()
        r = run_memory(
            services, endpoints, args.events, rate=args.rate, idle_seconds=args.idle, timeout=1800
        )
        r |= {"load_before": before, "load_after": _load(), "when": time.strftime("%H:%M:%S")}
        rows.append(r)
        print(json.dumps(r), flush=True)
        args.out.write_text(json.dumps({"rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

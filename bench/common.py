"""Small shared helpers: percentiles, where the numbers came from, result files."""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"


def smoke() -> bool:
    return os.environ.get("BENCH_SMOKE") == "1"


def percentile(values: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile (p in 0..100); None for no values."""
    if not values:
        return None
    s = sorted(values)
    k = max(0, min(len(s) - 1, math.ceil(p / 100 * len(s)) - 1))
    return s[k]


def summary(values: Sequence[float], scale: float = 1000.0) -> dict[str, Any]:
    """n, p50, p90, p99, max, mean (values in seconds, reported in ms by default)."""
    if not values:
        return {"n": 0}

    def r(x: float | None) -> float | None:
        return None if x is None else round(x * scale, 3)

    return {
        "n": len(values),
        "p50": r(percentile(values, 50)),
        "p90": r(percentile(values, 90)),
        "p99": r(percentile(values, 99)),
        "max": r(max(values)),
        "mean": r(statistics.fmean(values)),
    }


def machine() -> dict[str, Any]:
    """The machine and kernel the numbers came from."""
    from ipvsctl.daemon.wiring import SWITCH_INTERVAL

    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_kb = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem_kb = int(line.split()[1])
    except OSError:
        pass
    in_vm = os.environ.get("IPVSCTL_LAB") == "1"
    return {
        "where": "lab VM (qemu TCG, Debian kernel)" if in_vm else "host",
        "kernel": platform.release(),
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "memory_mb": mem_kb // 1024,
        "python": sys.version.split()[0],
        "kvm": os.environ.get("IPVSCTL_VM_KVM") == "1",
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "commit": _commit(),
        # the daemon's own (daemon/wiring.py) unless BENCH_SWITCH_INTERVAL overrides it
        "switch_interval": float(os.environ.get("BENCH_SWITCH_INTERVAL") or SWITCH_INTERVAL),
    }


def _commit() -> str:
    """The commit measured (+ "-dirty" with uncommitted changes to the code, not to the
    notes): results name their code."""
    try:
        head = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            [
                "git",
                "-C",
                str(REPO),
                "status",
                "--porcelain",
                "--",
                ":(glob)ipvsctl/**/*.py",
                ":(glob)bench/**/*.py",
            ],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""
    return head + ("-dirty" if dirty else "")


def write_json(path: Path, doc: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=False) + "\n")
    tmp.replace(path)
    return path


def log(*parts: Any) -> None:
    print("bench:", *parts, flush=True)

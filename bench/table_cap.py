"""A tenant filling the node's IPVS table: the daemon's initial sync and memory with and
without `--max-table-entries` (docs/benchmarks.md, "The node's table under a tenant").

    python -m bench.table_cap [--legit 10000] [--endpoints 10] [--attack 40] [--ports 1024]
                              [--pods 20] [--limits none,500000] [--rounds 2]
                              [--main DIR] [--out FILE]

The fake API server (its own process) serves `--legit` Services of `--endpoints` endpoints
(created in 2024) and the tenant's `--attack` Services of `--ports` ports (the
per-Service limit is 1,024) with `--pods` endpoints each (created in 2025). The daemon
(bench/daemon_proc.py: the real API source, the in-memory kernel) is started on it once
per limit and round, the variants alternated; each run reports the time from start to the
first full list in the kernel (`/readyz`), the daemon's peak RSS (the in-memory kernel's
table included: on a node that is the kernel's memory, not the daemon's), and what the
table holds. `none` is this tree with no limit in reach; `--main DIR` adds main's code (a
checkout at DIR) as a third variant.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench.common import REPO, log, machine, write_json

LEGIT_CREATED = "2024-01-01T00:00:00Z"
ATTACK_CREATED = "2025-06-01T00:00:00Z"


def objects(legit: int, endpoints: int, attack: int, ports: int, pods: int) -> Any:
    """The cluster's Services first, then the tenant's: a generator (one copy in memory)."""
    from devkit.fakeapi import objects as fo

    for obj in fo.cluster(legit, endpoints):
        obj["metadata"]["creationTimestamp"] = LEGIT_CREATED
        yield obj
    for i in range(attack):
        name, ns = f"amp-{i}", "tenant"
        svc = fo.service(
            name,
            ns,
            cluster_ip=f"10.97.{i // 250}.{i % 250 + 1}",
            ports=[(f"p{j}", 1000 + j, 8000 + j) for j in range(ports)],
        )
        svc["metadata"]["creationTimestamp"] = ATTACK_CREATED
        yield svc
        eps = [fo.endpoint(f"10.250.{i}.{k + 1}", namespace=ns) for k in range(pods)]
        yield fo.endpoint_slice(
            f"{name}-abcde", name, eps, ns, ports=[(f"p{j}", 8000 + j) for j in range(ports)]
        )


def api_main(argv: list[str]) -> int:
    """The fake API server's process: loads the objects, prints its URL, serves until
    stdin closes."""
    from devkit.fakeapi.server import FakeAPIServer

    legit, endpoints, attack, ports, pods = map(int, argv)
    api = FakeAPIServer(record_requests=False, bookmark_interval=30.0)
    api.add_many(objects(legit, endpoints, attack, ports, pods))
    api.start()
    print(api.url, flush=True)
    sys.stdin.read()
    api.stop()
    return 0


def _hwm_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM"):
            return int(line.split()[1]) / 1024
    return 0.0


def _metrics(port: int) -> dict[str, float]:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=600).read()
    out: dict[str, float] = {}
    for line in body.decode().splitlines():
        if line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name.startswith("ipvsctl_") and "{" not in line:
            out[name] = float(line.rsplit(" ", 1)[1])
        elif name == "ipvsctl_real_servers":
            out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def run_one(url: str, variant: str, limit: int | None, main_dir: str | None) -> dict[str, Any]:
    code = main_dir if variant == "main" else str(REPO)
    env = dict(os.environ, PYTHONPATH=code)
    cmd = [sys.executable, "-m", "bench.daemon_proc", "--apiserver", url]
    if limit is not None:
        cmd += ["--max-table-entries", str(limit)]
    t0 = time.monotonic()
    daemon = subprocess.Popen(
        cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=code
    )
    try:
        assert daemon.stdout
        port = int(daemon.stdout.readline().split()[1])
        ready = float(daemon.stdout.readline().split()[1])
        wall = time.monotonic() - t0
        rss = _hwm_mb(daemon.pid)
        m = _metrics(port)
    finally:
        if daemon.stdin:
            daemon.stdin.close()
        daemon.wait(120)
    return {
        "variant": variant,
        "limit": limit,
        "ready_s": round(ready, 2),
        "start_to_ready_s": round(wall, 2),
        "rss_peak_mb": round(rss, 1),
        "virtual_servers": int(m.get("ipvsctl_virtual_servers", 0)),
        "real_servers": int(m.get("ipvsctl_real_servers", 0)),
        "table_entries": int(m.get("ipvsctl_table_entries", -1)),
        "refused_services": int(m.get("ipvsctl_table_refused_services", -1)),
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["api"]:
        return api_main(argv[1:])
    p = argparse.ArgumentParser(prog="python -m bench.table_cap")
    p.add_argument("--legit", type=int, default=10_000)
    p.add_argument("--endpoints", type=int, default=10)
    p.add_argument("--attack", type=int, default=40)
    p.add_argument("--ports", type=int, default=1024)
    p.add_argument("--pods", type=int, default=20)
    p.add_argument("--limits", default="none,500000", help="none: no limit in reach")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--main", default=None, help="a checkout of main: its code as a variant")
    p.add_argument("--out", default=str(REPO / "bench" / "results" / "table-cap.json"))
    args = p.parse_args(argv)
    shape = [args.legit, args.endpoints, args.attack, args.ports, args.pods]
    api = subprocess.Popen(
        [sys.executable, "-m", "bench.table_cap", "api", *map(str, shape)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        cwd=REPO,
    )
    runs: list[dict[str, Any]] = []
    try:
        assert api.stdout
        url = api.stdout.readline().strip()
        variants: list[tuple[str, int | None]] = [
            ("this", 10**15 if x == "none" else int(x)) for x in args.limits.split(",")
        ]
        if args.main:
            variants.insert(0, ("main", None))
        for r in range(args.rounds):
            for variant, limit in variants if r % 2 == 0 else variants[::-1]:
                row = run_one(url, variant, limit, args.main)
                row["round"] = r
                row["load"] = os.getloadavg()[0]
                log("table_cap:", row)
                runs.append(row)
    finally:
        if api.stdin:
            api.stdin.close()
        api.wait(120)
    doc = {
        "machine": machine(),
        "shape": dict(zip(("legit", "endpoints", "attack", "ports", "pods"), shape, strict=True)),
        "runs": runs,
    }
    write_json(Path(args.out), doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

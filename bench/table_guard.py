"""The table guard at 10,000 Services: what its detection costs while nothing happens, and
how long a restore of the whole table takes after kube-proxy's cleanup.

    .venv/bin/python -m tests.lab.boot --out out/tableguard \\
        --run 'python -m bench.table_guard --services 10000'      (VM: the real kernel)
    .venv/bin/python -m bench.table_guard --host --services 10000  (host: in-memory kernel)

A throwaway namespace (VM) or the in-memory kernel (host) gets N virtual servers with E real
servers each, bound on kube-ipvs0 (VM), and an applied state that says the same. Then:
- idle: `--passes` guard passes (snapshot, read, apply: a get of one virtual server's real
  servers and one interface lookup, nothing to restore), the process CPU and wall per pass,
  and what that costs a core at the daemon's pace (one pass per 0.5 s);
- restore (VM): `ipvsadm -C`, `ip link del kube-ipvs0`, then one guard pass: its wall time,
  the table dumped after and compared with the one before. `--restores` times.
Writes table_guard.json to $IPVSCTL_LAB_OUT (or --out), with the machine and its load.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from bench.common import log, machine, write_json
from ipvsctl.model import Protocol, RealServerKey, ServiceKey, ServiceRef, VirtualServer
from ipvsctl.reconcile.applied import AppliedState
from ipvsctl.reconcile.clock import SystemClock
from ipvsctl.reconcile.paced import run_once
from ipvsctl.reconcile.table_guard import TableGuard

INTERVAL = 0.5  # daemon/features/table_guard.py


def _key(i: int) -> ServiceKey:
    return ServiceKey(Protocol.TCP, f"10.{96 + i // 65536}.{i // 256 % 256}.{i % 256}", 80)


def _rs(i: int, j: int) -> RealServerKey:
    return RealServerKey(f"10.{200 + j}.{i // 256 % 256}.{i % 256}", 8080)


def _idle(guard: TableGuard, passes: int) -> dict[str, Any]:
    c0, w0 = time.process_time(), time.perf_counter()
    for _ in range(passes):
        assert run_once(guard) is None  # nothing gone: nothing restored
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    return {
        "passes": passes,
        "cpu_per_pass_ms": round(cpu / passes * 1000, 4),
        "wall_per_pass_ms": round(wall / passes * 1000, 4),
        "core_fraction_at_0_5_s": round(cpu / passes / INTERVAL, 6),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--services", type=int, default=10000)
    p.add_argument("--endpoints", type=int, default=2, help="real servers per service")
    p.add_argument("--passes", type=int, default=2000)
    p.add_argument("--restores", type=int, default=3)
    p.add_argument("--host", action="store_true", help="the in-memory kernel (no IPVS here)")
    p.add_argument("--out", default=os.environ.get("IPVSCTL_LAB_OUT", "out/table_guard"))
    a = p.parse_args(argv)
    state = AppliedState(SystemClock())
    doc: dict[str, Any] = {
        "benchmark": "table_guard",
        "where": "host" if a.host else "vm",
        "services": a.services,
        "endpoints": a.endpoints,
        "machine": machine(),
    }
    ns: Any = None
    if a.host:
        from ipvsctl.kernel.fake import FakeKernel

        kernel: Any = FakeKernel()
        interface = None
    else:
        from bench.kernels import Netns, load_modules, netlink_kernel

        load_modules()
        ns = Netns("tableguard")
        kernel = netlink_kernel(ns.name)
        interface = kernel
    t0 = time.monotonic()
    for i in range(a.services):
        vs = VirtualServer(_key(i))
        weights = {_rs(i, j): (0 if j == 0 and i % 10 == 0 else 1) for j in range(a.endpoints)}
        kernel.add_virtual_server(vs, not a.host)
        for rs, w in weights.items():
            kernel.add_real_server(vs.key, rs, w)
        state.add(ServiceRef("bench", f"s{i}"), vs, not a.host, weights)
    doc["table_built_s"] = round(time.monotonic() - t0, 2)
    log(f"table: {a.services} x {a.endpoints} in {doc['table_built_s']}s")
    guard = TableGuard(kernel, state, interface=interface)
    doc["idle"] = _idle(guard, a.passes)
    log("idle", doc["idle"])
    if ns is not None:

        def table() -> str:
            return subprocess.run(
                ["ip", "netns", "exec", ns.name, "ipvsadm", "-Sn"],
                check=True,
                capture_output=True,
                text=True,
            ).stdout

        before = sorted(table().splitlines())
        restores = []
        for _ in range(a.restores):
            for cmd in (["ipvsadm", "-C"], ["ip", "link", "del", "kube-ipvs0"]):
                subprocess.run(["ip", "netns", "exec", ns.name, *cmd], check=True)
            w0 = time.perf_counter()
            done = run_once(guard)
            wall = time.perf_counter() - w0
            assert done is not None and not done.failed, done
            assert sorted(table().splitlines()) == before
            restores.append(round(wall, 3))
            log(f"restore: {wall:.3f}s", done)
        doc["restore_wall_s"] = restores
        ns.close()
    path = write_json(Path(a.out) / "table_guard.json", doc)
    log(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""One drain check's read of the draining real servers' counts, by each path, on the real
kernel (lab VM): where a read of 1,000 draining counts at 10,000 Services goes.

    .venv/bin/python -m tests.lab.boot --out out/drainread \\
        --run 'python -m bench.drain_read --services 10000 --draining 1000'

A throwaway namespace gets N virtual servers with E real servers each; one real server of
each of the first D virtual servers is set to weight 0 (draining). Then, interleaved,
`--repeat` times each:
- table: NetlinkKernel.read_real_servers (one /proc/net/ip_vs read, only the draining parsed);
- table_kernel: the same file read whole as bytes, nothing parsed (the kernel's part);
- dumps_each: list_real_servers per draining virtual server (every dest parsed, sorted);
- dumps: dump_real_servers, the drain check's batched dumps (only the draining parsed);
- dumps_all: the same, every dest parsed (what the address filter saves);
- syscalls: the bare exchange per dump (send + recv until NLMSG_DONE), nothing parsed;
plus a cProfile of dumps_each and dumps over 200 virtual servers, and whether a second dump
request on a socket whose dump is still running is refused (EBUSY). The three readings are
checked equal. Writes drain_read.json to $IPVSCTL_LAB_OUT (or --out).
"""

from __future__ import annotations

import argparse
import cProfile
import errno
import io
import os
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import log, machine, write_json
from bench.kernels import Netns, load_modules, netlink_kernel
from ipvsctl.kernel.netlink import wire
from ipvsctl.kernel.netns import run_in_netns
from ipvsctl.model import Protocol, RealServerKey, ServiceKey, VirtualServer


def _key(i: int) -> ServiceKey:
    return ServiceKey(Protocol.TCP, f"10.{96 + i // 65536}.{i // 256 % 256}.{i % 256}", 80)


def _rs(i: int, j: int) -> RealServerKey:
    return RealServerKey(f"10.{200 + j}.{i // 256 % 256}.{i % 256}", 8080)


def _profile(fn: Callable[[], Any]) -> str:
    prof = cProfile.Profile()
    prof.enable()
    fn()
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(14)
    return out.getvalue()


def _ebusy(kernel: Any, key: ServiceKey) -> str:
    """Two dump requests back to back on one socket, before reading either answer: what
    each got (its dests, and how it ended)."""
    ipvs = kernel._calls._ipvs()
    sock = ipvs.asyncore.socket
    payload = wire.dump_dests(key)[1]
    first = 0x7F000001
    for seq in (first, first + 1):
        sock.send(wire.message(ipvs.prid, (wire.FLAGS_DUMP, payload), seq))
    dests = {first: 0, first + 1: 0}
    ends: dict[int, str] = {}
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and len(ends) < 2:
        try:
            data = sock.recv(1 << 16)
        except BlockingIOError:
            time.sleep(0.01)
            continue
        for kind, _f, seq, msg in wire.split(data):
            if seq not in dests:
                continue
            if kind == wire.NLMSG_DONE:
                ends[seq] = "done"
            elif kind == wire.NLMSG_ERROR:
                code = wire.error_code(msg)
                ends[seq] = f"error {errno.errorcode.get(code, code)}" if code else "ack"
            else:
                dests[seq] += 1
    return "; ".join(
        f"request {seq - first + 1}: {dests[seq]} dests, {ends.get(seq, 'no end in 5 s')}"
        for seq in dests
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--services", type=int, default=10000)
    p.add_argument("--endpoints", type=int, default=10, help="real servers per service")
    p.add_argument("--draining", type=int, default=1000)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--out", default=os.environ.get("IPVSCTL_LAB_OUT", "out/drain_read"))
    a = p.parse_args(argv)
    load_modules()
    ns = Netns("drainread")
    kernel = netlink_kernel(ns.name)
    t0 = time.monotonic()
    for i in range(a.services):
        vs = VirtualServer(_key(i))
        kernel.add_virtual_server(vs, False)
        for j in range(a.endpoints):
            kernel.add_real_server(vs.key, _rs(i, j), 0 if (i < a.draining and j == 0) else 1)
    log(f"table: {a.services} x {a.endpoints} in {time.monotonic() - t0:.1f}s")
    keys = [_key(i) for i in range(a.draining)]
    only = {k: {_rs(i, 0)} for i, k in enumerate(keys)}
    ipvs = kernel._calls._ipvs()
    sock = ipvs.asyncore.socket
    payloads = [
        wire.message(ipvs.prid, wire.dump_dests(k), 0x7E000000 + n) for n, k in enumerate(keys)
    ]
    buf = bytearray(1 << 18)

    def syscalls() -> None:
        for msg in payloads:
            sock.send(msg)
            while True:
                try:
                    n = sock.recv_into(buf)
                except BlockingIOError:
                    continue
                if n >= 16 and buf[4] in (wire.NLMSG_DONE, wire.NLMSG_ERROR):
                    break

    def table_kernel() -> int:
        def read() -> int:
            with open("/proc/thread-self/net/ip_vs", "rb", buffering=0) as f:
                return sum(len(c) for c in iter(lambda: f.read(1 << 16), b""))

        return run_in_netns(ns.name, read)

    paths: dict[str, Callable[[], Any]] = {
        "table": lambda: kernel.read_real_servers(keys, only),
        "table_kernel": table_kernel,
        "dumps_each": lambda: {k: kernel.list_real_servers(k) for k in keys},
        "dumps": lambda: kernel.dump_real_servers(keys, only),
        "dumps_all": lambda: kernel.dump_real_servers(keys),
        "syscalls": syscalls,
    }
    times: dict[str, list[float]] = {name: [] for name in paths}
    results: dict[str, Any] = {}
    for _ in range(a.repeat):
        for name, fn in paths.items():
            t = time.monotonic()
            results[name] = fn()
            times[name].append(time.monotonic() - t)
    each = {k: [s for s in v if s.key in only[k]] for k, v in results["dumps_each"].items()}
    equal = results["table"] == each == results["dumps"]
    doc: dict[str, Any] = {
        "machine": machine(),
        "services": a.services,
        "endpoints_per_service": a.endpoints,
        "draining": a.draining,
        "readings_equal": equal,
        "seconds": {
            n: {
                "median": round(statistics.median(v), 4),
                "min": round(min(v), 4),
                "max": round(max(v), 4),
            }
            for n, v in times.items()
        },
        "ebusy": _ebusy(kernel, keys[0]),
        "profile_dumps_each": _profile(lambda: [kernel.list_real_servers(k) for k in keys[:200]]),
        "profile_dumps": _profile(lambda: kernel.dump_real_servers(keys[:200], only)),
    }
    for n, v in doc["seconds"].items():
        log(f"{n}: median {v['median']}s (min {v['min']}, max {v['max']})")
    log(f"readings equal: {equal}; two dumps in flight on one socket: {doc['ebusy']}")
    print(doc["profile_dumps_each"], doc["profile_dumps"], sep="\n")
    path = write_json(Path(a.out) / "drain_read.json", doc)
    log(f"wrote {path}")
    kernel.close()
    ns.close()
    return 0 if equal else 1


if __name__ == "__main__":
    sys.exit(main())

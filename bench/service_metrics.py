"""Per-Service traffic metrics (issue 30): what a scrape costs, and whether scrapes slow the
event path.

    python -m bench.service_metrics scrape [--services 10000] [--opted 1000] [--runs 3]
    python -m bench.service_metrics e2k [--services 10000] [--opted 1000] [--runs 3]

`scrape`: in-process, an engine following N Services of 10 endpoints on the in-memory kernel,
`opted` of them annotated `ipvsctl.io/metrics: "true"`. The kernel's side of the service
dump is `WireStatsKernel`: each virtual server's service message packed once as the kernel
fills it (devkit/fakenetlink.py, stats included), and every scrape parses all N of them with
wire.parse_service_stats, as NetlinkKernel.read_service_stats does with the kernel's answer
(the syscall and the kernel's own filling of the dump are not in these numbers). Times: the
read alone (index copy, cap, dump parse, sums) and the whole /metrics rendering; memory: the
tracemalloc peak of one rendering and the RSS growth over the scrapes. Also `all` at the
default cap (N Services opted in, most left out: the cap's sort) as its own row.

`e2k`: the daemon process (bench/daemon_proc.py with `--wire-stats`) following the same
cluster from the fake API in another process (bench/fakeapi_proc.py `--annotated`), 3,000
EndpointSlice events paced at 100/s, with no scraper and with one scraping /metrics every
second, `runs` times each, alternating; the exact event-to-kernel times per run.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import threading
import time
import tracemalloc
import urllib.request
from typing import Any

from bench.common import log, machine, summary
from devkit.fakenetlink import virtual_server_answer
from ipvsctl.kernel.fake import FakeKernel
from ipvsctl.kernel.netlink import wire
from ipvsctl.model import ServiceKey, ServiceStats
from ipvsctl.reconcile.feed import Subscriptions

ANNOTATION = {"ipvsctl.io/metrics": "true"}


class WireStatsKernel(FakeKernel):
    """FakeKernel whose read_service_stats parses a service dump in the kernel's bytes."""

    def __init__(self) -> None:
        super().__init__()
        self._packed: dict[ServiceKey, bytes] = {}

    def read_service_stats(self) -> dict[ServiceKey, ServiceStats]:
        self.stats_reads += 1
        messages = []
        for key, svc in self.services.items():
            msg = self._packed.get(key)
            if msg is None:
                counters = ServiceStats(7, 70, 60, 7000, 90000)
                msg = self._packed[key] = virtual_server_answer(svc.vs, 1, counters)
            messages.append(msg)
        found = [wire.parse_service_stats(m) for m in messages]
        return dict(f for f in found if f is not None)


def _cluster(services: int, opted: int) -> tuple[list[dict], list[dict]]:
    from bench.cluster import cluster

    svcs, slices = cluster(services, 10)
    for s in svcs[:opted]:
        s["metadata"]["annotations"] = dict(ANNOTATION)
    return svcs, slices


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
    return 0.0


def scrape_cost(services: int, opted: int, mode: str, scrapes: int = 20) -> dict[str, Any]:
    from devkit.harness import Harness
    from ipvsctl.obs.metrics import ServiceTrafficCollector
    from ipvsctl.reconcile.service_traffic import ServiceMetricsMode, ServiceTraffic

    h = Harness(kernel=WireStatsKernel())
    traffic = ServiceTraffic(h.fake, ServiceMetricsMode(mode))
    h.feed.subscribe(Subscriptions(service=traffic.on_service))
    h.metrics.registry.register(ServiceTrafficCollector(traffic.read))  # as the daemon does
    svcs, slices = _cluster(services, opted)
    t0 = time.monotonic()
    h.start(svcs, slices)
    sync_s = time.monotonic() - t0
    del svcs, slices
    gc.collect()
    rows, dropped = traffic.read()  # the first read packs the kernel's messages (cached)
    rss0 = _rss_mb()
    # Wall time and this thread's CPU time (the scrape runs in the calling thread: on a
    # shared machine the CPU time is the cost, the wall time also the wait for a core).
    reads, renders, reads_cpu, renders_cpu = [], [], [], []
    size = 0
    for _ in range(scrapes):
        t, c = time.perf_counter(), time.thread_time()
        traffic.read()
        reads.append(time.perf_counter() - t)
        reads_cpu.append(time.thread_time() - c)
        t, c = time.perf_counter(), time.thread_time()
        size = len(h.metrics.render())
        renders.append(time.perf_counter() - t)
        renders_cpu.append(time.thread_time() - c)
    rss1 = _rss_mb()
    tracemalloc.start()
    h.metrics.render()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {
        "services": services,
        "opted_in": opted if mode == "annotated" else services,
        "mode": mode,
        "series": len(rows) * 5,
        "dropped_services": dropped,
        "initial_sync_s": round(sync_s, 1),
        "read_ms": summary(reads),
        "read_cpu_ms": summary(reads_cpu),
        "render_ms": summary(renders),
        "render_cpu_ms": summary(renders_cpu),
        "load_avg_1m": round(__import__("os").getloadavg()[0], 1),
        "metrics_body_kb": round(size / 1024, 1),
        "render_alloc_peak_mb": round(peak / 2**20, 2),
        "rss_growth_over_scrapes_mb": round(rss1 - rss0, 1),
    }


def run_scrape(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"machine": machine(), "runs": []}
    for i in range(args.runs):
        for mode in ("annotated", "all"):
            r = scrape_cost(args.services, args.opted, mode)
            r["run"] = i
            log(f"scrape {mode} run {i}: {json.dumps(r)}")
            out["runs"].append(r)
    return out


class Scraper:
    """Prometheus-like: GET /metrics every `interval` seconds, reading the whole body."""

    def __init__(self, port: int, interval: float = 1.0) -> None:
        self.url = f"http://127.0.0.1:{port}/metrics"
        self.interval = interval
        self.stop = threading.Event()
        self.times: list[float] = []
        self.errors = 0
        self.series = 0  # per-Service traffic samples in the last scrape
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        while not self.stop.wait(self.interval):
            t = time.perf_counter()
            try:
                with opener.open(self.url, timeout=30) as r:
                    body = r.read()
                self.times.append(time.perf_counter() - t)
                self.series = body.count(b"\nipvsctl_service_")
            except OSError:
                self.errors += 1

    def close(self) -> dict[str, Any]:
        self.stop.set()
        self.thread.join(60)
        return {
            "scrapes": len(self.times),
            "scrape_errors": self.errors,
            "scrape_series": self.series,
            "scrape_ms": summary(self.times),
        }


def run_e2k(args: argparse.Namespace) -> dict[str, Any]:
    from bench.memory import run_memory

    out: dict[str, Any] = {"machine": machine(), "runs": []}
    for i in range(args.runs):
        for scrape in (False, True):
            r = run_memory(
                args.services,
                10,
                args.events,
                rate=args.rate,
                annotated=args.opted,
                wire_stats=True,
                scrape_interval=1.0 if scrape else 0.0,
            )
            r["run"], r["scraping"] = i, scrape
            log(f"e2k run {i} scraping={scrape}: p99 {r['event_to_kernel_ms']['p99']} ms")
            out["runs"].append(r)
    p99 = {
        s: [r["event_to_kernel_ms"]["p99"] for r in out["runs"] if r["scraping"] is s]
        for s in (False, True)
    }
    out["p99_idle_ms"], out["p99_scraped_ms"] = p99[False], p99[True]
    out["p99_median_ratio"] = round(statistics.median(p99[True]) / statistics.median(p99[False]), 2)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.service_metrics")
    p.add_argument("part", choices=("scrape", "e2k"))
    p.add_argument("--services", type=int, default=10000)
    p.add_argument("--opted", type=int, default=1000)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--events", type=int, default=3000)
    p.add_argument("--rate", type=float, default=100.0)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    result = run_scrape(args) if args.part == "scrape" else run_e2k(args)
    text = json.dumps(result, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

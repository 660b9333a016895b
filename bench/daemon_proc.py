"""ipvsctl's daemon for the memory benchmark, in its own process: `Daemon` with the real
API source (KubeSource) on the in-memory kernel (FakeKernel; the host has no IPVS) or on
the real kernel in a network namespace (`--netns`, in the lab VM). Prints one line when
the first full list is in the kernel (`ready SECONDS`), then serves until stdin closes;
peak RSS and CPU time are read from /proc by the parent.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from typing import Any

from ipvsctl.daemon.options import DrainOptions, HTTPOptions, SourceOptions


def _record_latencies(daemon: Any) -> None:
    """Exact event-to-kernel times beside the histogram's buckets (too coarse for a p99
    ratio): GET /bench/latencies returns those observed since the last GET."""
    import collections
    import json

    seen: collections.deque[float] = collections.deque(maxlen=1_000_000)
    histogram = daemon.metrics.event_to_kernel
    observe = histogram.observe

    class Recording:
        def observe(self, value: float) -> None:
            seen.append(value)
            observe(value)

        def __getattr__(self, name: str) -> Any:
            return getattr(histogram, name)

    daemon.metrics.event_to_kernel = Recording()

    def latencies(q: dict[str, list[str]]) -> tuple[int, str, bytes]:
        out = [seen.popleft() for _ in range(len(seen))]
        return 200, "application/json", json.dumps(out).encode()

    daemon.http.routes["/bench/latencies"] = latencies

    def backlog(q: dict[str, list[str]]) -> tuple[int, str, bytes]:
        """Events waiting, and how many merged into a waiting one (source/backlog.py)."""
        events = daemon.events
        with daemon.loop.lock:  # not while the loop still handles a batch it took
            busy = bool(daemon.engine.dirty) or daemon.engine.pending_since is not None
            doc = {"waiting": events.qsize() + busy, "merged": getattr(events, "merged", 0)}
        return 200, "application/json", json.dumps(doc).encode()

    daemon.http.routes["/bench/backlog"] = backlog


def _trace_routes(daemon: Any) -> None:
    """GET /bench/memory?at=after_list (arms the peak watcher), ?at=poll (while the
    events arrive), ?at=peak, ?at=end."""
    import json

    from bench import memprofile

    watcher = memprofile.PeakWatcher(backlog=daemon.events.qsize)

    def memory(q: dict[str, list[str]]) -> tuple[int, str, bytes]:
        at = q.get("at", ["end"])[0]
        if at == "poll":
            doc = {"traced_mb": round(watcher.poll() / 2**20, 1)}
        elif at == "peak":
            doc = watcher.take()
        else:
            doc = memprofile.reading()
            doc["backlog_events"] = daemon.events.qsize()
            if at == "after_list":
                watcher.arm()
        return 200, "application/json", json.dumps(doc).encode()

    daemon.http.routes["/bench/memory"] = memory


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.daemon_proc")
    p.add_argument("--apiserver", required=True)
    p.add_argument("--netns", default=None)
    p.add_argument("--wire-stats", action="store_true", help="parse service dumps as bytes")
    p.add_argument(
        "--tracemalloc", action="store_true", help="trace allocations (bench/memprofile.py)"
    )
    p.add_argument("--max-table-entries", type=int, default=None, help="as `run`'s flag")
    args = p.parse_args(argv)
    if args.tracemalloc:  # before ipvsctl and its libraries are imported
        from bench import memprofile

        memprofile.start()
    t0 = time.monotonic()
    from ipvsctl.daemon.options import DaemonOptions
    from ipvsctl.daemon.wiring import Daemon
    from ipvsctl.kube.client import KubeSource
    from ipvsctl.model import NodeContext
    from ipvsctl.source.prepare import Preparer

    if args.netns:
        from ipvsctl.kernel.netlink import NetlinkKernel

        kernel = NetlinkKernel(netns=args.netns)
    else:
        from ipvsctl.kernel.fake import FakeKernel

        if args.wire_stats:
            from bench.service_metrics import WireStatsKernel

            kernel = WireStatsKernel()
        else:
            kernel = FakeKernel()
        kernel.ops = __import__("collections").deque(maxlen=0)
    node = NodeContext("bench-node")
    if args.max_table_entries is not None:
        node = NodeContext("bench-node", max_table_entries=args.max_table_entries)
    opts = DaemonOptions(
        node=node,
        source=SourceOptions(apiserver=args.apiserver),
        drain=DrainOptions(state_dir=tempfile.mkdtemp(prefix="ipvsctl-bench-")),
        http=HTTPOptions(listen="127.0.0.1:0"),
    )
    # As the daemon's wiring (open_source): lists parsed as they are decoded.
    source = KubeSource.from_config(apiserver=args.apiserver, prepare=Preparer.for_node(opts.node))
    daemon = Daemon(opts, kernel, source)
    _record_latencies(daemon)
    if args.tracemalloc:
        _trace_routes(daemon)
    imported = time.monotonic() - t0
    t1 = time.monotonic()
    daemon.start()
    print(f"port {daemon.http.port}", flush=True)
    while not daemon.engine.started:
        time.sleep(0.05)
    print(f"ready {time.monotonic() - t1:.3f} imported {imported:.3f}", flush=True)
    sys.stdin.read()
    daemon.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

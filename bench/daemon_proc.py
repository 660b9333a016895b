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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.daemon_proc")
    p.add_argument("--apiserver", required=True)
    p.add_argument("--netns", default=None)
    p.add_argument("--wire-stats", action="store_true", help="parse service dumps as bytes")
    args = p.parse_args(argv)
    t0 = time.monotonic()
    from ipvsctl.daemon.wiring import Daemon, DaemonOptions
    from ipvsctl.kube.client import KubeSource
    from ipvsctl.model import NodeContext

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
    opts = DaemonOptions(
        node=NodeContext("bench-node"),
        apiserver=args.apiserver,
        state_dir=tempfile.mkdtemp(prefix="ipvsctl-bench-"),
        listen="127.0.0.1:0",
    )
    daemon = Daemon(opts, kernel, KubeSource.from_config(apiserver=args.apiserver))
    _record_latencies(daemon)
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

"""The daemon for bench/http_flood.py's host part, run as a file so that `ipvsctl` comes
from PYTHONPATH (this checkout, or another one's for a before/after pair): ipvsctl's
`Daemon` on the in-memory kernel whose service dump is parsed from the kernel's bytes,
following the API server at --apiserver, its HTTP server on --listen. Serves until stdin
closes. Uses only what every version of ipvsctl since issue 30 has."""

from __future__ import annotations

import argparse
import sys
import tempfile

from ipvsctl.daemon.options import DrainOptions, HTTPOptions, SourceOptions


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--apiserver", required=True)
    p.add_argument("--listen", required=True)
    args = p.parse_args()
    from bench.service_metrics import WireStatsKernel
    from ipvsctl.daemon.options import DaemonOptions
    from ipvsctl.daemon.wiring import Daemon
    from ipvsctl.kube.client import KubeSource
    from ipvsctl.model import NodeContext

    kernel = WireStatsKernel()
    kernel.ops = __import__("collections").deque(maxlen=0)
    opts = DaemonOptions(
        node=NodeContext("bench-node", ("198.51.100.1",)),
        source=SourceOptions(apiserver=args.apiserver),
        drain=DrainOptions(state_dir=tempfile.mkdtemp(prefix="ipvsctl-bench-")),
        http=HTTPOptions(listen=args.listen),
    )
    daemon = Daemon(opts, kernel, KubeSource.from_config(apiserver=args.apiserver))
    daemon.start()
    sys.stdin.read()
    daemon.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Run the fake API server standalone, for demos and benchmarks:

    python -m devkit.fakeapi --services 10000 --endpoints 10 --port 8001

Prints its URL on stdout once loaded (one line), then serves until SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time

from devkit.fakeapi import objects
from devkit.fakeapi.server import FakeAPIServer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devkit.fakeapi", description=__doc__)
    parser.add_argument("--port", type=int, default=0, help="0: any free port")
    parser.add_argument("--services", type=int, default=0)
    parser.add_argument("--endpoints", type=int, default=3, help="endpoints per Service")
    parser.add_argument("--namespaces", type=int, default=10)
    parser.add_argument("--bookmark-interval", type=float, default=60.0)
    args = parser.parse_args(argv)

    api = FakeAPIServer(
        port=args.port, bookmark_interval=args.bookmark_interval, record_requests=False
    )
    started = time.monotonic()
    api.add_many(objects.cluster(args.services, args.endpoints, namespaces=args.namespaces))
    api.start()
    print(api.url, flush=True)
    print(
        f"loaded {args.services} services x {args.endpoints} endpoints "
        f"in {time.monotonic() - started:.2f}s",
        file=sys.stderr,
        flush=True,
    )
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    api.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

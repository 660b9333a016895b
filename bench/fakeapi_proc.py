"""The fake API server for the memory benchmark, in its own process (so its memory is not
the daemon's): loads N Services x E endpoints, prints its URL, then obeys stdin:

    churn COUNT [RATE]  COUNT EndpointSlice updates (one endpoint flips ready/not ready in a
                        random Service each), at RATE per second (default: as fast as it
                        can); prints "churned COUNT SECONDS"
    quit
"""

from __future__ import annotations

import argparse
import copy
import random
import sys
import time
from collections.abc import Iterator
from typing import Any

from devkit.fakeapi import objects
from devkit.fakeapi.server import FakeAPIServer


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.fakeapi_proc")
    p.add_argument("--services", type=int, required=True)
    p.add_argument("--endpoints", type=int, default=10)
    p.add_argument("--annotated", type=int, default=0, help="the first N: ipvsctl.io/metrics")
    args = p.parse_args(argv)
    api = FakeAPIServer(record_requests=False, bookmark_interval=30.0)
    slices = []
    for obj in objects.cluster(args.services, args.endpoints):
        if obj["kind"] == "EndpointSlice":
            slices.append(obj)

    def annotated() -> Iterator[dict[str, Any]]:
        n = 0
        for obj in objects.cluster(args.services, args.endpoints):
            if obj["kind"] == "Service" and n < args.annotated:
                obj["metadata"]["annotations"]["ipvsctl.io/metrics"] = "true"
                n += 1
            yield obj

    api.add_many(annotated())
    api.start()
    print(api.url, flush=True)
    rng = random.Random(3)
    for line in sys.stdin:
        cmd = line.split()
        if not cmd:
            continue
        if cmd[0] == "quit":
            break
        if cmd[0] == "churn":
            count = int(cmd[1])
            rate = float(cmd[2]) if len(cmd) > 2 else 0.0
            t0 = time.monotonic()
            for k in range(count):
                if rate:
                    time.sleep(max(0.0, t0 + k / rate - time.monotonic()))
                i = rng.randrange(len(slices))
                sl = copy.deepcopy(slices[i])
                ep = sl["endpoints"][rng.randrange(len(sl["endpoints"]))]
                ready = not ep["conditions"]["ready"]
                ep["conditions"].update(ready=ready, serving=ready)
                slices[i] = sl
                api.update(sl)
            print(f"churned {count} {time.monotonic() - t0:.3f}", flush=True)
    api.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""CPU per IPVS operation on the host, before and after the hand-packed messages
(ipvsctl/kernel/netlink/wire.py), against a modelled kernel that answers every request at once.

- pyroute2: `IPVS.dest("set", ...)` with codec.py's specs, pyroute2's whole request path
  (request filters, message build and encode, NetlinkRequest, its asyncio loop, the ACK
  parsed by its marshal). The kernel is modelled with pyroute2's own `request_proxy` hook
  (answers an ACK instead of sending); the family lookup is answered the same way, so this
  runs on a host without IPVS.
- wire: `IPVSCalls.set_dest` as NetlinkKernel runs it now: wire.py packs the message, it
  goes out on a socket and the ACK is read back with select/recv (a socketpair whose
  other end answers at once stands in for the kernel; the syscalls are real).
- build only: each side's message building without any socket.
- change: one endpoint change through the Engine (slice parsed, Service rebuilt, diffed,
  one weight set) at 1,000 Services on the in-memory kernel, whose writes also go out
  through either path above: a change's CPU with its netlink message included.

    python -m bench.netlink_codec [--ops 10000] [--repeats 7] [--only NAME]

Prints per-op microseconds (median and min-max of the repeats) as JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import statistics
import time
import types
from collections.abc import Callable
from typing import Any

from bench.kernels import FAMILY, ack, fake_kernel, wire_calls


class _AckProxy:
    """pyroute2's request_proxy: the answer to a request, instead of sending it."""

    def handle(self, msg: Any) -> bytes:
        return ack(msg["header"]["sequence_number"])


def pyroute2_ipvs() -> Any:
    from pyroute2 import IPVS
    from pyroute2.netlink import ctrlmsg
    from pyroute2.netlink.generic import AsyncGenericNetlinkSocket

    async def discovery(self: Any, proto: str) -> Any:  # the family lookup, modelled
        msg = ctrlmsg()
        msg["attrs"] = [("CTRL_ATTR_FAMILY_ID", FAMILY)]
        return msg

    original = AsyncGenericNetlinkSocket.discovery
    AsyncGenericNetlinkSocket.discovery = discovery  # type: ignore[method-assign]
    try:
        ipvs = IPVS()
    finally:
        AsyncGenericNetlinkSocket.discovery = original  # type: ignore[method-assign]
    ipvs.asyncore.request_proxy = _AckProxy()
    return ipvs


def cases() -> dict[str, Callable[[int], None]]:
    from pyroute2.ipvs import AsyncIPVS

    from ipvsctl.kernel.netlink import wire
    from ipvsctl.kernel.netlink.codec import dest_spec, service_key_spec
    from ipvsctl.model import Protocol, RealServerKey, ServiceKey

    key = ServiceKey(Protocol.TCP, "10.96.0.10", 80)
    rs = RealServerKey("10.244.1.1", 8080)
    ipvs, calls = pyroute2_ipvs(), wire_calls()

    async def encode_only(msg: Any, msg_flags: int) -> None:
        msg["header"].update(type=FAMILY, flags=msg_flags, sequence_number=1, pid=1)
        msg.encode()

    fake_self = types.SimpleNamespace(_do_request=encode_only)

    def pyroute2_build(i: int) -> None:
        coro = AsyncIPVS.dest(
            fake_self, "set", service=service_key_spec(key), dest=dest_spec(rs, i & 1)
        )
        with contextlib.suppress(StopIteration):
            coro.send(None)

    return {
        "pyroute2 set_dest (whole request path)": lambda i: ipvs.dest(
            "set", service=service_key_spec(key), dest=dest_spec(rs, i & 1)
        ),
        "wire set_dest (IPVSCalls, socket round trip)": lambda i: calls.set_dest(key, rs, i & 1),
        "pyroute2 build only": pyroute2_build,
        "wire build only": lambda i: wire.message(FAMILY, wire.set_dest(key, rs, i & 1), i),
    }


def change_cases(ops: int) -> dict[str, Callable[[int], None]]:
    from devkit.builders import endpoint, endpoint_slice, service
    from devkit.harness import Harness
    from ipvsctl.kernel.fake import FakeKernel
    from ipvsctl.kernel.netlink.codec import dest_spec, service_key_spec
    from ipvsctl.model import RealServerKey, ServiceKey

    class Pyroute2Writes(FakeKernel):
        ipvs = pyroute2_ipvs()

        def set_real_server_weight(self, key: ServiceKey, rs: RealServerKey, w: int) -> None:
            super().set_real_server_weight(key, rs, w)
            self.ipvs.dest("set", service=service_key_spec(key), dest=dest_spec(rs, w))

    n = 1000
    ips = [f"10.96.{i // 250}.{i % 250 + 1}" for i in range(n)]
    pods = [
        [f"10.{100 + i // 2500}.{(i // 10) % 250}.{(i % 10) * 20 + j + 1}" for j in range(10)]
        for i in range(n)
    ]

    def event(k: int) -> dict[str, Any]:  # endpoint 0 of one Service goes not-ready, or back
        i, ready = k % n, (k // n) % 2 == 1
        return endpoint_slice(
            f"s{i}", [endpoint(pods[i][0], ready=ready)] + [endpoint(p) for p in pods[i][1:]]
        )

    # The events are built before the clock starts: what is timed is ipvsctl's work on an
    # object as the watch hands it over (decoded), not the benchmark making it.
    events = [event(k) for k in range(ops)]

    def engine_on(kernel: FakeKernel) -> Callable[[int], None]:
        h = Harness(kernel=kernel, drain_timeout=1e9)
        h.start(
            [service(f"s{i}", cluster_ip=ips[i]) for i in range(n)],
            [endpoint_slice(f"s{i}", [endpoint(p) for p in pods[i]]) for i in range(n)],
        )
        kernel.ops = []
        gc.collect()  # as the daemon's loop does after its initial sync (reconcile/loop.py)
        gc.freeze()

        def change(k: int) -> None:
            h.upsert(events[k])
            kernel.ops.clear()

        return change

    return {
        "change, in-memory kernel only": engine_on(FakeKernel()),
        "change, pyroute2 request path": engine_on(Pyroute2Writes()),
        "change, wire request path": engine_on(fake_kernel(packed=True)),
    }


def measure(fn: Callable[[int], None], ops: int, repeats: int) -> dict[str, float]:
    fn(0)  # warm up imports and caches
    per_op = []
    for _ in range(repeats):
        t0 = time.process_time()
        for i in range(ops):
            fn(i)
        per_op.append((time.process_time() - t0) / ops * 1e6)
    return {
        "median_us": round(statistics.median(per_op), 2),
        "min_us": round(min(per_op), 2),
        "max_us": round(max(per_op), 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", type=int, default=10_000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--only", default="")
    ap.add_argument("--changes", action="store_true", help="the Engine change cases")
    args = ap.parse_args()
    chosen = change_cases(args.ops) if args.changes else cases()
    out = {
        name: measure(fn, args.ops, args.repeats)
        for name, fn in chosen.items()
        if args.only in name
    }
    print(
        json.dumps(
            {"ops": args.ops, "repeats": args.repeats, "cpu": "process_time", "results": out},
            indent=1,
        )
    )


if __name__ == "__main__":
    main()

"""The daemon as the benchmarks run it: ipvsctl's own `Daemon` (ipvsctl/daemon/wiring.py) with
the loop, the drain/audit reader thread, the state writer thread and the HTTP server it
builds in `ipvsctl run`, fed by a producer thread that stamps each event as it takes it -
as the API watch stamps a line when it arrives, before anything waits for the loop's lock.

Before this, the benchmark built its own `Loop` without `save_queue` (it busy-spun on the
unsaved drain queue after 39a1816) and stamped events while holding `loop.lock` (the time an
event waited for an audit or a drain check was not counted). Using `Daemon` itself keeps the
two from drifting apart again; tests/unit/test_bench_smoke.py checks it.

`Watcher` wraps the kernel: counts calls and writes, notes when expected weight changes and
deletions happen, and can hold real servers "busy" (reads report one active connection for
them; the reads themselves are real), so 1,000 drains stay queued without 1,000 live
connections.
"""

from __future__ import annotations

import dataclasses
import http.client
import os
import queue
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any

from ipvsctl.daemon.options import DaemonOptions, DrainOptions, HTTPOptions
from ipvsctl.daemon.wiring import Daemon
from ipvsctl.kernel.port import KernelError, RealServerBatch, add_each
from ipvsctl.model import NodeContext, RealServerKey, RealServerStatus, ServiceKey
from ipvsctl.obs.metrics import Metrics
from ipvsctl.source.events import ObjectKind, Replace, SourceEvent, Upsert

NODE = NodeContext("bench-node", (), "rr")
WRITES = frozenset(
    {
        "add_virtual_server",
        "update_virtual_server",
        "delete_virtual_server",
        "add_real_server",
        "set_real_server_weight",
        "delete_real_server",
    }
)

Pair = tuple[ServiceKey, RealServerKey]


class Watcher:
    """Passes every call to `impl`; see the module docstring."""

    def __init__(self, impl: Any) -> None:
        self.impl = impl
        self.calls = 0
        self.writes = 0
        self.cond = threading.Condition()
        self.want: dict[tuple[ServiceKey, RealServerKey, int], float | None] = {}
        self.deleted: dict[Pair, float] = {}
        self.held: set[Pair] = set()

    # --- expectations -------------------------------------------------------------------
    def expect(self, key: ServiceKey, rs: RealServerKey, weight: int) -> None:
        with self.cond:
            self.want[(key, rs, weight)] = None

    def wait(self, keys: Collection[tuple[ServiceKey, RealServerKey, int]], timeout: float) -> bool:
        with self.cond:
            return self.cond.wait_for(
                lambda: all(self.want.get(k) is not None for k in keys), timeout
            )

    def take(self, key: tuple[ServiceKey, RealServerKey, int]) -> float:
        with self.cond:
            t = self.want.pop(key)
        assert t is not None
        return t

    def wait_deleted(self, pairs: Collection[Pair], timeout: float) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: all(p in self.deleted for p in pairs), timeout)

    def _done(self, key: ServiceKey, rs: RealServerKey, weight: int) -> None:
        t = time.monotonic()
        k = (key, rs, weight)
        with self.cond:
            if k in self.want and self.want[k] is None:
                self.want[k] = t
                self.cond.notify_all()

    # --- reads: held real servers report one active connection --------------------------
    def _hold(
        self, key: ServiceKey, found: list[RealServerStatus] | None
    ) -> list[RealServerStatus] | None:
        if not self.held or found is None:
            return found
        return [
            dataclasses.replace(s, active_conns=max(1, s.active_conns))
            if (key, s.key) in self.held
            else s
            for s in found
        ]

    def list_real_servers(self, key: ServiceKey) -> list[RealServerStatus]:
        self.calls += 1
        return self._hold(key, self.impl.list_real_servers(key)) or []

    def read_real_servers(
        self, keys: Collection[ServiceKey], only: Any = None
    ) -> dict[ServiceKey, Any]:
        self.calls += 1
        table = self.impl.read_real_servers(keys, only)
        return {k: self._hold(k, v) for k, v in table.items()}

    def dump_real_servers(self, keys: Any, only: Any = None) -> dict[ServiceKey, Any]:
        self.calls += 1
        found = self.impl.dump_real_servers(keys, only)
        return {k: v if isinstance(v, Exception) else self._hold(k, v) for k, v in found.items()}

    # --- writes -------------------------------------------------------------------------
    def set_real_server_weight(self, key: ServiceKey, rs: RealServerKey, weight: int) -> None:
        self.calls += 1
        self.writes += 1
        self.impl.set_real_server_weight(key, rs, weight)
        self._done(key, rs, weight)

    def add_real_server(self, key: ServiceKey, rs: RealServerKey, weight: int) -> None:
        self.calls += 1
        self.writes += 1
        self.impl.add_real_server(key, rs, weight)
        self._done(key, rs, weight)

    def add_real_servers(
        self, key: ServiceKey, real_servers: Sequence[RealServerKey], weight: int
    ) -> list[KernelError | None]:
        """RealServerBatch (`impl`'s, or an add each): one call, a write per real server."""
        self.calls += 1
        self.writes += len(real_servers)
        if isinstance(self.impl, RealServerBatch):
            out = self.impl.add_real_servers(key, real_servers, weight)
        else:
            out = add_each(self.impl, key, real_servers, weight)
        for rs, error in zip(real_servers, out, strict=True):
            if error is None:
                self._done(key, rs, weight)
        return out

    def delete_real_server(self, key: ServiceKey, rs: RealServerKey) -> None:
        self.calls += 1
        self.writes += 1
        self.impl.delete_real_server(key, rs)
        with self.cond:
            self.deleted[(key, rs)] = time.monotonic()
            self.cond.notify_all()

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self.impl, name)
        if not callable(fn):
            return fn

        def call(*args: Any, **kw: Any) -> Any:
            self.calls += 1
            if name in WRITES:
                self.writes += 1
            return fn(*args, **kw)

        return call


class ProducerSource:
    """An ObjectSource: the first lists, then whatever `send` hands it, each event stamped
    (time.monotonic()) by this thread just before it is put on the daemon's queue."""

    emits_node = False

    def __init__(self, services: list[Any], slices: list[Any]) -> None:
        self.services, self.slices = services, slices
        self.inbox: queue.Queue[list[tuple[Any, Callable[[float], None] | None]]] = queue.Queue()

    def send(self, objs: list[tuple[Any, Callable[[float], None] | None]]) -> None:
        """EndpointSlices to emit back to back; `on_stamp(t)` is told each one's stamp."""
        self.inbox.put(objs)

    def run(self, sink: Callable[[SourceEvent], None], stop: threading.Event) -> None:
        now = time.monotonic()
        sink(Replace(ObjectKind.SERVICE, self.services, now))
        sink(Replace(ObjectKind.ENDPOINT_SLICE, self.slices, now))
        self.services = self.slices = []  # the daemon's store holds them now
        while not stop.is_set():
            try:
                batch = self.inbox.get(timeout=0.1)
            except queue.Empty:
                continue
            for obj, on_stamp in batch:
                t = time.monotonic()
                if on_stamp is not None:
                    on_stamp(t)
                sink(Upsert(ObjectKind.ENDPOINT_SLICE, obj, t))


class BenchDaemon:
    """`Daemon` on a given kernel with a ProducerSource; `start()` returns the seconds to
    /readyz answering 200 (polled over HTTP every 10 ms)."""

    def __init__(
        self,
        kernel: Any,
        services: list[Any],
        slices: list[Any],
        drain_check_interval: float = 1.0,
        drain_timeout: float = 3600.0,
    ) -> None:
        self.state_dir = tempfile.TemporaryDirectory(prefix="ipvsctl-bench-")
        self.source = ProducerSource(services, slices)
        self.metrics = Metrics()
        opts = DaemonOptions(
            node=NODE,
            drain=DrainOptions(
                timeout=drain_timeout,
                check_interval=drain_check_interval,
                state_dir=self.state_dir.name,
            ),
            http=HTTPOptions(listen="127.0.0.1:0"),
        )
        self.daemon = Daemon(opts, kernel, self.source, metrics=self.metrics)
        self.engine = self.daemon.engine
        self.loop = self.daemon.loop
        self.steps = 0
        step = self.loop.step

        def counted(timeout: float = 0.0) -> None:
            self.steps += 1
            step(timeout)

        self.loop.step = counted  # type: ignore[method-assign]

    def readyz(self) -> int:
        conn = http.client.HTTPConnection("127.0.0.1", self.daemon.http.port, timeout=30)
        try:
            conn.request("GET", "/readyz")
            return conn.getresponse().status
        finally:
            conn.close()

    def start(self, timeout: float = 7200.0) -> float:
        t0 = time.monotonic()
        self.daemon.start()
        if os.environ.get("BENCH_SWITCH_INTERVAL"):  # an A/B of the daemon's GIL setting
            sys.setswitchinterval(float(os.environ["BENCH_SWITCH_INTERVAL"]))
        deadline = t0 + timeout
        while self.readyz() != 200:
            now = time.monotonic()
            if now > deadline:
                raise TimeoutError("/readyz not 200")
            # A poll every 2% of the time so far (5-100 ms): 100 polls a second took ~20%
            # of the daemon's CPU under emulation, away from the sync being timed (a
            # kubelet asks every 10 s).
            time.sleep(min(0.1, max(0.005, (now - t0) / 50)))
        return time.monotonic() - t0

    def shutdown(self) -> None:
        self.daemon.shutdown()
        self.state_dir.cleanup()

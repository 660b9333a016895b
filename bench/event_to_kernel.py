"""Event to kernel: how long from an EndpointSlice change arriving to its netlink change
being done, for ipvsctl and for the full-resync baseline, on one kernel table per size.

Per size (N Services x E endpoints, a fresh network namespace on the real kernel):
1. initial sync: ipvsctl's Engine programs the table from empty (timed);
2. ipvsctl, engine: a change is one endpoint going not-ready (its real server to weight 0)
   or ready again (back to 1), on a random Service; the time is from the event's arrival
   (`received`) to the moment that weight change returns from the kernel. Engine.handle +
   Engine.sync, called directly;
3. ipvsctl, loop: the same through the daemon's Loop thread (queue, batching, the drain
   check and the drift audit running as they do in `ipvsctl run`), changes at random gaps;
4. baseline: the same changes through bench.baseline.FullResync (kube-router's sync) on the
   same table; the time is to the moment that change's own netlink call returns (the rest of
   the resync goes on after it), and the full resync time is reported beside it.
Changes come in pairs (down, up) so the table ends as it started.
"""

from __future__ import annotations

import cProfile
import gc
import io
import pstats
import queue
import random
import threading
import time
from typing import Any

from bench.baseline import FullResync
from bench.cluster import cluster, rs_key, vs_key, with_ready
from bench.common import log, summary
from bench.kernels import Netns, TimedKernel, fake_kernel, netlink_kernel, raw_kernel
from ipvsctl.model import NodeContext
from ipvsctl.obs.metrics import Metrics
from ipvsctl.reconcile.engine import Engine, EngineConfig
from ipvsctl.reconcile.loop import Loop, LoopConfig
from ipvsctl.source.events import ObjectKind, Replace, Upsert

NODE = NodeContext("bench-node", (), "rr")


class _Signal(TimedKernel):
    """TimedKernel that also wakes a waiting thread when the watched change is done."""

    def __init__(self, impl: Any) -> None:
        super().__init__(impl)
        self.event = threading.Event()

    def expect(self, key: Any, rs: Any, weight: int) -> None:
        self.event.clear()
        super().expect(key, rs, weight)

    def set_real_server_weight(self, key: Any, rs: Any, weight: int) -> None:
        super().set_real_server_weight(key, rs, weight)
        if self.done_at is not None:
            self.event.set()

    def add_real_server(self, key: Any, rs: Any, weight: int) -> None:
        super().add_real_server(key, rs, weight)
        if self.done_at is not None:
            self.event.set()


class _Primed:
    """For sizes whose initial sync is not the thing measured: the table was programmed
    beforehand with bench.ipvsnl (identical content, seconds instead of many minutes of
    pyroute2 calls under emulation); the engine's initial sync then sees an empty kernel
    and its adds are skipped, so its state matches the table. Every later call is real."""

    def __init__(self, impl: Any) -> None:
        self.impl = impl

    def list_virtual_servers(self) -> list[Any]:
        return []

    def add_virtual_server(self, vs: Any, bind_address: bool) -> None:
        pass

    def add_real_server(self, key: Any, rs: Any, weight: int) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self.impl, name)


def prime(netns: str, services: list[Any], slices: list[Any]) -> float:
    """Program the table with the lean client; seconds taken."""
    from ipvsctl.model import VirtualServer

    t0 = time.monotonic()
    raw = raw_kernel(netns)
    try:
        for svc, sl in zip(services, slices, strict=True):
            key = vs_key(svc)
            raw.add_virtual_server(VirtualServer(key, "rr", 0), True)
            for j in range(len(sl["endpoints"])):
                raw.add_real_server(key, rs_key(sl, j), 1)
    finally:
        raw.close()
    return time.monotonic() - t0


def profile_text(prof: cProfile.Profile, limit: int = 18) -> str:
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.strip_dirs().sort_stats("cumulative").print_stats(limit)
    lines = [ln for ln in out.getvalue().splitlines() if ln.strip()]
    start = next((i for i, ln in enumerate(lines) if "ncalls" in ln), 0)
    return "\n".join(lines[start:])


def _pairs(rng: random.Random, n: int, e: int, count: int) -> list[tuple[int, int]]:
    return [(rng.randrange(n), rng.randrange(e)) for _ in range(max(1, count // 2))]


def run_size(n: int, e: int, kernel: str, *, changes: int, loop_changes: int,
             loop_budget_s: float, baseline_changes: int, seed: int = 1,
             profile: bool = False, real_initial: bool = True) -> dict[str, Any]:
    """Everything for one size; see the module docstring. `kernel` is fake or netlink;
    without `real_initial` the table is primed (see _Primed) and the initial sync is not
    timed."""
    services, slices = cluster(n, e)
    ns = Netns() if kernel == "netlink" else None
    try:
        impl = netlink_kernel(ns.name) if ns else fake_kernel()
        k = _Signal(impl)
        metrics = Metrics()
        engine = Engine(k, EngineConfig(NODE, drain_timeout=3600.0), metrics=metrics)
        out: dict[str, Any] = {"services": n, "endpoints_per_service": e,
                               "real_servers": n * e, "kernel": kernel}

        # 1. initial sync
        primed = ns is not None and not real_initial
        if primed:
            assert ns is not None
            t_prime = prime(ns.name, services, slices)
            engine.kernel = _Primed(k)
            log(f"{n} services: table primed with the lean client in {t_prime:.1f}s")
        gc.collect()
        t0 = time.monotonic()
        engine.handle(Replace(ObjectKind.SERVICE, services, t0))
        engine.handle(Replace(ObjectKind.ENDPOINT_SLICE, slices, t0))
        result = engine.sync()
        t_init = time.monotonic() - t0
        engine.kernel = k
        assert not result.failed, f"initial sync failed for {len(result.failed)} services"
        if primed:
            out["initial_sync"] = {"primed": True, "prime_seconds": round(t_prime, 3),
                                   "engine_state_seconds": round(t_init, 3)}
        else:
            out["initial_sync"] = {"seconds": round(t_init, 3), "ops": result.ops,
                                   "netlink_calls": k.calls}
        log(f"{n} services: initial sync {t_init:.1f}s, {result.ops} ops"
            + (" (primed: no kernel calls)" if primed else ""))

        rng = random.Random(seed)

        def change(i: int, j: int, ready: bool) -> tuple[Any, Any, Any]:
            obj = slices[i] if ready else with_ready(slices[i], j, False)
            return obj, vs_key(services[i]), rs_key(slices[i], j)

        # 2. ipvsctl, engine called directly (after a few unmeasured changes: first calls
        # pay for lazy imports and socket set-up)
        for i, j in _pairs(rng, n, e, 20):
            for ready in (False, True):
                obj, key, rs = change(i, j, ready)
                engine.handle(Upsert(ObjectKind.ENDPOINT_SLICE, obj, time.monotonic()))
                engine.sync()
        lat: list[float] = []
        calls: list[int] = []
        for i, j in _pairs(rng, n, e, changes):
            for ready in (False, True):
                obj, key, rs = change(i, j, ready)
                k.expect(key, rs, 1 if ready else 0)
                c0 = k.calls
                t = time.monotonic()
                engine.handle(Upsert(ObjectKind.ENDPOINT_SLICE, obj, t))
                engine.sync()
                assert k.done_at is not None, "change not applied"
                lat.append(k.done_at - t)
                calls.append(k.calls - c0)
        out["ipvsctl_engine"] = summary(lat) | {"netlink_calls_per_change": max(calls)}
        log(f"{n} services: ipvsctl engine p50 {out['ipvsctl_engine']['p50']} ms "
            f"p99 {out['ipvsctl_engine']['p99']} ms ({len(lat)} changes)")

        if profile:
            prof = cProfile.Profile()
            for i, j in _pairs(rng, n, e, min(changes, 100)):
                for ready in (False, True):
                    obj, key, rs = change(i, j, ready)
                    prof.enable()
                    engine.handle(Upsert(ObjectKind.ENDPOINT_SLICE, obj, time.monotonic()))
                    engine.sync()
                    prof.disable()
            out["ipvsctl_engine_profile"] = profile_text(prof)

        # 3. ipvsctl through the daemon's loop thread
        if loop_changes:
            events: queue.Queue[Any] = queue.Queue()
            loop = Loop(engine, events, LoopConfig(drain_check_interval=1.0))
            stop = threading.Event()
            thread = threading.Thread(target=loop.run, args=(stop,), daemon=True)
            thread.start()
            audits0 = metrics.value("ipvsctl_drift_repairs_total", {"kind": "real_server_changed"})
            lat = []
            deadline = time.monotonic() + loop_budget_s
            for i, j in _pairs(rng, n, e, loop_changes):
                for ready in (False, True):
                    time.sleep(rng.uniform(0.0, 0.3))
                    obj, key, rs = change(i, j, ready)
                    with loop.lock:
                        k.expect(key, rs, 1 if ready else 0)
                    t = time.monotonic()
                    events.put(Upsert(ObjectKind.ENDPOINT_SLICE, obj, t))
                    if not k.event.wait(600):
                        raise AssertionError("loop did not apply a change in 600 s")
                    assert k.done_at is not None
                    lat.append(k.done_at - t)
                if time.monotonic() > deadline:
                    break
            stop.set()
            thread.join(timeout=600)
            out["ipvsctl_loop"] = summary(lat) | {
                "audit_batch": engine.config.audit_batch,
                "drift_found": metrics.value("ipvsctl_drift_repairs_total",
                                             {"kind": "real_server_changed"}) - audits0}
            log(f"{n} services: ipvsctl loop p50 {out['ipvsctl_loop']['p50']} ms "
                f"p99 {out['ipvsctl_loop']['p99']} ms ({len(lat)} changes)")

        # 4. the baseline on the same table
        if baseline_changes:
            bk = _Signal(raw_kernel(ns.name) if ns else impl)
            base = FullResync(bk, NODE, seed=seed)
            now = time.monotonic()
            base.handle(Replace(ObjectKind.SERVICE, services, now))
            base.handle(Replace(ObjectKind.ENDPOINT_SLICE, slices, now))
            lat, total, stats = [], [], []
            prof = cProfile.Profile() if profile else None
            # changes come in pairs that leave the table as it was; one change alone (the
            # biggest sizes, where a resync takes many minutes) is only the "down" half
            steps = (False,) if baseline_changes == 1 else (False, True)
            for i, j in _pairs(rng, n, e, baseline_changes):
                for ready in steps:
                    obj, key, rs = change(i, j, ready)
                    bk.expect(key, rs, 1 if ready else 0)
                    t = time.monotonic()
                    base.handle(Upsert(ObjectKind.ENDPOINT_SLICE, obj, t))
                    if prof is not None and not stats:
                        prof.enable()
                    st = base.sync()
                    if prof is not None and not stats:
                        prof.disable()
                    end = time.monotonic()
                    assert bk.done_at is not None, "baseline did not apply the change"
                    lat.append(bk.done_at - t)
                    total.append(end - t)
                    stats.append(st)
                    log(f"{n} services: baseline change {len(lat)}: done "
                        f"{lat[-1]:.2f}s, resync {total[-1]:.2f}s, {st.calls} calls")
            out["baseline"] = summary(lat) | {
                "resync": summary(total),
                "netlink_calls_per_change": max(s.calls for s in stats),
                "build_s_mean": round(sum(s.build_s for s in stats) / len(stats), 3),
                "setup_s_mean": round(sum(s.setup_s for s in stats) / len(stats), 3),
                "cleanup_s_mean": round(sum(s.cleanup_s for s in stats) / len(stats), 3),
                "client": "bench.ipvsnl (raw netlink)" if ns else "FakeKernel",
            }
            if prof is not None:
                out["baseline_profile"] = profile_text(prof)
            log(f"{n} services: baseline p50 {out['baseline']['p50']} ms "
                f"p99 {out['baseline']['p99']} ms ({len(lat)} changes)")
            close = getattr(bk.impl, "close", None)
            if close and bk.impl is not impl:
                close()
        getattr(impl, "close", lambda: None)()
        return out
    finally:
        if ns:
            ns.close()

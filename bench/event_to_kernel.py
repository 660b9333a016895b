"""Event to kernel, through the daemon as `ipvsctl run` builds it, on one table per size.

Per size (N Services x E endpoints; the real kernel in a fresh network namespace in the lab
VM, the in-memory kernel on the host):

1. the table: either ipvsctl's daemon programs it from empty (`initial`: timed to /readyz,
   and in the VM the lean client primes a scratch namespace with the same table in the
   same run, the yardstick), or the lean client (host: direct writes) programs it first and
   the daemon starts over it (`restart`: time to /readyz, kernel writes counted, beside one
   full-table read through ipvsctl's adapter in the same run);
2. cost of one change: Engine.handle + Engine.sync under the loop's lock (no waiting: the
   work itself; wall and thread CPU per change);
3. event to kernel through the daemon: a producer thread stamps each EndpointSlice change
   as it takes it and puts it on the daemon's queue (bench.harness); the time runs to the
   return of that change's kernel call. Phases: *idle* (nothing draining, the audit as
   configured); *audit* (every audit step forced to be the start of a round: a dump of every
   virtual server plus 20 dest dumps, back to back for the whole phase, instead of once per
   500 steps at 10,000 Services, each paced to ~10% of the time); *draining* (1,000 real
   servers held at weight 0 with connections: the drain check reads all of them every
   second); then the *drain reaction* (held real servers
   released one by one: counts read 0 -> deleted); a *burst* of 1,000 changes put at once;
   *idle CPU* (process CPU and loop steps over a quiet period);
4. the two baselines on the same table, >= 10 changes each where the time allows:
   kube-router's full resync (bench.baseline.FullResync) and kube-proxy's per-Service
   read-and-diff (bench.baseline.PerServiceSync).
Changes come in pairs (down, up) so the table ends as it started.
"""

from __future__ import annotations

import copy
import cProfile
import gc
import io
import math
import os
import pstats
import random
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from bench.baseline import FullResync, PerServiceSync
from bench.cluster import cluster, rs_key, vs_key
from bench.common import log, summary
from bench.harness import NODE, BenchDaemon, Watcher
from bench.kernels import Netns, fake_kernel, netlink_kernel, raw_kernel
from ipvsctl.model import VirtualServer
from ipvsctl.reconcile.paced import Pace
from ipvsctl.source.events import ObjectKind, Replace, Upsert


@dataclass(frozen=True)
class Plan:
    engine_changes: int = 400  # cost-of-a-change samples
    loop_changes: int = 60  # per daemon phase (idle, audit, draining)
    gap: float = 0.3  # random gap before each loop change, 0..gap s
    draining: int = 1000  # real servers held draining
    reactions: int = 20  # drain reaction samples
    burst: int = 1000
    idle_cpu_s: float = 20.0
    baseline_changes: int = 10  # per baseline (minimum wanted)
    baseline_budget_s: float = 300.0  # per baseline: stop after this (and say so)
    phases: bool = True  # False: the table and the daemon's start only
    drain_only: bool = False  # True: of the daemon's phases only draining and its reaction


class Table:
    """The cluster and which endpoints are currently not ready."""

    def __init__(self, n: int, e: int) -> None:
        self.n, self.e = n, e
        self.services, self.slices = cluster(n, e)
        self.down: dict[int, set[int]] = {}

    def key(self, i: int) -> Any:
        return vs_key(self.services[i])

    def rs(self, i: int, j: int) -> Any:
        return rs_key(self.slices[i], j)

    def set(self, i: int, j: int, ready: bool) -> None:
        d = self.down.setdefault(i, set())
        (d.discard if ready else d.add)(j)

    def slice(self, i: int) -> dict[str, Any]:
        out = copy.deepcopy(self.slices[i])
        for j in self.down.get(i, ()):
            out["endpoints"][j]["conditions"] = {
                "ready": False,
                "serving": False,
                "terminating": False,
            }
        return out


def prime(netns: str | None, impl: Any, t: Table) -> float:
    """Program the table without ipvsctl: the lean client in the VM, direct writes to the
    in-memory kernel on the host. Seconds taken."""
    t0 = time.monotonic()
    k = raw_kernel(netns) if netns else impl
    try:
        for i in range(t.n):
            key = t.key(i)
            k.add_virtual_server(VirtualServer(key, "rr", 0), True)
            for j in range(t.e):
                k.add_real_server(key, t.rs(i, j), 1)
    finally:
        if netns:
            k.close()
    return time.monotonic() - t0


def full_read(impl: Any) -> tuple[float, int]:
    """One full-table read through ipvsctl's adapter: every virtual server, then every real
    server in one /proc/net/ip_vs read. (seconds, real servers)"""
    t0 = time.monotonic()
    keys = [vs.key for vs in impl.list_virtual_servers()]
    table = impl.read_real_servers(keys)
    return time.monotonic() - t0, sum(len(v or ()) for v in table.values())


def profile_text(prof: cProfile.Profile, limit: int = 18) -> str:
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.strip_dirs().sort_stats("cumulative").print_stats(limit)
    lines = [ln for ln in out.getvalue().splitlines() if ln.strip()]
    start = next((i for i, ln in enumerate(lines) if "ncalls" in ln), 0)
    return "\n".join(lines[start:])


SAMPLE_EVERY = 0.02 if os.environ.get("IPVSCTL_LAB") == "1" else 0.005  # VM: ~15x slower
BOILERPLATE = (
    "threading.py:",
    "daemon/wiring.py:run",
    "bench/harness.py:counted",
    "reconcile/loop.py:run",
)


class Sampler:
    """A sampling profiler for the daemon's threads (cProfile sees one thread): every
    `every` s, each named thread's stack, classed as idle (waiting for work: a queue or an
    event), waiting for the loop's lock (the innermost line is a `with ... lock`), or busy;
    for busy samples, the share in which each function was on the stack."""

    def __init__(
        self, names: tuple[str, ...] = ("loop", "drain", "audit-reader"), every: float = 0.005
    ):
        # the daemon's threads are named: loop, source, drain, audit-reader, state-writer
        self.names, self.every = names, every
        self.stop = threading.Event()
        self.state: dict[str, Counter[str]] = {n: Counter() for n in names}
        self.inclusive: dict[str, Counter[str]] = {n: Counter() for n in names}
        self.thread = threading.Thread(target=self._run, daemon=True, name="sampler")

    def __enter__(self) -> Sampler:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(5)

    def _run(self) -> None:
        import linecache

        while not self.stop.wait(self.every):
            ids = {t.ident: t.name for t in threading.enumerate() if t.name in self.names}
            for ident, frame in sys._current_frames().items():
                name = ids.get(ident)
                if name is None:
                    continue
                stack = []
                f: Any = frame
                while f is not None:
                    stack.append(f)
                    f = f.f_back
                where = [_where(x) for x in stack]
                line = (
                    linecache.getline(frame.f_code.co_filename, frame.f_lineno)
                    if frame.f_lineno
                    else ""
                )
                if where[0].startswith("threading.py:wait"):  # a queue, event or condition
                    self.state[name]["idle"] += 1
                    continue
                if "with" in line and "lock" in line:
                    self.state[name]["waiting for the lock"] += 1
                    continue
                self.state[name]["busy"] += 1
                for w in dict.fromkeys(where):
                    if not w.startswith(BOILERPLATE):
                        self.inclusive[name][w] += 1

    def report(self, top: int = 8) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in self.names:
            n = sum(self.state[name].values())
            busy = self.state[name]["busy"]
            if not n:
                continue
            out[name] = {
                "samples": n,
                "every_ms": round(self.every * 1000, 1),
                "state_pct": {k: round(100 * c / n, 1) for k, c in self.state[name].items()},
                "busy_on_stack_pct": {
                    w: round(100 * c / busy, 1) for w, c in self.inclusive[name].most_common(top)
                },
            }
        return out


def _where(f: Any) -> str:
    path = f.f_code.co_filename
    short = (
        "/".join(path.split("/")[-2:])
        if "/ipvsctl/" in path or "/bench/" in path
        else path.split("/")[-1]
    )
    return f"{short}:{f.f_code.co_name}"


def _ratio(a: dict[str, Any], b: dict[str, Any], k: str = "p99") -> float | None:
    return round(a[k] / b[k], 2) if a.get(k) and b.get(k) else None


def run_size(
    n: int,
    e: int,
    kernel: str,
    plan: Plan,
    *,
    mode: str = "initial",
    seed: int = 1,
    profile: bool = False,
) -> dict[str, Any]:
    """Everything for one size; see the module docstring. `kernel`: fake (in-memory),
    packed (in-memory, each write also packed and sent as over netlink) or netlink;
    `mode`: initial or restart (how the table gets there, see 1.)."""
    t = Table(n, e)
    ns = Netns() if kernel == "netlink" else None
    rng = random.Random(seed)
    out: dict[str, Any] = {
        "services": n,
        "endpoints_per_service": e,
        "real_servers": n * e,
        "kernel": kernel,
        "mode": mode,
    }
    try:
        impl = netlink_kernel(ns.name) if ns else fake_kernel(packed=kernel == "packed")
        w = Watcher(impl)

        # 1. the table
        if mode == "restart":
            t_prime = prime(ns.name if ns else None, impl, t)
            reads = [full_read(impl) for _ in range(3)]
            t_read = min(r[0] for r in reads)
            assert reads[0][1] == n * e, f"table has {reads[0][1]} real servers"
            log(f"{n} services: primed in {t_prime:.1f}s; one full read {t_read:.3f}s")
        gc.collect()
        bd = BenchDaemon(w, t.services, t.slices)
        writes0 = w.writes
        t_ready = bd.start()
        writes = w.writes - writes0
        if mode == "restart":
            out["restart"] = {
                "prime_seconds": round(t_prime, 3),
                "full_read_seconds": round(t_read, 4),
                "full_read_runs_s": [round(r[0], 4) for r in reads],
                "readyz_seconds": round(t_ready, 3),
                "readyz_over_full_read": round(t_ready / t_read, 1),
                "kernel_writes": writes,
            }
            log(
                f"{n} services: restart to /readyz {t_ready:.2f}s "
                f"({t_ready / t_read:.1f}x one full read), {writes} kernel writes"
            )
        else:
            out["initial_sync"] = {
                "readyz_seconds": round(t_ready, 3),
                "kernel_writes": writes,
                "per_write_ms": round(1000 * t_ready / max(1, writes), 3),
            }
            if ns:
                # Best of two, each into a new namespace: the first prime in a process ran
                # 1.5-2 s slower at 1,000 Services (a cold start the yardstick should not
                # carry); the better one is the stricter yardstick for ipvsctl.
                runs = []
                for _ in range(2):
                    scratch = Netns("benchprime")
                    try:
                        netlink_kernel(scratch.name).close()  # the dummy interface
                        runs.append(prime(scratch.name, None, t))
                    finally:
                        scratch.close()
                out["initial_sync"]["lean_prime_seconds"] = round(min(runs), 3)
                out["initial_sync"]["lean_prime_runs_s"] = [round(r, 3) for r in runs]
                out["initial_sync"]["over_lean"] = round(t_ready / min(runs), 2)
            log(
                f"{n} services: initial sync to /readyz {t_ready:.2f}s, {writes} writes "
                f"{out['initial_sync']}"
            )

        try:
            if plan.phases:
                _daemon_phases(bd, w, t, rng, plan, out, profile)
        finally:
            bd.shutdown()

        # 4. baselines on the same table
        for name, cls in (("baseline", FullResync), ("baseline_kube_proxy", PerServiceSync)):
            if plan.baseline_changes:
                out[name] = _baseline(cls, ns, impl, t, rng, plan, seed, profile)
        getattr(impl, "close", lambda: None)()
        return out
    finally:
        if ns:
            ns.close()


def _loop_changes(
    bd: BenchDaemon, w: Watcher, t: Table, rng: random.Random, count: int, gap: float, pick: Any
) -> list[float]:
    lat: list[float] = []
    for _ in range(max(1, count // 2)):
        i, j = pick()
        for ready in (False, True):
            time.sleep(rng.uniform(0.0, gap))
            t.set(i, j, ready)
            exp = (t.key(i), t.rs(i, j), 1 if ready else 0)
            w.expect(*exp)
            stamp: list[float] = []
            bd.source.send([(t.slice(i), stamp.append)])
            if not w.wait([exp], 600):
                raise AssertionError("the daemon did not apply a change in 600 s")
            lat.append(w.take(exp) - stamp[0])
    return lat


def _send_all(
    bd: BenchDaemon, w: Watcher, t: Table, changes: list[tuple[int, int, bool]], timeout: float
) -> tuple[list[float], float]:
    """Changes on distinct Services put on the queue back to back; per-change latency and
    the time from the first stamp to the last change done."""
    stamps: dict[int, float] = {}
    exps = []
    batch = []
    for i, j, ready in changes:
        t.set(i, j, ready)
        exp = (t.key(i), t.rs(i, j), 1 if ready else 0)
        w.expect(*exp)
        exps.append((i, exp))
        batch.append((t.slice(i), lambda ts, i=i: stamps.__setitem__(i, ts)))
    bd.source.send(batch)
    if not w.wait([x for _, x in exps], timeout):
        raise AssertionError(f"{len(changes)} changes not applied in {timeout} s")
    done = {i: w.take(x) for i, x in exps}
    lat = [done[i] - stamps[i] for i in done]
    return lat, max(done.values()) - min(stamps.values())


def _daemon_phases(
    bd: BenchDaemon,
    w: Watcher,
    t: Table,
    rng: random.Random,
    plan: Plan,
    out: dict[str, Any],
    profile: bool,
) -> None:
    n, e = t.n, t.e
    eng = bd.engine

    def pick_any() -> tuple[int, int]:
        return rng.randrange(n), rng.randrange(e)

    # 2. cost of one change, lock held (no waiting)
    wall, cpu, calls = [], [], []
    prof = cProfile.Profile() if profile else None
    with bd.loop.lock:
        # the first 20 pay for lazy imports and socket set-up; profiled ones come last and
        # are not in the numbers (cProfile slows what it watches)
        profiled = 100 if prof is not None else 0
        for k in range(plan.engine_changes + 20 + profiled):
            i, j = pick_any()
            measured = 20 <= k < plan.engine_changes + 20
            for ready in (False, True):
                t.set(i, j, ready)
                obj = t.slice(i)  # the object as the watch hands it over: not timed
                c0, w0, k0 = time.thread_time(), time.monotonic(), w.calls
                if prof is not None and not measured and k >= 20:
                    prof.enable()
                eng.handle(Upsert(ObjectKind.ENDPOINT_SLICE, obj, w0))
                eng.sync()
                if prof is not None:
                    prof.disable()
                if measured:
                    wall.append(time.monotonic() - w0)
                    cpu.append(time.thread_time() - c0)
                    calls.append(w.calls - k0)
        w.want.clear()
    out["ipvsctl_engine"] = summary(wall) | {
        "cpu": summary(cpu),
        "netlink_calls_per_change": max(calls),
        "note": "Engine.handle + Engine.sync under the loop's lock: the work, no waiting",
    }
    if prof is not None:
        out["ipvsctl_engine_profile"] = profile_text(prof)
    log(
        f"{n} services: one change p50 {out['ipvsctl_engine']['p50']} ms, cpu p50 "
        f"{out['ipvsctl_engine']['cpu']['p50']} ms"
    )

    if not plan.loop_changes:  # the cost of a change only (host part "change")
        return

    # 3. through the daemon
    phases: dict[str, Any] = {}
    if not plan.drain_only:
        _idle_and_audit_phases(bd, w, t, rng, plan, phases, pick_any)
    _draining_phases(bd, w, t, rng, plan, phases, n, e, eng)
    if not plan.drain_only:
        _burst_and_idle_cpu(bd, w, t, rng, plan, phases, n, e, eng)
    out["daemon"] = phases


def _idle_and_audit_phases(
    bd: BenchDaemon,
    w: Watcher,
    t: Table,
    rng: random.Random,
    plan: Plan,
    phases: dict[str, Any],
    pick_any: Any,
) -> None:
    n, eng = t.n, bd.engine
    # every compared phase runs under the sampler, so its cost weighs on all alike
    with Sampler(every=SAMPLE_EVERY) as s:
        lat = _loop_changes(bd, w, t, rng, plan.loop_changes, plan.gap, pick_any)
    phases["idle"] = summary(lat) | {"profile": s.report()}
    log(f"{n} services: daemon idle p50 {phases['idle']['p50']} p99 {phases['idle']['p99']} ms")

    # audit: every step a new round (a dump of every virtual server + 20 dest dumps)
    auditor = eng.audit
    orig_snapshot, orig_read, orig_apply = auditor.snapshot, auditor.read, auditor.apply
    audit_reads: list[float] = []
    locked: list[float] = []  # audit work done holding the loop's lock (snapshot, apply)

    def full_round() -> Any:
        auditor._cursor = []  # force a round start
        t0 = time.monotonic()
        try:
            return orig_snapshot()
        finally:
            locked.append(time.monotonic() - t0)

    def timed_apply(r: Any) -> Any:
        t0 = time.monotonic()
        try:
            return orig_apply(r)
        finally:
            locked.append(time.monotonic() - t0)

    def timed_read(p: Any) -> Any:
        t0 = time.monotonic()
        try:
            return orig_read(p)
        finally:
            audit_reads.append(time.monotonic() - t0)

    auditor.snapshot = full_round  # type: ignore[method-assign]
    auditor.read = timed_read  # type: ignore[method-assign]
    auditor.apply = timed_apply  # type: ignore[method-assign]
    # Back to back for the phase, not paced to ~10% of the time: the changes below always
    # meet an audit's reads (the reader first finishes the pause it is in).
    runner = bd.loop.audit_runner
    orig_pace = runner.pace
    runner.pace = Pace(every=0.0)
    try:
        deadline = time.monotonic() + 600
        while not audit_reads and time.monotonic() < deadline:
            time.sleep(0.05)
        first = bd.loop.events_first
        with Sampler(every=SAMPLE_EVERY) as s:
            reads_before, gave_way = len(audit_reads), first.gave_way
            lat = _loop_changes(bd, w, t, rng, plan.loop_changes, plan.gap, pick_any)
            reads_during = len(audit_reads) - reads_before
            gave_way = first.gave_way - gave_way
    finally:
        runner.pace = orig_pace
        auditor.snapshot, auditor.read, auditor.apply = (  # type: ignore[method-assign]
            orig_snapshot,
            orig_read,
            orig_apply,
        )
    phases["audit"] = summary(lat) | {
        "audit_reads": summary(audit_reads),
        "audit_reads_during_changes": reads_during,
        # times a reader stepped aside for an event (ipvsctl/reconcile/events_first.py)
        "readers_gave_way": gave_way,
        "audit_lock_held": summary(locked),
        "over_idle_p99": _ratio(summary(lat), phases["idle"]),
        "profile": s.report(),
    }
    log(
        f"{n} services: daemon during audit p50 {phases['audit']['p50']} p99 "
        f"{phases['audit']['p99']} ms; audit reads {phases['audit']['audit_reads']}"
    )


def _draining_phases(
    bd: BenchDaemon,
    w: Watcher,
    t: Table,
    rng: random.Random,
    plan: Plan,
    phases: dict[str, Any],
    n: int,
    e: int,
    eng: Any,
) -> None:
    # draining: D real servers held at weight 0 with a connection each
    d = min(plan.draining, n * e // 2)
    per = math.ceil(d / n)
    held = [(i, j) for i in range(n) for j in range(per)][:d]
    w.held |= {(t.key(i), t.rs(i, j)) for i, j in held}
    by_service: dict[int, list[int]] = {}
    for i, j in held:
        by_service.setdefault(i, []).append(j)
    t0 = time.monotonic()
    for i, js in by_service.items():
        for j in js[:-1]:
            t.set(i, j, False)
    # (a Service's other held endpoints ride in the same slice, applied in the same sync)
    _send_all(bd, w, t, [(i, js[-1], False) for i, js in by_service.items()], 3600)
    log(f"{n} services: {d} real servers draining (took {time.monotonic() - t0:.1f}s)")
    time.sleep(2.0)  # a drain check or two with the full queue

    def pick_free() -> tuple[int, int]:
        while True:
            i, j = rng.randrange(n), rng.randrange(e)
            if j not in t.down.get(i, ()):
                return i, j

    with Sampler(every=SAMPLE_EVERY) as s:
        lat = _loop_changes(bd, w, t, rng, plan.loop_changes, plan.gap, pick_free)
    phases["draining"] = summary(lat) | {
        "draining": len(eng.drains.queue),
        "over_idle_p99": _ratio(summary(lat), phases.get("idle", {})),
        "profile": s.report(),
    }
    log(
        f"{n} services: daemon with {len(eng.drains.queue)} draining p50 "
        f"{phases['draining']['p50']} p99 {phases['draining']['p99']} ms"
    )

    # drain reaction: release some held real servers one by one
    sample = rng.sample(held, min(plan.reactions, len(held)))
    released: dict[Any, float] = {}
    with Sampler(every=SAMPLE_EVERY) as s:
        for i, j in sample:
            time.sleep(rng.uniform(0.1, 0.5))
            pair = (t.key(i), t.rs(i, j))
            released[pair] = time.monotonic()
            w.held.discard(pair)
        if not w.wait_deleted(list(released), 120):
            raise AssertionError("released real servers not deleted in 120 s")
    reaction_profile = s.report()
    # what the drain reader measured (its thread's CPU time a read), and chose by; its two
    # counters are checks since the other read's last measure, not totals
    reader = eng.drain_check.reader
    read_costs = {
        "table_cost_s": reader._table_cost,
        "dump_cost_ms": None if reader._dump_cost is None else reader._dump_cost * 1000,
        "table_reads": reader._table_checks,
        "dump_checks": reader._dump_checks,
    }
    log(f"{n} services: drain reads {read_costs}")
    reaction = [w.deleted[p] - r for p, r in released.items()]
    t_rel = time.monotonic()
    rest = set(w.held)
    w.held.clear()
    w.wait_deleted(list(rest), 600)
    phases["drain_reaction"] = summary(reaction) | {
        "draining": d,
        "check_interval_s": 1.0,
        "target_s": 1.5,
        "rest_deleted_s": round(max((w.deleted[p] for p in rest), default=t_rel) - t_rel, 3),
        "reads": read_costs,
        "profile": reaction_profile,
    }
    log(
        f"{n} services: drain reaction p50 {phases['drain_reaction']['p50']} max "
        f"{phases['drain_reaction']['max']} ms; the other {len(rest)} deleted in "
        f"{phases['drain_reaction']['rest_deleted_s']} s"
    )
    # every endpoint ready again (their real servers come back)
    for i, js in by_service.items():
        for j in js[:-1]:
            t.set(i, j, True)
    _send_all(bd, w, t, [(i, js[-1], True) for i, js in by_service.items()], 3600)


def _burst_and_idle_cpu(
    bd: BenchDaemon,
    w: Watcher,
    t: Table,
    rng: random.Random,
    plan: Plan,
    phases: dict[str, Any],
    n: int,
    e: int,
    eng: Any,
) -> None:
    # burst: one change on each of B Services, put on the queue at once
    b = min(plan.burst, n)
    svcs = rng.sample(range(n), b)
    js = {i: rng.randrange(e) for i in svcs}
    with Sampler(("loop",), every=SAMPLE_EVERY) as s:
        lat, total = _send_all(bd, w, t, [(i, js[i], False) for i in svcs], 3600)
    phases["burst"] = summary(lat) | {
        "changes": b,
        "all_done_s": round(total, 3),
        "profile": s.report(),
    }
    _send_all(bd, w, t, [(i, js[i], True) for i in svcs], 3600)
    log(
        f"{n} services: burst of {b}: all done in {total:.2f}s, p50 "
        f"{phases['burst']['p50']} p99 {phases['burst']['p99']} ms"
    )

    # idle CPU: no events, nothing draining; the audit and the reader as configured
    time.sleep(3.0)  # the burst's drains: deleted by now (counts 0)
    c0, s0, t0 = time.process_time(), bd.steps, time.monotonic()
    time.sleep(plan.idle_cpu_s)
    dt = time.monotonic() - t0
    cpu = time.process_time() - c0
    # sampled after the measurement: the sampler costs CPU
    with Sampler(
        ("loop", "drain", "audit-reader", "source", "state-writer"), every=SAMPLE_EVERY
    ) as s:
        time.sleep(min(10.0, plan.idle_cpu_s / 2))
    phases["idle_cpu"] = {
        "seconds": round(dt, 1),
        "cpu_pct_of_one_core": round(100 * cpu / dt, 2),
        "loop_steps_per_s": round((bd.steps - s0) / dt, 2),
        "draining": len(eng.drains.queue),
        "profile": s.report(),
    }
    log(f"{n} services: idle CPU {phases['idle_cpu']}")


def _baseline(
    cls: Any,
    ns: Netns | None,
    impl: Any,
    t: Table,
    rng: random.Random,
    plan: Plan,
    seed: int,
    profile: bool,
) -> dict[str, Any]:
    bk = Watcher(raw_kernel(ns.name) if ns else impl)
    base = cls(bk, NODE, seed=seed)
    now = time.monotonic()
    base.handle(Replace(ObjectKind.SERVICE, t.services, now))
    base.handle(Replace(ObjectKind.ENDPOINT_SLICE, [t.slice(i) for i in range(t.n)], now))
    lat, total, stats = [], [], []
    prof = cProfile.Profile() if profile else None
    deadline = time.monotonic() + plan.baseline_budget_s
    stopped = False
    while len(lat) < plan.baseline_changes:
        i, j = rng.randrange(t.n), rng.randrange(t.e)
        for ready in (False, True):
            t.set(i, j, ready)
            exp = (t.key(i), t.rs(i, j), 1 if ready else 0)
            bk.expect(*exp)
            t0 = time.monotonic()
            base.handle(Upsert(ObjectKind.ENDPOINT_SLICE, t.slice(i), t0))
            if prof is not None and not stats:
                prof.enable()
            st = base.sync()
            if prof is not None and not stats:
                prof.disable()
            end = time.monotonic()
            lat.append(bk.take(exp) - t0)
            total.append(end - t0)
            stats.append(st)
        if time.monotonic() > deadline:
            stopped = len(lat) < plan.baseline_changes
            break
    name = cls.__name__
    out = summary(lat) | {
        "style": name,
        "resync": summary(total),
        "netlink_calls_per_change": max(s.calls for s in stats),
        "build_s_mean": round(sum(s.build_s for s in stats) / len(stats), 3),
        "walk_s_mean": round(sum(s.setup_s + s.cleanup_s for s in stats) / len(stats), 3),
        "client": "devkit.ipvsnl (raw netlink)" if ns else "in-memory kernel",
        "stopped_by_budget": stopped,
    }
    if prof is not None:
        out["profile"] = profile_text(prof)
    log(
        f"{t.n} services: {name} p50 {out['p50']} p99 {out['p99']} ms ({len(lat)} changes"
        f"{', budget hit' if stopped else ''}), {out['netlink_calls_per_change']} calls"
    )
    if ns:
        bk.impl.close()
    return out

"""The benchmark code at smoke size (`make bench-smoke`), so it does not rot: event to
kernel through the daemon (every phase) and both baselines, and the daemon's memory run
against the fake API server in another process, all on the in-memory kernel. Checks shapes,
not speed: benchmarks never fail a build on their numbers."""

from __future__ import annotations

import json
import threading

from bench import run
from bench.cluster import cluster, rs_key, vs_key
from bench.harness import BenchDaemon, Watcher
from bench.kernels import fake_kernel
from ipvsctl.reconcile.loop import LoopConfig


def test_bench_smoke_runs_every_host_part(tmp_path):
    assert run.main(["smoke", "--out", str(tmp_path)]) == 0

    e2k = json.loads((tmp_path / "e2k.json").read_text())
    sizes = e2k["result"]["sizes"]
    assert [(s["services"], s["mode"]) for s in sizes] == [(50, "initial"), (300, "restart")]
    first, second = sizes
    assert first["initial_sync"]["kernel_writes"] == 50 * 11  # one VS + 10 RS each
    # a restart over an unchanged table writes nothing
    assert second["restart"]["kernel_writes"] == 0
    assert second["restart"]["full_read_seconds"] > 0
    for s in sizes:
        assert s["ipvsctl_engine"]["netlink_calls_per_change"] == 1
        assert s["ipvsctl_engine"]["n"] >= 40
        d = s["daemon"]
        for phase in ("idle", "audit", "draining"):
            assert d[phase]["n"] >= 4, phase
        assert d["draining"]["draining"] >= 40  # the held drains were queued meanwhile
        assert d["drain_reaction"]["n"] == 3
        assert d["burst"]["n"] == d["burst"]["changes"] == 30
        assert 0 < d["idle_cpu"]["loop_steps_per_s"] < 50  # no busy loop
        # kube-router's baseline touches every endpoint of every Service on every change;
        # kube-proxy's reads every Service (about three calls each)
        assert s["baseline"]["netlink_calls_per_change"] > 20 * s["services"]
        kp = s["baseline_kube_proxy"]["netlink_calls_per_change"]
        assert 3 * s["services"] <= kp < 4 * s["services"]
        assert s["baseline"]["n"] >= 2 and s["baseline_kube_proxy"]["n"] >= 2
    assert "ncalls" in second["ipvsctl_engine_profile"]
    assert "loop" in second["daemon"]["draining"]["profile"]

    mem = json.loads((tmp_path / "memory.json").read_text())["result"]
    # A version merged in the backlog and flipped back reaches no kernel (both unobserved)
    unseen = 2 * mem["events_merged_in_backlog"]
    assert mem["events_applied"] + unseen >= mem["watch_events"] == 300
    assert mem["events_applied"] >= 200
    assert mem["rss_peak_mb"] > 0 and mem["cpu_total_s"] > 0


def test_bench_daemon_is_built_like_the_daemon_and_does_not_spin():
    """The bench's loop is `ipvsctl run`'s (39a1816 left the bench's own Loop without
    save_queue: with a drain queued it stepped ~40,000 times a second)."""
    services, slices = cluster(5, 2)
    w = Watcher(fake_kernel())
    bd = BenchDaemon(w, services, slices)
    assert bd.loop.save_queue is not None
    assert bd.loop.config == LoopConfig(drain_check_interval=1.0)
    try:
        bd.start(timeout=60)
        assert {t.name for t in bd.daemon.threads} >= {"loop", "drain", "state-writer"}
        # a real server drains and stays queued (held: it reads one active connection)
        key, rs = vs_key(services[0]), rs_key(slices[0], 0)
        w.held.add((key, rs))
        w.expect(key, rs, 0)
        sl = json.loads(json.dumps(slices[0]))
        sl["endpoints"][0]["conditions"] = {"ready": False, "serving": False, "terminating": False}
        bd.source.send([(sl, None)])
        assert w.wait([(key, rs, 0)], 60)
        assert len(bd.engine.drains.queue) == 1
        steps = bd.steps
        threading.Event().wait(1.5)  # a window to count the loop's steps in
        assert bd.steps - steps < 30
        assert len(bd.engine.drains.queue) == 1
    finally:
        bd.shutdown()

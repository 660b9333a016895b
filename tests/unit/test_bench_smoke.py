"""The benchmark code at smoke size (`make bench-smoke`), so it does not rot: event to
kernel for ipvsctl and the full-resync baseline, and the daemon's memory run against the
fake API server in another process, all on the in-memory kernel. Checks shapes, not speed:
benchmarks never fail a build on their numbers."""

from __future__ import annotations

import json

from bench import run


def test_bench_smoke_runs_every_host_part(tmp_path):
    assert run.main(["smoke", "--out", str(tmp_path)]) == 0

    e2k = json.loads((tmp_path / "e2k.json").read_text())
    sizes = e2k["result"]["sizes"]
    assert [s["services"] for s in sizes] == [50, 300]
    for s in sizes:
        assert s["initial_sync"]["ops"] == s["services"] * 11  # one VS + 10 RS each
        assert s["ipvsctl_engine"]["netlink_calls_per_change"] == 1
        assert s["ipvsctl_engine"]["n"] >= 40 and s["ipvsctl_loop"]["n"] >= 2
        # the baseline touches every Service on every change
        assert s["baseline"]["netlink_calls_per_change"] > 20 * s["services"]
    assert "ncalls" in sizes[-1]["ipvsctl_engine_profile"]

    mem = json.loads((tmp_path / "memory.json").read_text())["result"]
    assert mem["events_applied"] >= mem["watch_events"] == 300
    assert mem["rss_peak_mb"] > 0 and mem["cpu_total_s"] > 0

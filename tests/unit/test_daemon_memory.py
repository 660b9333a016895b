"""The daemon's peak memory at 10,000 Services and 100,000 endpoints, through the initial
list and 2,000 EndpointSlice updates paced at 100 a second (paced: a backlog's size would
follow the machine's load, not the code). The daemon in its own process, the fake API
server in another, the in-memory kernel; the peak RSS (VmHWM) of a fresh process. A guard
against regression at today's measure (149 MB with updates at 50 a second on 2026-11-28;
160-172 MB with 10,000 updates as fast as sent on 2026-11-27: docs/benchmarks.md)."""

from __future__ import annotations

from bench.memory import run_memory

GUARD_MB = 170


def test_the_daemon_at_10000_services_peaks_under_its_guard() -> None:
    r = run_memory(10_000, 10, 2_000, rate=100.0, timeout=900)
    assert r["events_applied"] + r["events_merged_in_backlog"] >= 1_000  # the updates came
    assert r["rss_peak_mb"] <= GUARD_MB, r

"""`plan` on a live cluster's dump at 10,000 Services and 100,000 endpoints (a `kind: List`
as kubectl prints it, managedFields and all) stays within 300 MB at its peak, from a YAML
file and JSON on a pipe. Measured as the peak RSS (VmHWM) of a fresh
process: not timing-dependent (read whole, the YAML took 2.4 GB and the JSON 482 MB)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.plan_memory import dumps, run_plan

PEAK_MB = 300


@pytest.fixture(scope="module")
def cluster_dumps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return dumps(tmp_path_factory.mktemp("dumps"), 10_000, 10)


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_plan_of_a_10000_service_cluster_peaks_under_300_mb(
    cluster_dumps: dict[str, Path], fmt: str
) -> None:
    r = run_plan(cluster_dumps[fmt], stdin=fmt == "json")  # kubectl ... -o json | plan -f -
    assert r["exit_code"] == 0 and r["stderr_lines"] == 0
    assert r["peak_rss_mb"] <= PEAK_MB, r

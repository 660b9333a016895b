"""/metrics basics: build info, process metrics, and no `_created` series."""

from __future__ import annotations

import ipvsctl
from ipvsctl.obs.metrics import Metrics


def test_build_info_process_metrics_and_no_created_series():
    m = Metrics()
    m.real_server_deletions.labels("udp").inc()
    m.watch_restarts.labels("services", "error").inc()
    m.event_to_kernel.observe(0.01)
    text = m.render().decode()
    assert m.value("ipvsctl_build_info", {"version": ipvsctl.__version__}) == 1
    assert m.value("process_resident_memory_bytes") > 0
    assert "process_cpu_seconds_total" in text
    assert "_created" not in text
    assert m.value("ipvsctl_real_server_deletions_total", {"reason": "udp"}) == 1


def test_two_registries_each_have_their_own_collectors():
    """Tests make a Metrics per daemon: the process collector must not clash."""
    a, b = Metrics(), Metrics()
    assert a.value("ipvsctl_build_info", {"version": ipvsctl.__version__}) == 1
    assert b.value("process_open_fds") > 0

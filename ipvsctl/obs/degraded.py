"""Named degraded conditions: the daemon works, but a part of it keeps failing.

Readiness is not failed for them (what still works keeps serving: the IPVS table is
programmed, drains run), but each is said in `/readyz`'s body and as the gauge
`ipvsctl_degraded{condition}` (1 while it holds), so it is never only a counter that grows.
"""

from __future__ import annotations

import threading

from prometheus_client import Gauge

# condition -> what it means, for /readyz and docs/reference.md
CONDITIONS = {
    "nftables": "nftables pushes are failing: masquerading, source ranges and the port "
    "filter may be missing or stale",
    "state_write": "the drain state file cannot be written: a restart would lose deadlines",
    "audit": "the kernel drift audit is raising: hand-made changes are not put right",
    "source": "the API server's lists or watches keep failing: the table is kept as it is, "
    "and Service and endpoint changes do not reach it",
    "table_restores": "another program keeps removing the IPVS table (kube-proxy starting on "
    "this node?): each time the daemon puts it back, and connections wait meanwhile",
}


class Degraded:
    """Thread-safe: each condition is set by the thread that sees it fail and cleared by the
    same one when it works again."""

    def __init__(self, gauge: Gauge) -> None:
        self._gauge = gauge
        self._lock = threading.Lock()
        self._active: dict[str, str] = {}
        for name in CONDITIONS:
            gauge.labels(name).set(0)

    def set(self, condition: str, error: object | None) -> None:
        """`error` None: the condition no longer holds; else it does, for that reason."""
        if condition not in CONDITIONS:
            raise ValueError(f"unknown degraded condition {condition!r}")
        with self._lock:
            if error is None:
                self._active.pop(condition, None)
            else:
                self._active[condition] = " ".join(str(error).split())[:200]
            self._gauge.labels(condition).set(0 if error is None else 1)

    def active(self) -> dict[str, str]:
        """The conditions that hold, with the last error of each, sorted by name."""
        with self._lock:
            return dict(sorted(self._active.items()))

"""kube-proxy's own health answer on `--healthz-bind-address` (KEP-3836,
`pkg/proxy/healthcheck/proxy_health.go`), as a pure function. Cloud load balancers of
`externalTrafficPolicy: Cluster` Services probe `:10256/healthz` on every node.

- healthy: no change has waited longer than `timeout` to reach the kernel (kube-proxy:
  the oldest queued update is not older than healthTimeout), and the loop is turning;
- `/healthz`: 200 when healthy and the node is eligible (not being deleted, none of
  `--draining-taints`, its network not unavailable: `source/node.py`'s `leaving_reasons`),
  else 503; the body carries `nodeEligible`;
- `/livez`: 200 when healthy, else 503 (node eligibility does not matter).

Body, as kube-proxy's: `{"lastUpdated": T, "currentTime": T, "nodeEligible": bool (healthz
only), "healthy": bool}`, Go's RFC 3339 times in UTC. As kube-proxy, `lastUpdated` is the
current time when the answer is 200 (older clients read it as "the proxy synced recently"),
else the last complete sync (Go's zero time if there was none).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

ZERO_TIME = "0001-01-01T00:00:00Z"


def go_time(wall: float | None) -> str:
    """Epoch seconds -> RFC 3339 as Go's encoding/json writes a UTC time."""
    if wall is None:
        return ZERO_TIME
    text = datetime.fromtimestamp(wall, UTC).isoformat(timespec="microseconds")
    return text.replace("+00:00", "Z")


@dataclass(frozen=True, slots=True)
class ProxyState:
    """What the answer depends on, read from the running daemon."""

    now: float  # wall clock
    monotonic: float
    heartbeat: float  # monotonic: the loop's last turn
    pending_since: float | None  # monotonic: oldest change not yet in the kernel
    last_updated: float | None  # wall: last complete sync
    node_eligible: bool
    timeout: float


def healthy(s: ProxyState) -> bool:
    if s.monotonic - s.heartbeat > s.timeout:
        return False  # a stuck loop applies nothing, whatever is queued
    return s.pending_since is None or s.monotonic - s.pending_since <= s.timeout


def answer(path: str, s: ProxyState) -> tuple[int, dict[str, Any]]:
    """(HTTP code, JSON body) for `/healthz` or `/livez`."""
    ok = healthy(s)
    ok_code = ok and (s.node_eligible or path != "/healthz")
    body: dict[str, Any] = {
        "lastUpdated": go_time(s.now if ok_code else s.last_updated),
        "currentTime": go_time(s.now),
    }
    if path == "/healthz":
        body["nodeEligible"] = s.node_eligible
    body["healthy"] = ok
    return (200 if ok_code else 503), body

"""Timings and sizes of the API client, grouped so tests can shrink them in one place."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class KubeSettings:
    page_size: int = 500
    """Objects per list page (`limit`); `continue` fetches the rest, so a list of 100,000
    endpoints is never one huge JSON document in memory."""

    watch_list: bool = False
    """Get the initial state by WatchList (`sendInitialEvents`, KEP-3157) instead of a list,
    falling back to lists for good when the server does not offer it. Off by default: lists
    from the watch cache are what every supported server does; WatchList is for servers
    where it is known to be on (a beta feature of recent servers)."""

    watch_timeout: float = 300.0
    """Server-side watch timeout: each watch asks for timeoutSeconds in [T, 2T), jittered so
    that nodes do not re-watch in lockstep."""

    read_slack: float = 30.0
    """The client read timeout of a watch is timeoutSeconds plus this: a healthy stream ends
    (server timeout) before it fires, a half-open one does not."""

    watch_read_timeout: float | None = None
    """Override of the watch read timeout (tests: a server sending frequent bookmarks)."""

    connect_timeout: float = 5.0
    list_read_timeout: float = 60.0
    """Read timeout of each list page."""

    backoff_initial: float = 0.8
    backoff_max: float = 30.0
    backoff_reset: float = 120.0
    backoff_jitter: float = 1.0
    """Reconnect backoff, client-go's reflector's (`NewExponentialBackoffManager(800ms, 30s,
    2m, 2.0, 1.0)`): doubling from initial to max, each delay times [1, 1 + jitter); reset
    only by time, when no retry was needed for backoff_reset seconds. A `Retry-After` on a
    429 or 503 (API Priority and Fairness) lengthens a delay, up to backoff_max."""

    probe_interval: float = 3.0
    """While a backoff pause is longer than this, `/readyz` is probed every probe_interval
    (jittered 0.5-1.5x; one probe shared by all reflectors), so a node notices the API
    server's return within ~probe_interval instead of after up to backoff_max. 0: never."""

    recovery_spread: float = 3.0
    """Once the probe sees the server back, the retry waits a random 0..recovery_spread:
    the nodes of a cluster come back spread out, and each within ~10 s of the server."""

    probe_timeout: float = 2.0

    relist_spread_per_node: float = 0.02
    """A relist after an outage (the resumed watch was too old) waits a random
    0..relist_spread_per_node x the nodes seen in EndpointSlices: ~20 s at 1,000 nodes,
    ~100 s at 5,000, so a recovering API server serves ~50 lists/s instead of all at once.
    An outage shorter than the server's watch history needs no relist and is not spread."""

    healthy_watch_seconds: float = 10.0
    """A watch counts as working when it stayed open this long: then a clean end re-watches
    at once and a 410 relists at once. One that ended sooner, whatever it delivered first (a
    bookmark, an object, then a 410 or garbled JSON), is no progress and is retried with
    the backoff, so a misbehaving server cannot spin us (real watches last 300-600 s)."""

    degraded_after: int = 5
    """List-and-watch attempts of one resource that fail in a row, with no watch working
    `healthy_watch_seconds` between, before the daemon says its source is degraded
    (`/readyz`'s body, ipvsctl_degraded{condition="source"}): four backoff periods, 12-24 s
    after the first failure at the default backoff. A single failure or a 410's relist says
    nothing; an API server restart longer than that shows until its watches work again."""

    join_timeout: float = 5.0
    """How long `run()` waits for its threads after `stop` (they are daemon threads)."""

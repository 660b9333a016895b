"""What a reflector does after its watch ended: how long to wait (not at all, the backoff,
or a cluster-sized random spread) and whether to list again. Pure: the reflector
(watch.py) measures and classifies, this decides; the table in test_watch_retry.py is
the rule.

As client-go's reflector: only a watch that made progress (delivered an object or a
bookmark, or lasted its healthy time) resets the backoff, so a server that lists fine but
breaks every watch is not relisted in a loop, and an ERROR event is no sign of a working
watch. A 410 relists at once the first time, with backoff if it repeats, and spread over
the cluster when it follows an outage (every node is in the same place). A transient error
(connection, 429, 5xx) resumes the watch from the last resourceVersion when there is one:
an outage shorter than the server's watch history costs each node a watch, not a list.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

# Reasons for a watch restart (the `reason` label of ipvsctl_watch_restarts_total).
CLOSED = "closed"  # the stream ended cleanly (server timeout): re-watch, no relist
EXPIRED = "expired"  # 410 Gone: relist
TIMEOUT = "timeout"  # no data within the read timeout (half-open connection): relist
ERROR = "error"  # connection refused/reset, HTTP error, bad data: relist
SUSPECT = "suspect"  # a list that cannot be the whole truth (see ListCheck): kept out, retried


class Wait(enum.Enum):
    NOW = "now"
    BACKOFF = "backoff"  # the backoff's next delay (counts a failure)
    HERD = "herd"  # a random spread sized by the cluster's nodes


@dataclass(frozen=True, slots=True)
class Retry:
    wait: Wait
    relist: bool  # list again before watching (else resume from the resourceVersion)
    expired_streak: int  # 410s in a row without progress, this one included


def decide_retry(
    reason: str,
    *,
    progress: bool,
    expired_streak: int,
    backed_off: bool,
    transient: bool,
    have_version: bool,
) -> Retry:
    """`reason`: why the watch ended; `progress`: it made some (then the caller resets its
    backoff); `expired_streak`: 410s in a row before this one; `backed_off`: the backoff
    had counted failures before this end; `transient`: the error is a connection's or an
    overloaded server's; `have_version`: there is a resourceVersion to resume from."""
    if progress:
        expired_streak, backed_off = 0, False
    if reason == EXPIRED:
        expired_streak += 1
        if expired_streak > 1:
            wait = Wait.BACKOFF
        elif backed_off:
            wait = Wait.HERD
        else:
            wait = Wait.NOW
    elif reason == CLOSED and progress:
        wait = Wait.NOW
    else:
        wait = Wait.BACKOFF
    relist = reason in (EXPIRED, SUSPECT) or (
        reason in (ERROR, TIMEOUT) and not (transient and have_version)
    )
    return Retry(wait, relist, expired_streak)

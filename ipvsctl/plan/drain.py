"""The drain check: which queued real servers of one virtual server can go now. Pure."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from ipvsctl.model import (
    ConnCounts,
    DeadlineSource,
    DrainEntry,
    Protocol,
    RealServerKey,
    RealServerStatus,
)
from ipvsctl.plan.ops import DeleteRealServer, DeletionReason, ForgetDrain


def wants_conn_states(entry: DrainEntry, status: RealServerStatus) -> bool:
    """Only a TCP real server whose connections are all inactive (ActiveConn 0, InActConn
    > 0) can be drained by looking at them: TIME_WAIT and CLOSE ones carry no data."""
    return (
        entry.vs.protocol is Protocol.TCP and status.active_conns == 0 and status.inactive_conns > 0
    )


def all_closed(counts: ConnCounts, status: RealServerStatus) -> bool:
    """The connection table agrees with the counts read just before it: none open, and at
    least as many closed as InActConn said (fewer means the two reads disagree, e.g. an
    entry that did not parse: wait for the next check rather than delete early)."""
    return counts.open == 0 and counts.closed >= status.inactive_conns


def deadline_passed(entry: DrainEntry, now: float, pod_gone_after: float = -math.inf) -> bool:
    """Whether the drain's deadline has passed. A `pod_gone` one (the grace after its
    endpoint left every slice) also waits for `pod_gone_after`: the grace counts only
    time the EndpointSlices were watched, so an endpoint whose slice re-pack's second
    half came late (a watch broken and re-opened, a relist) is never taken for a pod
    that is gone (CONTRACT.md "Draining", rule 3)."""
    if now < entry.deadline:
        return False
    return entry.deadline_source is not DeadlineSource.POD_GONE or now >= pod_gone_after


def check_drains(
    queued: Mapping[RealServerKey, DrainEntry],
    observed: Iterable[RealServerStatus] | None,
    now: float,
    conns: Mapping[RealServerKey, ConnCounts] | None = None,
    pod_gone_after: float = -math.inf,
) -> list[DeleteRealServer | ForgetDrain]:
    """`observed` is one read of the virtual server's real servers (None: the virtual
    server is gone). A real server goes as drained when ActiveConn and InActConn are both 0,
    or when its connections, read from the connection table (`conns`, None when it was not
    read), are all closed (TIME_WAIT, CLOSE); else when its deadline has passed (reason
    `pod_gone` when the deadline was the grace after its pod left, else `deadline`; a
    `pod_gone` one not before `pod_gone_after`: `deadline_passed`)."""
    if observed is None:
        return [ForgetDrain(e.vs, e.rs) for _, e in sorted(queued.items())]
    by_key = {s.key: s for s in observed}
    ops: list[DeleteRealServer | ForgetDrain] = []
    for rs, entry in sorted(queued.items()):
        status = by_key.get(rs)
        counts = conns.get(rs) if conns is not None else None
        if status is None:
            ops.append(ForgetDrain(entry.vs, rs))
        elif status.connections == 0 or (
            counts is not None and wants_conn_states(entry, status) and all_closed(counts, status)
        ):
            ops.append(DeleteRealServer(entry.vs, rs, DeletionReason.DRAINED))
        elif deadline_passed(entry, now, pod_gone_after):
            reason = (
                DeletionReason.POD_GONE
                if entry.deadline_source is DeadlineSource.POD_GONE
                else DeletionReason.DEADLINE
            )
            ops.append(DeleteRealServer(entry.vs, rs, reason))
    return ops

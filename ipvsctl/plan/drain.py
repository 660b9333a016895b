"""The drain check: which queued real servers of one virtual server can go now. Pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ipvsctl.model import DrainEntry, RealServerKey, RealServerStatus
from ipvsctl.plan.ops import DeleteRealServer, DeletionReason, ForgetDrain, Op


def check_drains(
    queued: Mapping[RealServerKey, DrainEntry],
    observed: Iterable[RealServerStatus] | None,
    now: float,
) -> list[Op]:
    """`observed` is one dump of the virtual server's real servers (None: the virtual
    server is gone). A real server goes when ActiveConn and InActConn are both 0, or when
    its deadline has passed, whichever comes first."""
    if observed is None:
        return [ForgetDrain(e.vs, e.rs) for _, e in sorted(queued.items())]
    by_key = {s.key: s for s in observed}
    ops: list[Op] = []
    for rs, entry in sorted(queued.items()):
        status = by_key.get(rs)
        if status is None:
            ops.append(ForgetDrain(entry.vs, rs))
        elif status.connections == 0:
            ops.append(DeleteRealServer(entry.vs, rs, DeletionReason.DRAINED))
        elif now >= entry.deadline:
            ops.append(DeleteRealServer(entry.vs, rs, DeletionReason.DEADLINE))
    return ops

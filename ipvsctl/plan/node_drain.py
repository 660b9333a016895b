"""Node drain: when this node's lifecycle hook may let the machine go. Pure.

A node that is leaving (`source/node.py`'s `leaving_reasons`: deletion, a draining taint,
its network unavailable) answers 503 on kube-proxy's `/healthz`, so cloud load balancers
stop sending it new connections once their probes have failed enough times: that takes up
to `lb_grace` (a load balancer's probe interval times its unhealthy threshold). The node is
**quiesced** when it has been draining for at least `lb_grace` and a reading of the kernel
table taken after the grace ended shows no connection established through its NodePort,
load-balancer or external-IP virtual servers (connections through cluster IPs come from
pods and hosts inside the cluster, which the pods' own drains take care of).

Established, as the kernel table counts it: IPVS's ActiveConn of every real server of those
virtual servers (TCP and SCTP connections in ESTABLISHED; UDP has none). A virtual server
that is itself draining (its Service deleted) is still one of them while it is in the table.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ipvsctl.model import RealServerStatus, VirtualServerKind


def entered_from_outside(kind: VirtualServerKind) -> bool:
    """Virtual servers whose connections come through this node from outside the cluster
    (the load balancer's, or clients of a NodePort or an external IP)."""
    return kind is not VirtualServerKind.CLUSTER_IP


def established(real_servers: Iterable[RealServerStatus]) -> int:
    return sum(rs.active_conns for rs in real_servers)


@dataclass(frozen=True, slots=True)
class NodeDrainState:
    reasons: tuple[str, ...]  # why it is draining; empty: it is not
    draining_for: float  # seconds since it began draining (0 when not draining)
    lb_grace: float
    established: int | None  # at the last reading (None: not read yet)
    read_after_grace: bool  # that reading was taken after the grace ended

    @property
    def draining(self) -> bool:
        return bool(self.reasons)

    @property
    def quiesced(self) -> bool:
        return (
            self.draining
            and self.draining_for >= self.lb_grace
            and self.read_after_grace
            and self.established == 0
        )

    def to_json(self) -> dict[str, Any]:
        """`/v1/node-quiesced`'s body."""
        return {
            "draining": self.draining,
            "quiesced": self.quiesced,
            "established": self.established,
            "unhealthy_for": round(self.draining_for, 3),
            "lb_grace": self.lb_grace,
            "reasons": list(self.reasons),
        }


def node_drain_state(
    reasons: tuple[str, ...],
    since: float | None,
    now: float,
    lb_grace: float,
    established: int | None,
    read_at: float | None,
) -> NodeDrainState:
    """`since`: when the node began draining; `read_at`: when the last reading (`established`)
    began; all on one monotonic clock."""
    draining_for = max(0.0, now - since) if reasons and since is not None else 0.0
    after = (
        bool(reasons) and since is not None and read_at is not None and read_at >= since + lb_grace
    )
    return NodeDrainState(reasons, draining_for, lb_grace, established, after)

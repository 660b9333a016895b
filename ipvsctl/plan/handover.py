"""Handing this node over to another proxy without a cut (CONTRACT.md "Beside another
proxy"). Pure.

Once a handover is asked, ipvsctl adds nothing new to the kernel: a Service keeps at most
the virtual servers, and in each the real servers, that ipvsctl held when it was asked
(`held_of`, `narrow`). Drains and deletions go on as before, and what another program
removes (kube-proxy's start-up cleanup, an `ipvsadm -C`) is put back, since it is still
held. Another proxy started on the node (kube-proxy's nftables DNAT comes before IPVS) takes
every new connection meanwhile.

The node is handed over when a reading of the kernel's table begun after the request shows
no connection open through any of ipvsctl's virtual servers (`open_connections`): none
established (IPVS's ActiveConn) and none that may still carry data (SYN, FIN_WAIT,
CLOSE_WAIT, LAST_ACK in ip_vs_conn: a half-closed download is still a download), as a drain
counts them; closed ones (TIME_WAIT, CLOSE) carry nothing. Then everything ipvsctl owns
goes (`release_ops`: its virtual servers, with the addresses they bound) and it stays idle.
UDP has no connection state in IPVS and holds nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from ipvsctl.model import (
    AppliedVirtualServer,
    ConnScan,
    DesiredService,
    RealServerKey,
    RealServerStatus,
    ServiceKey,
    ServiceRef,
)
from ipvsctl.plan.ops import DeleteVirtualServer


class Phase(StrEnum):
    SERVING = "serving"
    HANDING_OVER = "handing_over"  # asked: adds nothing new, waits for the last connection
    HANDED_OVER = "handed_over"  # everything ipvsctl owned is gone; idle until a restart


Held = Mapping[ServiceKey, frozenset[RealServerKey]]
"""What ipvsctl held when the handover was asked: each virtual server and its real servers."""


def held_of(applied: Mapping[ServiceRef, Mapping[ServiceKey, AppliedVirtualServer]]) -> Held:
    return {
        key: frozenset(state.weights)
        for states in applied.values()
        for key, state in states.items()
    }


def narrow(desired: DesiredService, held: Held) -> DesiredService:
    """The Service as it may still be programmed during a handover: only what was held.
    A Service left with no virtual server asks for nothing else either (no health check
    port: the other proxy serves it)."""
    kept = {}
    changed = False
    for key, dvs in desired.virtual_servers.items():
        real_servers = held.get(key)
        if real_servers is None:
            changed = True
            continue
        rs = tuple(r for r in dvs.real_servers if r in real_servers)
        if len(rs) != len(dvs.real_servers):
            changed = True
            dvs = replace(dvs, real_servers=rs)
        kept[key] = dvs
    if not changed:
        return desired
    if not kept:
        return replace(desired, virtual_servers={}, health_check_node_port=None)
    return replace(desired, virtual_servers=kept)


@dataclass(frozen=True, slots=True)
class OpenConnections:
    established: int  # ActiveConn, summed
    closing: int  # SYN, FIN_WAIT, CLOSE_WAIT, LAST_ACK

    @property
    def total(self) -> int:
        return self.established + self.closing


def inactive_pairs(
    table: Mapping[ServiceKey, list[RealServerStatus] | None],
) -> list[tuple[ServiceKey, RealServerKey]]:
    """The (virtual, real server) pairs whose inactive connections must be read by state
    (the others have none that could still carry data)."""
    return [(key, rs.key) for key, rss in table.items() for rs in rss or () if rs.inactive_conns]


def open_connections(
    table: Mapping[ServiceKey, list[RealServerStatus] | None], scan: ConnScan | None
) -> OpenConnections | None:
    """The connections still open through these virtual servers; None when it cannot be
    told: one of them is not in the kernel (another program removed it, kube-proxy's
    start-up cleanup: its connections wait in the kernel's trash until it is put back), or
    the connection table was needed and not read, or not read whole."""
    if any(rss is None for rss in table.values()):
        return None
    established = sum(rs.active_conns for rss in table.values() for rs in rss or ())
    pairs = inactive_pairs(table)
    if not pairs:
        return OpenConnections(established, 0)
    if scan is None or not scan.trustworthy:
        return None
    wanted = set(pairs)
    closing = sum(c.closing for pair, c in scan.counts.items() if pair in wanted)
    return OpenConnections(established, closing)


def due(phase: Phase, requested_at: float | None, read_at: float | None, open_: int | None) -> bool:
    """Hand over now: asked, and a reading begun after the request found nothing open
    (`read_at`, `requested_at`: one monotonic clock)."""
    return (
        phase is Phase.HANDING_OVER
        and requested_at is not None
        and read_at is not None
        and read_at >= requested_at
        and open_ == 0
    )


def release_ops(
    applied: Mapping[ServiceRef, Mapping[ServiceKey, AppliedVirtualServer]],
) -> list[tuple[ServiceRef, list[DeleteVirtualServer]]]:
    """Every virtual server ipvsctl holds deleted, each with the address it bound (once no
    other uses it). Not counted as deletions of real servers: nothing was cut."""
    return [
        (
            ref,
            [
                DeleteVirtualServer(key, state.bind_address, 0)
                for key, state in sorted(states.items(), key=lambda kv: kv[0])
            ],
        )
        for ref, states in sorted(applied.items(), key=lambda kv: kv[0])
        if states
    ]


@dataclass(frozen=True, slots=True)
class HandoverState:
    phase: Phase
    asked_for: float  # seconds since it was asked (0 when serving)
    open: OpenConnections | None  # at the last reading after the request (None: none yet)
    virtual_servers: int  # ipvsctl's in the kernel, as applied

    def to_json(self) -> dict[str, Any]:
        """`/v1/handover`'s body."""
        return {
            "phase": self.phase.value,
            "handed_over": self.phase is Phase.HANDED_OVER,
            "asked_for": round(self.asked_for, 3),
            "established": self.open.established if self.open else None,
            "closing": self.open.closing if self.open else None,
            "virtual_servers": self.virtual_servers,
        }

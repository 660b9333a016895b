"""The engine's state as JSON values: `/status` (and `ipvsctl status --json`'s daemon
part) and `/v1/quiesced`. Reads the engine through its read-only view; the caller holds the
loop's lock."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ipvsctl.model import ConnCounts, DrainEntry, ServiceRef
from ipvsctl.reconcile.view import EngineView


def engine_status(view: EngineView) -> dict[str, Any]:
    """The whole document at once (tests, `Daemon.status`); /status streams the same
    document a few Services at a time (status_http.py)."""
    now = view.wall()
    out: list[dict[str, Any]] = []
    for ref in sorted(view.services()):
        out += service_status(view, ref, now)
    return {
        "node": view.node.node_name,
        "ready": view.started,
        "virtual_servers": out,
        "drain_queue": [drain_json(e, now) for e in view.drain_queue()],
        **table_json(view),
    }


def table_json(view: EngineView) -> dict[str, Any]:
    """How full the node's table is, and the Services refused whole (`plan`'s shape; the
    first 1,000 by namespace/name; `skipped_total` counts them all)."""
    used, limit = view.table()
    skipped, count = view.skipped()
    return {
        "table": {"entries": used, "limit": limit},
        "skipped": [
            {"kind": "Service", "namespace": ref.namespace, "name": ref.name, "reason": why}
            for ref, why in skipped
        ],
        "skipped_total": count,
    }


def service_status(view: EngineView, ref: ServiceRef, now: float) -> list[dict[str, Any]]:
    """One Service's virtual servers (none if it has none applied)."""
    out: list[dict[str, Any]] = []
    applied = view.applied(ref)
    if not applied:
        return out
    desired = view.desired(ref)
    endpoints: Mapping[str, Any] = desired.endpoints if desired else {}
    for key, state in sorted(applied.items()):
        dvs = desired.virtual_servers.get(key) if desired else None
        rss = []
        for rs, weight in sorted(state.weights.items()):
            meta = endpoints.get(rs.address)
            entry = view.draining(key, rs)
            # A removed endpoint's pod is only remembered by its drain entry.
            pod = (meta.pod if meta else None) or (entry.pod if entry else None)
            counts = view.drain_counts(key, rs) if entry else None
            rss.append(
                {
                    "address": rs.address,
                    "port": rs.port,
                    "weight": weight,
                    "pod": str(pod) if pod else None,
                    "node": meta.node_name if meta else None,
                    "state": "draining" if entry else "active",
                    # Read by the drain check; only draining ones are read at all.
                    "active_conns": counts[0] if counts else None,
                    "inactive_conns": counts[1] if counts else None,
                    "drain": (
                        drain_json(entry, now, counts, view.drain_conns(key, rs)) if entry else None
                    ),
                }
            )
        out.append(
            {
                "protocol": key.protocol.value,
                "address": key.address,
                "port": key.port,
                "scheduler": state.vs.scheduler,
                "persistent_timeout": state.vs.persistent_timeout,
                "service": str(ref),
                "port_name": dvs.port_name if dvs else None,
                "kind": dvs.kind.value if dvs else None,
                # It left the Service's wanted set and drains: `status` shows it as
                # "(deleted) namespace/name" (CONTRACT.md "Draining").
                "draining": view.draining_virtual_server(key) is not None,
                "real_servers": rss,
            }
        )
    return out


def drain_json(
    e: DrainEntry,
    now: float,
    counts: tuple[int, int] | None = None,
    conns: ConnCounts | None = None,
) -> dict[str, Any]:
    d = e.to_json()
    d["age"] = round(max(0.0, now - e.since), 3)
    # None: no deadline, its pod's lifetime bounds it (deadline_source "pod")
    d["time_left"] = round(max(0.0, e.deadline - now), 3) if e.has_deadline else None
    if counts is not None:
        # ActiveConn is the established count; the rest is split only when the
        # connection table was read for this real server (null: not known).
        d["connections"] = (
            conns.to_json()
            if conns is not None
            else {
                "established": counts[0],
                "closing": 0 if counts[1] == 0 else None,
                "closed": 0 if counts[1] == 0 else None,
            }
        )
    return d


def quiesced_json(view: EngineView, address: str) -> dict[str, Any]:
    """`/v1/quiesced?ip=`: whether this node still sends new connections to `address`, and
    since when not (a pod's shutdown barrier asks every node)."""
    now = view.wall()
    q = view.quiesced(address)
    started = view.started
    return {
        "ip": address,
        "node": view.node.node_name,
        "ready": started,
        "quiesced": started and q.live == 0,
        "real_servers_with_weight": q.live,
        "since": q.since,
        "for_seconds": round(now - q.since, 3) if q.since else None,
    }

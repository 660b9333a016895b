"""Text and JSON renderings of plans and status. Pure."""

from __future__ import annotations

from typing import Any

from ipvsctl.cli.output import columns, hostport
from ipvsctl.model import DesiredService, DesiredVirtualServer, ServiceKey
from ipvsctl.model.ipvs import sched_flag_names
from ipvsctl.model.keys import RealServerKey, address_order


def _rs_order(rs: RealServerKey) -> tuple[tuple[int, int], int]:
    return (address_order(rs.address), rs.port)


def plan_json(plan: list[tuple[DesiredService, DesiredVirtualServer]]) -> dict[str, Any]:
    """Everything `plan_text(wide=True)` shows, and more."""

    def endpoint(rs: RealServerKey, desired: DesiredService) -> dict[str, Any]:
        info = desired.endpoints.get(rs.address)
        return {
            "address": rs.address,
            "port": rs.port,
            "weight": 1,
            "pod": str(info.pod) if info and info.pod else None,
            "node": info.node_name if info else None,
        }

    return {
        "virtual_servers": [
            {
                **(
                    {"scheduler_flags": sched_flag_names(dvs.vs.sched_flags)}
                    if dvs.vs.sched_flags
                    else {}
                ),
                "protocol": dvs.key.protocol.value,
                "address": dvs.key.address,
                "port": dvs.key.port,
                "scheduler": dvs.vs.scheduler,
                "persistent_timeout": dvs.vs.persistent_timeout,
                "service": str(desired.ref),
                "port_name": dvs.port_name,
                "kind": dvs.kind.value,
                "traffic_policy_local": dvs.local_only,
                "source_ranges": list(dvs.source_ranges) if dvs.source_ranges is not None else None,
                "real_servers": [
                    endpoint(rs, desired) for rs in sorted(dvs.real_servers, key=_rs_order)
                ],
            }
            for desired, dvs in plan
        ]
    }


def plan_text(plan: list[tuple[DesiredService, DesiredVirtualServer]], wide: bool = False) -> str:
    """ipvsadm -Ln's shape, with each virtual server's Kubernetes meaning beside it; `wide`
    adds traffic policy Local, source ranges and each endpoint's node."""
    if not plan:
        return "no virtual servers\n"
    vs_rows = [
        ["Prot", "LocalAddress:Port", "Sched", "Persist", "Service"]
        + (["Local", "SourceRanges"] if wide else [])
    ]
    rs_rows: list[list[str]] = [
        ["  -> RemoteAddress:Port", "Weight", "Pod"] + (["Node"] if wide else [])
    ]
    order: list[tuple[str, int]] = []  # ("vs"|"rs"|"none", row index)
    for desired, dvs in plan:
        key: ServiceKey = dvs.key
        persist = str(dvs.vs.persistent_timeout) if dvs.vs.persistent_timeout else "-"
        svc = f"{desired.ref}:{dvs.port_name}" if dvs.port_name else str(desired.ref)
        row = [
            key.protocol.value,
            hostport(key.address, key.port),
            dvs.vs.scheduler,
            persist,
            f"{svc} ({dvs.kind.value})",
        ]
        if wide:
            ranges = ",".join(dvs.source_ranges) if dvs.source_ranges is not None else "-"
            row += ["yes" if dvs.local_only else "-", ranges]
        vs_rows.append(row)
        order.append(("vs", len(vs_rows) - 1))
        if not dvs.real_servers:
            order.append(("none", 0))
        for rs in sorted(dvs.real_servers, key=_rs_order):
            info = desired.endpoints.get(rs.address)
            pod = str(info.pod) if info and info.pod else "-"
            rrow = [f"  -> {hostport(rs.address, rs.port)}", "1", pod]
            if wide:
                rrow.append(info.node_name or "-" if info else "-")
            rs_rows.append(rrow)
            order.append(("rs", len(rs_rows) - 1))
    vs_lines = columns(vs_rows)
    rs_lines = columns(rs_rows, right=frozenset({1}))
    lines = [vs_lines[0], rs_lines[0]]
    for what, i in order:
        lines.append(
            vs_lines[i] if what == "vs" else rs_lines[i] if what == "rs" else "  (no endpoints)"
        )
    return "\n".join(lines) + "\n"

"""Text and JSON renderings of plans and status. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ipvsctl.cli.output import columns, hostport
from ipvsctl.model import DesiredService, DesiredVirtualServer, ServiceKey
from ipvsctl.model.ipvs import sched_flag_names, sched_flag_words
from ipvsctl.model.keys import RealServerKey, address_order
from ipvsctl.plan.skipped import Skipped, counts

Plan = list[tuple[DesiredService, DesiredVirtualServer]]


def _rs_order(rs: RealServerKey) -> tuple[tuple[int, int], int]:
    return (address_order(rs.address), rs.port)


def local_fallback(desired: DesiredService, dvs: DesiredVirtualServer, node_name: str) -> bool:
    """Traffic policy Local with no endpoint on this node: the virtual server has the
    cluster-wide ones, as kube-proxy's IPVS mode (plan/desired.py)."""
    if not dvs.local_only or not dvs.real_servers:
        return False
    return all(
        (info := desired.endpoints.get(rs.address)) is None or info.node_name != node_name
        for rs in dvs.real_servers
    )


def _sched(dvs: DesiredVirtualServer) -> str:
    words = sched_flag_words(dvs.vs.scheduler, dvs.vs.sched_flags)
    return f"{dvs.vs.scheduler}({','.join(words)})" if words else dvs.vs.scheduler


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:g}s"


def plan_json(
    plan: Plan, skipped: Sequence[Skipped] = (), node_name: str | None = None
) -> dict[str, Any]:
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
                "traffic_policy_local_fallback": (
                    node_name is not None and local_fallback(desired, dvs, node_name)
                ),
                "source_ranges": list(dvs.source_ranges) if dvs.source_ranges is not None else None,
                "health_check_node_port": desired.health_check_node_port,
                "drain_timeout": desired.drain_timeout,
                "real_servers": [
                    endpoint(rs, desired) for rs in sorted(dvs.real_servers, key=_rs_order)
                ],
            }
            for desired, dvs in plan
        ],
        "skipped": [s.to_json() for s in skipped],
    }


def skipped_line(skipped: Sequence[Skipped]) -> str:
    """The default view's one line: how many of each kind were skipped."""
    if not skipped:
        return ""
    parts = ", ".join(f"{n} {kind}" for kind, n in sorted(counts(skipped).items()))
    return f"skipped {len(skipped)} (no virtual server): {parts}; -o wide says why\n"


def skipped_text(skipped: Sequence[Skipped]) -> str:
    """`-o wide`'s list: each object read that makes no virtual server, and why."""
    if not skipped:
        return ""
    rows = [["Skipped", "Namespace/Name", "Why"]] + [
        [s.kind or "-", f"{s.namespace}/{s.name}" if s.namespace else s.name, s.reason]
        for s in skipped
    ]
    return "\n" + "\n".join(columns(rows)) + "\n"


def plan_text(
    plan: Plan,
    wide: bool = False,
    skipped: Sequence[Skipped] = (),
    node_name: str | None = None,
    *,
    details: bool = True,
) -> str:
    """ipvsadm -Ln's shape, with each virtual server's Kubernetes meaning beside it; `wide`
    adds traffic policy Local, source ranges, the healthCheckNodePort and the drain timeout
    annotation, and each endpoint's node, and lists what was skipped (the default view
    counts it in one line). `details`: the scheduler's flags (`mh(mh-port)`), those two
    columns and the Local fallback's note."""
    tail = skipped_text(skipped) if wide else skipped_line(skipped)
    if not plan:
        return "no virtual servers\n" + tail
    vs_rows = [
        ["Prot", "LocalAddress:Port", "Sched", "Persist", "Service"]
        + (["Local", "SourceRanges"] if wide else [])
        + (["HealthCheck", "DrainTimeout"] if wide and details else [])
    ]
    rs_rows: list[list[str]] = [
        ["  -> RemoteAddress:Port", "Weight", "Pod"] + (["Node"] if wide else [])
    ]
    order: list[tuple[str, int]] = []  # ("vs"|"rs"|"none"|"fallback", row index)
    for desired, dvs in plan:
        key: ServiceKey = dvs.key
        persist = str(dvs.vs.persistent_timeout) if dvs.vs.persistent_timeout else "-"
        svc = f"{desired.ref}:{dvs.port_name}" if dvs.port_name else str(desired.ref)
        row = [
            key.protocol.value,
            hostport(key.address, key.port),
            _sched(dvs) if details else dvs.vs.scheduler,
            persist,
            f"{svc} ({dvs.kind.value})",
        ]
        if wide:
            ranges = ",".join(dvs.source_ranges) if dvs.source_ranges is not None else "-"
            row += ["yes" if dvs.local_only else "-", ranges]
            if details:
                hc = desired.health_check_node_port
                row += [str(hc) if hc else "-", _seconds(desired.drain_timeout)]
        vs_rows.append(row)
        order.append(("vs", len(vs_rows) - 1))
        if details and node_name is not None and local_fallback(desired, dvs, node_name):
            order.append(("fallback", 0))
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
    fallback = (
        f"  (Local, but no endpoint on {node_name}: the cluster-wide ones, as kube-proxy's "
        "IPVS mode; the healthCheckNodePort's 503 keeps load balancers away)"
    )
    text = {"none": "  (no endpoints)", "fallback": fallback}
    for what, i in order:
        lines.append(vs_lines[i] if what == "vs" else rs_lines[i] if what == "rs" else text[what])
    return "\n".join(lines) + "\n" + tail

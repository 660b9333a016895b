"""Text and JSON renderings of plans and status. Pure."""

from __future__ import annotations

from typing import Any

from ipvsctl.model import DesiredService, DesiredVirtualServer, ServiceKey
from ipvsctl.model.ipvs import sched_flag_names


def _hostport(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def plan_json(plan: list[tuple[DesiredService, DesiredVirtualServer]]) -> dict[str, Any]:
    return {"virtual_servers": [
        {
            **({"scheduler_flags": sched_flag_names(dvs.vs.sched_flags)}
               if dvs.vs.sched_flags else {}),
            "protocol": dvs.key.protocol.value,
            "address": dvs.key.address,
            "port": dvs.key.port,
            "scheduler": dvs.vs.scheduler,
            "persistent_timeout": dvs.vs.persistent_timeout,
            "service": str(desired.ref),
            "port_name": dvs.port_name,
            "real_servers": [
                {"address": rs.address, "port": rs.port, "weight": 1}
                for rs in sorted(dvs.real_servers)
            ],
        }
        for desired, dvs in plan
    ]}


def plan_text(plan: list[tuple[DesiredService, DesiredVirtualServer]]) -> str:
    """ipvsadm -Ln's shape, with each virtual server's Kubernetes meaning beside it."""
    if not plan:
        return "no virtual servers\n"
    lines = [f"{'Prot':<5}{'LocalAddress:Port':<42}{'Sched':<7}{'Persist':<9}Service"]
    for desired, dvs in plan:
        key: ServiceKey = dvs.key
        persist = str(dvs.vs.persistent_timeout) if dvs.vs.persistent_timeout else "-"
        svc = f"{desired.ref}:{dvs.port_name}" if dvs.port_name else str(desired.ref)
        lines.append(f"{key.protocol.value:<5}{_hostport(key.address, key.port):<42}"
                     f"{dvs.vs.scheduler:<7}{persist:<9}{svc} ({dvs.kind.value})")
        if not dvs.real_servers:
            lines.append("  (no endpoints)")
        for rs in sorted(dvs.real_servers):
            pod = desired.endpoints.get(rs.address)
            who = f"  {pod.pod}" if pod and pod.pod else ""
            lines.append(f"  -> {_hostport(rs.address, rs.port):<40}weight 1{who}")
    return "\n".join(lines) + "\n"

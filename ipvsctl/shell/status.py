"""`ipvsctl status`: the kernel's table joined with the daemon's Kubernetes view. The join
and the rendering are pure; fetching (HTTP, netlink) happens in the CLI."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from ipvsctl.model import VirtualServerStatus


def fetch_daemon_status(endpoint: str, timeout: float = 3.0) -> tuple[dict | None, str | None]:
    url = endpoint.rstrip("/") + "/status"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return json.loads(resp.read()), None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return None, f"daemon not reachable at {endpoint}: {reason}"


def _vs_key(d: dict[str, Any]) -> tuple[str, str, int]:
    return (d["protocol"], d["address"], int(d["port"]))


def join_status(
    kernel: list[VirtualServerStatus] | None,
    kernel_error: str | None,
    daemon: dict[str, Any] | None,
    daemon_error: str | None,
    endpoint: str,
) -> dict[str, Any]:
    """One document: every virtual server in the kernel (or, if the kernel cannot be
    read, in the daemon's view), with the daemon's meaning where it has one."""
    known = {_vs_key(v): v for v in (daemon or {}).get("virtual_servers", [])}
    out: list[dict[str, Any]] = []
    if kernel is not None:
        for vss in kernel:
            key = (vss.vs.key.protocol.value, vss.vs.key.address, vss.vs.key.port)
            d = known.get(key, {})
            drs = {(r["address"], r["port"]): r for r in d.get("real_servers", [])}
            out.append({
                "protocol": key[0], "address": key[1], "port": key[2],
                "scheduler": vss.vs.scheduler,
                "persistent_timeout": vss.vs.persistent_timeout,
                "service": d.get("service"), "port_name": d.get("port_name"),
                "kind": d.get("kind"),
                "real_servers": [
                    {
                        "address": r.key.address, "port": r.key.port, "weight": r.weight,
                        "active_conns": r.active_conns, "inactive_conns": r.inactive_conns,
                        "pod": drs.get((r.key.address, r.key.port), {}).get("pod"),
                        "state": drs.get((r.key.address, r.key.port), {}).get(
                            "state", "active" if r.weight > 0 else "unknown"),
                        "drain": drs.get((r.key.address, r.key.port), {}).get("drain"),
                    }
                    for r in vss.real_servers
                ],
            })
    else:
        for d in sorted(known.values(), key=_vs_key):
            out.append({**d, "real_servers": [
                {**r, "active_conns": None, "inactive_conns": None}
                for r in d.get("real_servers", [])]})
    out.sort(key=_vs_key)
    return {
        "node": (daemon or {}).get("node"),
        "daemon": {"endpoint": endpoint, "reachable": daemon is not None,
                   "ready": (daemon or {}).get("ready"), "error": daemon_error},
        "kernel": {"readable": kernel is not None, "error": kernel_error},
        "virtual_servers": out,
        "drain_queue": (daemon or {}).get("drain_queue", []),
    }


def _hostport(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def _secs(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}s" if v >= 10 else f"{v:.1f}s"


def _conns(drain: dict[str, Any]) -> str:
    """", connections 0 established/1 closing/3 closed" ("?" where not known)."""
    c = drain.get("connections")
    if not c:
        return ""
    n = ["?" if c.get(k) is None else str(c[k]) for k in ("established", "closing", "closed")]
    return f"; connections {n[0]} established/{n[1]} closing/{n[2]} closed"


def render_status(doc: dict[str, Any]) -> str:
    lines = []
    d = doc["daemon"]
    if d["reachable"]:
        lines.append(f"daemon: {d['endpoint']} ({'ready' if d['ready'] else 'not ready'})"
                     + (f", node {doc['node']}" if doc.get("node") else ""))
    else:
        lines.append(f"daemon: NOT REACHABLE ({d['error']}); showing the kernel table only")
    if not doc["kernel"]["readable"]:
        lines.append(f"kernel: not readable ({doc['kernel']['error']}); "
                     "showing the daemon's view without connection counts")
    lines.append("")
    lines.append(f"{'Prot':<5}{'LocalAddress:Port':<30}{'Sched':<7}{'Persist':<9}Service")
    lines.append(f"  {'-> RemoteAddress:Port':<33}{'Weight':>6} {'ActiveConn':>10} "
                 f"{'InActConn':>9}  Pod / drain")
    for v in doc["virtual_servers"]:
        svc = v.get("service") or "(not ipvsctl's)"
        if v.get("service") and v.get("port_name"):
            svc += f":{v['port_name']}"
        persist = str(v["persistent_timeout"]) if v.get("persistent_timeout") else "-"
        lines.append(f"{v['protocol']:<5}{_hostport(v['address'], v['port']):<30}"
                     f"{v['scheduler']:<7}{persist:<9}{svc}")
        for r in v["real_servers"]:
            ac = "-" if r.get("active_conns") is None else str(r["active_conns"])
            ic = "-" if r.get("inactive_conns") is None else str(r["inactive_conns"])
            note = r.get("pod") or ""
            dr = r.get("drain")
            if dr:
                note = (f"{note} DRAINING ({dr['reason']}, age {_secs(dr.get('age'))}, "
                        f"{_secs(dr.get('time_left'))} left{_conns(dr)})").strip()
            lines.append(f"  -> {_hostport(r['address'], r['port']):<31}{r['weight']:>6} "
                         f"{ac:>10} {ic:>9}  {note}")
    q = doc.get("drain_queue") or []
    lines.append("")
    lines.append(f"drain queue: {len(q)}")
    for e in q:
        lines.append(
            f"  {e['protocol']} {_hostport(e['vip'], e['vport'])} -> "
            f"{_hostport(e['address'], e['port'])}  {e.get('service') or '-'}  "
            f"pod {e.get('pod') or '-'}  reason {e['reason']}  age {_secs(e.get('age'))}  "
            f"left {_secs(e.get('time_left'))} (deadline from {e['deadline_source']})")
    return "\n".join(lines) + "\n"

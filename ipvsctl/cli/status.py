"""`ipvsctl status`: the kernel's table joined with the daemon's Kubernetes view. The join
and the rendering are pure; fetching (HTTP, netlink) happens in the CLI."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from ipvsctl.cli.output import columns, hostport
from ipvsctl.httpd import direct_opener
from ipvsctl.model import VirtualServerStatus


def fetch_daemon_status(
    endpoint: str,
    timeout: float = 3.0,
) -> tuple[dict[str, Any] | None, str | None]:
    url = endpoint.rstrip("/") + "/status"
    try:
        with direct_opener().open(url, timeout=timeout) as resp:
            return json.loads(resp.read()), None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return None, f"daemon not reachable at {endpoint}: {reason}"


def endpoint_is_local(endpoint: str) -> bool:
    """Whether the daemon at `endpoint` runs on this machine (loopback or one of its own
    addresses, which are the only ones a socket can bind to): only then is its view joined
    with this machine's kernel table."""
    host = urllib.parse.urlsplit(endpoint if "//" in endpoint else f"//{endpoint}").hostname
    if not host:
        return False
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError:
        return False
    for family, _, _, _, sockaddr in infos:
        try:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.bind((sockaddr[0], 0, *sockaddr[2:]))
        except OSError:
            return False
    return bool(infos)


def _vs_key(d: dict[str, Any]) -> tuple[str, str, int]:
    return (d["protocol"], d["address"], int(d["port"]))


def join_status(
    kernel: list[VirtualServerStatus] | None,
    kernel_error: str | None,
    daemon: dict[str, Any] | None,
    daemon_error: str | None,
    endpoint: str,
    remote: bool = False,
) -> dict[str, Any]:
    """One document: every virtual server in the kernel (or, if the kernel cannot be
    read, in the daemon's view), with the daemon's meaning where it has one. `remote`: the
    daemon is on another machine, so this machine's kernel was not read (kernel is None)."""
    known = {_vs_key(v): v for v in (daemon or {}).get("virtual_servers", [])}
    out: list[dict[str, Any]] = []
    if kernel is not None:
        for vss in kernel:
            key = (vss.vs.key.protocol.value, vss.vs.key.address, vss.vs.key.port)
            d = known.get(key, {})
            drs = {(r["address"], r["port"]): r for r in d.get("real_servers", [])}
            out.append(
                {
                    "protocol": key[0],
                    "address": key[1],
                    "port": key[2],
                    "scheduler": vss.vs.scheduler,
                    "persistent_timeout": vss.vs.persistent_timeout,
                    "service": d.get("service"),
                    "port_name": d.get("port_name"),
                    "kind": d.get("kind"),
                    "draining": bool(d.get("draining")),
                    "real_servers": [
                        {
                            "address": r.key.address,
                            "port": r.key.port,
                            "weight": r.weight,
                            "active_conns": r.active_conns,
                            "inactive_conns": r.inactive_conns,
                            "pod": drs.get((r.key.address, r.key.port), {}).get("pod"),
                            "node": drs.get((r.key.address, r.key.port), {}).get("node"),
                            "state": drs.get((r.key.address, r.key.port), {}).get(
                                "state", "active" if r.weight > 0 else "unknown"
                            ),
                            "drain": drs.get((r.key.address, r.key.port), {}).get("drain"),
                        }
                        for r in vss.real_servers
                    ],
                }
            )
    else:
        for d in sorted(known.values(), key=_vs_key):
            # A remote daemon's counts (its drain checks') are all there is; a local
            # daemon's would be mistaken for the unreadable kernel's.
            out.append(
                {
                    **d,
                    "real_servers": [
                        r if remote else {**r, "active_conns": None, "inactive_conns": None}
                        for r in d.get("real_servers", [])
                    ],
                }
            )
    out.sort(key=_vs_key)
    return {
        "node": (daemon or {}).get("node"),
        "daemon": {
            "endpoint": endpoint,
            "reachable": daemon is not None,
            "ready": (daemon or {}).get("ready"),
            "error": daemon_error,
        },
        "kernel": {
            "readable": kernel is not None,
            "error": kernel_error,
            "machine": "remote" if remote else "local",
        },
        "virtual_servers": out,
        "drain_queue": (daemon or {}).get("drain_queue", []),
        # the node's table against --max-table-entries, and the Services refused whole
        "table": (daemon or {}).get("table"),
        "skipped": (daemon or {}).get("skipped", []),
        "skipped_total": (daemon or {}).get("skipped_total", 0),
    }


TABLE_SHOWN_AT = 0.8  # of --max-table-entries: `status` shows the table's size from here
CONNECTIONS_SHOWN = 20  # per draining real server, for `status --connections`


def draining_pairs(doc: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(virtual server, real server) entries of the joined document that are draining."""
    return [(v, r) for v in doc["virtual_servers"] for r in v["real_servers"] if r.get("drain")]


Listing = dict[tuple[tuple[str, str, int], tuple[str, int]], tuple[list[Any], int]]


def read_draining_connections(
    doc: dict[str, Any], limit: int = CONNECTIONS_SHOWN, path: str | None = None
) -> tuple[Listing | None, str | None]:
    """The draining real servers' connections, at most `limit` each, from one streamed
    pass over this machine's /proc/net/ip_vs_conn; (None, why) when it cannot be read."""
    from ipvsctl.kernel.port import KernelError
    from ipvsctl.kernel.procfs.ipvs import CONN_FILE, read_connection_list
    from ipvsctl.model import Protocol, RealServerKey, ServiceKey

    pairs: dict[tuple[ServiceKey, RealServerKey], tuple[tuple[str, str, int], tuple[str, int]]]
    pairs = {}
    for v, r in draining_pairs(doc):
        try:
            vs = ServiceKey(Protocol(v["protocol"]), str(v["address"]), int(v["port"]))
            rs = RealServerKey(str(r["address"]), int(r["port"]))
        except (KeyError, TypeError, ValueError):
            continue
        pairs[(vs, rs)] = (_vs_key(v), (rs.address, rs.port))
    if not pairs:
        return {}, None
    try:
        scan = read_connection_list(pairs, limit, path=path or CONN_FILE)
    except KernelError as exc:
        return None, str(exc)
    return {label: (scan.shown[key], scan.more[key]) for key, label in pairs.items()}, None


def attach_connections(
    doc: dict[str, Any],
    listing: Listing | None,
    error: str | None,
    limit: int = CONNECTIONS_SHOWN,
) -> None:
    """Each draining real server gets `connection_list`: its connections (client, state,
    expires), at most `limit`, and how many `more`; or the `error` saying why none."""
    for v, r in draining_pairs(doc):
        if listing is None:
            r["connection_list"] = {"error": error, "limit": limit}
            continue
        shown, more = listing.get((_vs_key(v), (r["address"], int(r["port"]))), ([], 0))
        r["connection_list"] = {
            "connections": [
                {"client": c.client, "state": c.state, "expires": c.expires} for c in shown
            ],
            "more": more,
            "limit": limit,
        }


def _connection_lines(listing: dict[str, Any]) -> list[str]:
    if listing.get("error"):
        return [f"       connections not read: {listing['error']}"]
    conns = listing.get("connections") or []
    out = [f"       {c['client']:<24} {c['state']:<12} expires in {c['expires']}s" for c in conns]
    if listing.get("more"):
        out.append(f"       ... {listing['more']} more (at most {listing['limit']} shown)")
    if not conns and not listing.get("more"):
        out.append("       (no connections)")
    return out


def _secs(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}s" if v >= 10 else f"{v:.1f}s"


def _conns(drain: dict[str, Any]) -> str:
    """ ", connections 0 established/1 closing/3 closed" ("?" where not known)."""
    c = drain.get("connections")
    if not c:
        return ""
    n = ["?" if c.get(k) is None else str(c[k]) for k in ("established", "closing", "closed")]
    return f"; connections {n[0]} established/{n[1]} closing/{n[2]} closed"


def render_status(doc: dict[str, Any], wide: bool = False) -> str:
    """ipvsadm -Ln's shape with pods and drains; `wide` adds each real server's node and
    each drain's deadline source."""
    lines = []
    d = doc["daemon"]
    k = doc["kernel"]
    if d["reachable"]:
        lines.append(
            f"daemon: {d['endpoint']} ({'ready' if d['ready'] else 'not ready'})"
            + (f", node {doc['node']}" if doc.get("node") else "")
        )
    else:
        lines.append(f"daemon: NOT REACHABLE ({d['error']}); showing the kernel table only")
    if k.get("machine") == "remote":
        lines.append(
            "kernel: not read: the daemon is on another machine, so this is its own "
            "view (connection counts only for draining real servers)"
        )
    elif not k["readable"]:
        lines.append(
            f"kernel: not readable ({k['error']}); "
            "showing the daemon's view without connection counts"
        )
    lines.append("")
    vs_rows = [["Prot", "LocalAddress:Port", "Sched", "Persist", "Service"]]
    rs_rows = [
        ["  -> RemoteAddress:Port", "Weight", "ActiveConn", "InActConn"]
        + (["Node"] if wide else [])
        + ["Pod / drain"]
    ]
    order: list[tuple[bool, int]] = []  # (is a virtual server, row index)
    below: dict[int, list[str]] = {}  # real server row -> its connections (--connections)
    for v in doc["virtual_servers"]:
        svc = v.get("service") or "(not ipvsctl's)"
        if v.get("service") and v.get("port_name"):
            svc += f":{v['port_name']}"
        if v.get("service") and v.get("draining"):
            svc = f"(deleted) {v['service']}"
        persist = str(v["persistent_timeout"]) if v.get("persistent_timeout") else "-"
        vs_rows.append(
            [v["protocol"], hostport(v["address"], v["port"]), v["scheduler"], persist, svc]
        )
        order.append((True, len(vs_rows) - 1))
        for r in v["real_servers"]:
            ac = "-" if r.get("active_conns") is None else str(r["active_conns"])
            ic = "-" if r.get("inactive_conns") is None else str(r["inactive_conns"])
            note = r.get("pod") or ""
            dr = r.get("drain")
            if dr:
                source = f", deadline from {dr['deadline_source']}" if wide else ""
                note = (
                    f"{note} DRAINING ({dr['reason']}, age {_secs(dr.get('age'))}, "
                    f"{_bound(dr, source)}{_conns(dr)})"
                ).strip()
            row = [f"  -> {hostport(r['address'], r['port'])}", str(r["weight"]), ac, ic]
            rs_rows.append(row + ([r.get("node") or "-"] if wide else []) + [note])
            order.append((False, len(rs_rows) - 1))
            if r.get("connection_list") is not None:
                below[len(rs_rows) - 1] = _connection_lines(r["connection_list"])
    vs_lines = columns(vs_rows)
    rs_lines = columns(rs_rows, right=frozenset({1, 2, 3}))
    lines += [vs_lines[0], rs_lines[0]]
    for is_vs, i in order:
        lines.append(vs_lines[i] if is_vs else rs_lines[i])
        if not is_vs:
            lines += below.get(i, [])
    # The table's size once it nears --max-table-entries (the alert's 80%), and the
    # Services refused whole: nothing when neither is so.
    table = doc.get("table")
    skipped = doc.get("skipped") or []
    if table and (skipped or table["entries"] >= TABLE_SHOWN_AT * table["limit"]):
        lines.append("")
        lines.append(f"table: {table['entries']} of {table['limit']} entries (--max-table-entries)")
    if skipped:
        total = doc.get("skipped_total") or len(skipped)
        more = f" (the first {len(skipped)} shown)" if total > len(skipped) else ""
        lines.append(f"refused services: {total}{more}")
        lines += [f"  {s['namespace']}/{s['name']}: {s['reason']}" for s in skipped]
    q = doc.get("drain_queue") or []
    lines.append("")
    lines.append(f"drain queue: {len(q)}")
    for e in q:
        lines.append(
            f"  {e['protocol']} {hostport(e['vip'], e['vport'])} -> "
            f"{hostport(e['address'], e['port'])}  {e.get('service') or '-'}  "
            f"pod {e.get('pod') or '-'}  reason {e['reason']}  age {_secs(e.get('age'))}  "
            + (
                f"left {_secs(e.get('time_left'))} (deadline from {e['deadline_source']})"
                if e.get("time_left") is not None
                else _bound(e, "")
            )
        )
    return "\n".join(lines) + "\n"


def _bound(drain: dict[str, Any], source: str) -> str:
    """What bounds a drain: "until its pod goes" (no deadline of its own: the endpoint is
    still listed as terminating), else the time left (and, wide, where it comes from)."""
    if drain.get("time_left") is None:
        return "until its pod goes"
    gone = ", its pod is gone" if drain.get("deadline_source") == "pod_gone" else ""
    return f"{_secs(drain.get('time_left'))} left{gone}{source}"

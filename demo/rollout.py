"""The rollout demo, run inside the lab VM (`make demo`):

    python -m demo.rollout [--out out/demo] [--modes drain,nodrain,halfclose]

For each mode, on a fresh node (network namespace with its own IPVS table):
- ipvsctl's Daemon runs in-process on the node's NetlinkKernel, following an in-process
  FakeAPIServer (the real `kubernetes` client, the real wire protocol);
- a Deployment `web` of three pods (v1) sits behind the ClusterIP 10.96.0.10:80, each pod a
  network namespace with a small HTTP server (demo/app.py);
- a client pod sends steady short requests through the ClusterIP and keeps three
  long-lived keep-alive connections open (demo/clients.py);
- the controller (demo/cluster.py) rolls the Deployment to v2 one pod at a time, the way
  the Deployment and EndpointSlice controllers and the kubelet do.

`drain` is ipvsctl as shipped. `nodrain` is the contrast: real servers are deleted at once
(`--drain-timeout 0` and the Service annotation `ipvsctl.io/drain-timeout: "0"`), as a proxy
without graceful termination does. `halfclose` is `drain` plus one half-closed download
(demo/clients.py HalfClosed): its client shuts down its write side right after the request
while the server keeps sending until `--half-close-until`; that v1 backend's real server
must stay (weight 0) while the data flows, then go as `drained` once the server closes
(pods get `--half-close-grace`, so the stream ends before their deadline).

Writes out/demo/rollout.json (every timestamp, in seconds since the load started) and
out/demo/report.txt, and prints the report. `python -m demo.plot` draws the timeline.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from ipvsctl.daemon.options import DrainOptions, HTTPOptions, SourceOptions

REPO = Path(__file__).resolve().parents[1]
VIP, PORT = "10.96.0.10", 80
V1 = [("web-v1-a", "10.244.1.11"), ("web-v1-b", "10.244.1.12"), ("web-v1-c", "10.244.1.13")]
V2 = [("web-v2-a", "10.244.1.21"), ("web-v2-b", "10.244.1.22"), ("web-v2-c", "10.244.1.23")]
MODULES = (
    "ip_vs",
    "ip_vs_rr",
    "dummy",
    "veth",
    "nf_conntrack",
    "nf_conntrack_netlink",
    "nf_tables",
)


def say(*parts: Any) -> None:
    print("demo:", *parts, flush=True)


class LogCapture(logging.Handler):
    """ipvsctl's own log lines (drain started, real server deleted, ...) with their fields,
    on the demo clock."""

    def __init__(self, clock: Any, echo: bool = True) -> None:
        super().__init__(logging.INFO)
        self.clock = clock
        self.echo = echo
        self.records: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        data = {
            k: (v if isinstance(v, int | float | bool) or v is None else str(v))
            for k, v in (getattr(record, "fields", None) or {}).items()
        }
        rec = {
            "t": round(record.created - self.clock.wall0, 3),
            "logger": record.name,
            "level": record.levelname.lower(),
            "msg": record.getMessage(),
            **data,
        }
        self.records.append(rec)
        if (
            self.echo
            and record.name == "ipvsctl.engine"
            and rec["msg"] in ("drain started", "real server deleted", "drain deadline from pod")
        ):
            kv = " ".join(
                f"{k}={v}"
                for k, v in data.items()
                if k
                in (
                    "rs",
                    "reason",
                    "deadline_in",
                    "deadline_from",
                    "pod",
                    "drained_for",
                    "deadline",
                )
            )
            say(f"t={rec['t']:6.2f}s ipvsctl: {rec['msg']} {kv}")


class KernelPoller:
    """The kernel's own view, every `interval` s: weight and connection counts of each real
    server of the virtual server (a hand-packed netlink dump, cheap even in the VM)."""

    def __init__(self, netns: str, clock: Any, interval: float = 0.25) -> None:
        from devkit.ipvsnl import RawIPVS
        from ipvsctl.model import Protocol, ServiceKey

        self.ipvs = RawIPVS(netns=netns)
        self.key = ServiceKey(Protocol.TCP, VIP, PORT)
        self.clock = clock
        self.interval = interval
        self.samples: list[list[Any]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="kernel-poller")

    def start(self) -> None:
        self.thread.start()

    def _run(self) -> None:
        from ipvsctl.kernel.port import KernelError

        while not self.stop.is_set():
            t = round(self.clock(), 3)
            try:
                for r in self.ipvs.list_real_servers(self.key):
                    self.samples.append(
                        [t, r.key.address, r.weight, r.active_conns, r.inactive_conns]
                    )
            except KernelError:
                pass
            self.stop.wait(self.interval)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=10)
        self.ipvs.close()


def run_mode(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    from demo.clients import HalfClosed, LongLived, ShortLoad
    from demo.cluster import NODE_NAME, Cluster, DemoClock
    from devkit.fakeapi.server import FakeAPIServer
    from devkit.labkit import Node, wait_for
    from ipvsctl.daemon.options import DaemonOptions
    from ipvsctl.daemon.wiring import Daemon
    from ipvsctl.kernel.netlink import configure_host
    from ipvsctl.kube.client import KubeSource
    from ipvsctl.model import NodeContext

    drain = mode in ("drain", "halfclose")
    half_mode = mode == "halfclose"
    grace = args.half_close_grace if half_mode else args.grace
    clock = DemoClock()  # rebased to 0 when the load starts

    what = {
        "drain": "draining on (ipvsctl as shipped)",
        "nodrain": "draining off (--drain-timeout 0, annotation ipvsctl.io/drain-timeout: 0)",
        "halfclose": "draining on, plus a download whose client half-closed its connection",
    }[mode]
    say(f"--- mode {mode}: {what}")
    node = Node()
    configure_host(kernel=node.kernel)
    client = node.make_client(ip6=None)
    api = FakeAPIServer().start()
    capture = LogCapture(clock)
    logging.getLogger("ipvsctl").addHandler(capture)
    logging.getLogger("ipvsctl").setLevel(logging.INFO)
    state_dir = tempfile.mkdtemp(prefix=f"ipvsctl-demo-{mode}-")
    poller: KernelPoller | None = None
    daemon = None
    half: HalfClosed | None = None
    half_snapshot: dict[str, Any] | None = None
    try:

        def make_pod_netns(name: str, ip: str) -> str:
            return node.make_pod(ip, name=name, tcp=()).netns.name

        annotations = {} if drain else {"ipvsctl.io/drain-timeout": "0"}
        cluster = Cluster(
            api,
            make_pod_netns,
            clock,
            vip=VIP,
            port=PORT,
            annotations=annotations,
            readiness_delay=args.readiness_delay,
            pre_stop=args.pre_stop,
            grace=grace,
        )
        for name, ip in V1:
            cluster.start_pod(name, ip, "v1", wait_ready=False)

        opts = DaemonOptions(
            node=NodeContext(NODE_NAME),
            source=SourceOptions(apiserver=api.url),
            drain=DrainOptions(
                timeout=30.0 if drain else 0.0, check_interval=1.0, state_dir=state_dir
            ),
            http=HTTPOptions(listen="127.0.0.1:0"),
        )
        source = KubeSource.from_config(apiserver=api.url)
        daemon = Daemon(opts, node.kernel, source)
        daemon.start()
        wait_for(lambda: daemon.engine.started, timeout=300, what="ipvsctl ready")
        wait_for(
            lambda: len(node.ipvsadm().get(f"{VIP}:{PORT}/TCP", _Empty).real_servers) == 3,
            timeout=120,
            what="three real servers",
        )
        say(
            f"t={clock():6.2f}s ipvsctl ready: {VIP}:{PORT} -> 3 real servers (v1); "
            "from here on t=0 is the start of the load"
        )
        shift = clock.rebase()
        for pod in cluster.pods.values():  # the v1 pods started before time 0
            pod.created = None if pod.created is None else round(pod.created - shift, 3)
            pod.ready = None if pod.ready is None else round(pod.ready - shift, 3)
        poller = KernelPoller(node.name, clock)
        poller.start()

        long = LongLived(client.netns.name, VIP, PORT, connections=args.long, clock=clock)
        long.start()
        short = ShortLoad(client.netns.name, VIP, PORT, rate=args.rate, clock=clock)
        short.start()
        say(
            f"t={clock():6.2f}s load: {args.rate}/s short requests, {args.long} long-lived "
            "connections open"
        )
        if half_mode:
            half = HalfClosed(
                client.netns.name, VIP, PORT, until=args.half_close_until, clock=clock
            )
            half.start()
            say(
                f"t={clock():6.2f}s half-closed download to {half.pod}: the client shut its "
                f"write side at t={_t(half.half_closed).strip()}; the server streams until "
                f"t={args.half_close_until:g}s"
            )
        time.sleep(max(0.0, args.warmup - clock()))
        rollout_start = clock()
        say(
            f"t={rollout_start:6.2f}s rolling update v1 -> v2 (maxSurge 1, maxUnavailable 0, "
            f"preStop {args.pre_stop:g}s, grace {grace:g}s)"
        )
        cluster.rolling_update([n for n, _ in V1], V2, "v2")
        rollout_end = clock()
        say(f"t={rollout_end:6.2f}s all v2 pods ready, v1 pods terminating")
        time.sleep(max(0.0, args.long_until - clock()))
        long.stop()
        say(f"t={clock():6.2f}s long-lived connections closed by their clients")
        if half is not None:
            half_snapshot = snapshot_half_closed(node, daemon, cluster, half, clock)
        time.sleep(max(0.0, args.load_until - clock()))
        short.stop()
        say(f"t={clock():6.2f}s load stopped")
        if half is not None:
            half.join(timeout=max(0.0, args.half_close_until - clock()) + 30)
            say(
                f"t={clock():6.2f}s half-closed download ended ({half.end}) after "
                f"{len(half.ticks)} ticks"
            )
        cluster.wait_kubelets(timeout=grace + 30)
        old_ips = {ip for _, ip in V1}

        def old_gone() -> bool:
            rss = node.ipvsadm().get(f"{VIP}:{PORT}/TCP", _Empty).real_servers
            return not any(k.split(":")[0] in old_ips for k in rss)

        wait_for(old_gone, timeout=grace + 30, what="v1 real servers deleted")
        time.sleep(1.0)
        end = clock()
        say(f"t={end:6.2f}s every v1 real server deleted from the kernel")
        status = daemon.status()
        ipvsadm = node.run("ipvsadm", "-Ln")
    finally:
        if poller is not None:
            poller.close()
        if daemon is not None:
            daemon.shutdown()
        logging.getLogger("ipvsctl").removeHandler(capture)
        api.stop()
        node.close()

    return {
        "mode": mode,
        "wall0": clock.wall0,
        "settings": {
            "rate": args.rate,
            "long_lived": args.long,
            "pre_stop": args.pre_stop,
            "grace": grace,
            "readiness_delay": args.readiness_delay,
            "drain_check_interval": 1.0,
            "drain_timeout": 30.0 if drain else 0.0,
            "annotations": annotations,
        },
        "phases": {
            "rollout_start": rollout_start,
            "rollout_end": rollout_end,
            "long_closed": args.long_until,
            "load_end": args.load_until,
            "end": end,
        },
        "pods": {name: p.to_json() for name, p in cluster.pods.items()},
        "short": [r.__dict__ for r in short.records],
        "long": {
            "records": [r.__dict__ for r in long.records],
            "breaks": long.breaks,
            "closed": long.closed,
        },
        "half_closed": (
            None
            if half is None
            else {**half.to_json(), "server": streams_of(cluster), "snapshot": half_snapshot}
        ),
        "ipvsctl_log": [r for r in capture.records if r["logger"] == "ipvsctl.engine"],
        "kernel": poller.samples if poller else [],
        "status_at_end": status,
        "ipvsadm_at_end": ipvsadm,
    }


class _Empty:
    real_servers: dict[str, Any] = {}


def streams_of(cluster: Any) -> list[dict[str, Any]]:
    """What the apps saw of the half-closed download (the EOF, their socket's state)."""
    return [{"pod": name, **info} for name, app in cluster.apps.items() for info in app.streams]


def state_counts(states: list[str]) -> str:
    """["CLOSE_WAIT", "TIME_WAIT", "TIME_WAIT"] -> "CLOSE_WAIT 1, TIME_WAIT 2"."""
    return ", ".join(f"{st} {states.count(st)}" for st in sorted(set(states))) or "-"


def snapshot_half_closed(
    node: Any, daemon: Any, cluster: Any, half: Any, clock: Any
) -> dict[str, Any] | None:
    """Once the other v1 backends are gone (or shortly before the stream ends), the
    half-closed backend as the kernel and ipvsctl show it: weight, counts, the IPVS state of
    its connections, and ipvsctl's split of them (established / closing / closed)."""
    from devkit.labkit import wait_for

    pod = cluster.pods.get(half.pod)
    if pod is None:
        return None
    rs = f"{pod.ip}:8080"
    others = {p.ip for p in cluster.pods.values() if p.version == "v1" and p.ip != pod.ip}

    def others_gone() -> bool:
        rss = node.ipvsadm().get(f"{VIP}:{PORT}/TCP", _Empty).real_servers
        return not any(k.split(":")[0] in others for k in rss)

    wait_for(
        lambda: others_gone() or clock() > half.until - 3,
        timeout=half.until + 60,
        interval=0.5,
        what="the other v1 backends deleted",
    )
    t = round(clock(), 3)
    kernel = node.ipvsadm().get(f"{VIP}:{PORT}/TCP", _Empty).real_servers.get(rs)
    states = sorted(
        c[1]
        for c in node.ipvs_connections()
        if c[0] == "TCP" and c[4] == rs and not c[2].endswith(":0")
    )
    mine = next(
        (
            r
            for vs in daemon.status().get("virtual_servers", [])
            for r in vs.get("real_servers", [])
            if r.get("address") == pod.ip
        ),
        None,
    )
    snap = {
        "t": t,
        "others_gone": others_gone(),
        "ipvs_states": states,
        "kernel": None
        if kernel is None
        else {"weight": kernel.weight, "active": kernel.active, "inactive": kernel.inactive},
        "ipvsctl": None
        if mine is None
        else {
            "state": mine.get("state"),
            "weight": mine.get("weight"),
            "connections": (mine.get("drain") or {}).get("connections"),
        },
    }
    say(
        f"t={t:6.2f}s half-closed backend {half.pod}: kernel {snap['kernel']}, IPVS states "
        f"{state_counts(states)}, ipvsctl {snap['ipvsctl']}"
    )
    return snap


# --- the report -----------------------------------------------------------------------------
def backend_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Per v1 backend: when the API said terminating, when ipvsctl set weight 0 and deleted
    it (and why), and what the kernel showed."""
    rows = []
    for name, pod in doc["pods"].items():
        if pod["version"] != "v1":
            continue
        rs = f"{pod['ip']}:8080"
        started = [
            r for r in doc["ipvsctl_log"] if r["msg"] == "drain started" and r.get("rs") == rs
        ]
        deleted = [
            r for r in doc["ipvsctl_log"] if r["msg"] == "real server deleted" and r.get("rs") == rs
        ]
        samples = [s for s in doc["kernel"] if s[1] == pod["ip"]]
        k_w0 = next((s[0] for s in samples if s[2] == 0), None)
        last_seen = samples[-1][0] if samples else None
        conns_at_w0 = next((s[3] + s[4] for s in samples if s[2] == 0), None)
        rows.append(
            {
                "pod": name,
                "ip": pod["ip"],
                "terminating": pod["terminating"],
                "deadline": pod["deadline"],
                "sigterm": pod["sigterm"],
                "exited": pod["exited"],
                "killed_connections": pod["killed_connections"],
                "weight0": started[0]["t"] if started else None,
                "deadline_from": started[0].get("deadline_from") if started else None,
                "deleted": deleted[0]["t"] if deleted else None,
                "reason": deleted[0].get("reason") if deleted else None,
                "kernel_weight0": k_w0,
                "kernel_last_seen": last_seen,
                "conns_at_weight0": conns_at_w0,
            }
        )
    return rows


def mode_summary(doc: dict[str, Any]) -> dict[str, Any]:
    short = doc["short"]
    failed = [r for r in short if not r["ok"]]
    kinds: dict[str, int] = {}
    for r in failed:
        kinds[r["error"]] = kinds.get(r["error"], 0) + 1
    long_failed = [r for r in doc["long"]["records"] if not r["ok"]]
    return {
        "mode": doc["mode"],
        "short_sent": len(short),
        "short_failed": len(failed),
        "short_failures_by_kind": kinds,
        "long_lived": doc["settings"]["long_lived"],
        "long_requests": len(doc["long"]["records"]),
        "long_requests_failed": len(long_failed),
        "long_broken": len(doc["long"]["breaks"]),
        "long_closed_cleanly": len(doc["long"]["closed"]),
        "backends": backend_rows(doc),
        "half_closed": half_closed_summary(doc),
    }


def half_closed_summary(doc: dict[str, Any]) -> dict[str, Any] | None:
    """The half-closed download: which backend, what its server saw, how much data flowed
    after the backend stopped taking new connections, and when ipvsctl deleted it."""
    h = doc.get("half_closed")
    if not h or not h.get("pod"):
        return None
    row = next((b for b in backend_rows(doc) if b["pod"] == h["pod"]), None)
    server = next((x for x in h.get("server", []) if x["pod"] == h["pod"]), {})
    ticks = h["ticks"]

    def after(t: float | None) -> int:
        return 0 if t is None else sum(1 for x in ticks if x > t)

    w0 = row["weight0"] if row else None
    sigterm = row["sigterm"] if row else None
    deleted = row["deleted"] if row else None
    return {
        "pod": h["pod"],
        "ip": row["ip"] if row else None,
        "opened": h["opened"],
        "half_closed": h["half_closed"],
        "server_eof": server.get("eof"),
        "server_tcp_state": server.get("tcp_state"),
        "stream_end": server.get("end") or h["ended"],
        "end": h["end"],
        "ticks": len(ticks),
        "ticks_after_weight0": after(w0),
        "ticks_after_sigterm": after(sigterm),
        "last_tick": ticks[-1] if ticks else None,
        "weight0": w0,
        "deleted": deleted,
        "reason": row["reason"] if row else None,
        "deadline": row["deadline"] if row else None,
        "deleted_after_end": (
            None if deleted is None or h["ended"] is None else round(deleted - h["ended"], 2)
        ),
        "snapshot": h.get("snapshot"),
    }


def _t(x: float | None) -> str:
    return "-" if x is None else f"{x:6.2f}s"


def render(docs: list[dict[str, Any]]) -> str:
    out = []
    for doc in docs:
        s = mode_summary(doc)
        out.append(f"== {TITLES.get(s['mode'], s['mode'])} ==")
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(s["short_failures_by_kind"].items()))
        out.append(
            f"short requests: {s['short_sent']} sent, {s['short_failed']} failed"
            + (f" ({kinds})" if kinds else "")
        )
        out.append(
            f"long-lived connections: {s['long_lived']} open through the rollout, "
            f"{s['long_broken']} broken (a broken one is reopened and can break "
            f"again), {s['long_closed_cleanly']} closed cleanly by their clients at "
            f"the end; {s['long_requests']} requests on them, "
            f"{s['long_requests_failed']} failed"
        )
        out.append(
            "backend    terminating  ipvsctl weight 0  ipvsctl deleted  why       "
            "kernel: weight 0 / last seen   app: SIGTERM / exit (reset conns)"
        )
        for b in s["backends"]:
            out.append(
                f"{b['pod']:<10} {_t(b['terminating'])}      {_t(b['weight0'])}           "
                f"{_t(b['deleted'])}          {b['reason'] or '-':<9} "
                f"{_t(b['kernel_weight0'])} / {_t(b['kernel_last_seen'])}        "
                f"{_t(b['sigterm'])} / {_t(b['exited'])} ({b['killed_connections']})"
            )
        if s["half_closed"]:
            out += render_half_closed(s["half_closed"])
        out.append("")
    out.append(
        "Times are seconds since the load started. 'drained' = no connection could "
        "carry data any more: ActiveConn+InActConn reached 0, or every connection "
        "left was in TIME_WAIT or CLOSE (IPVS keeps a closed one 2 minutes). "
        "'deadline' = the drain deadline passed with a connection still open or "
        "closing: with draining, the pod's deletionTimestamp; without, the "
        "annotation's 0 s. A half-closed connection (CLOSE_WAIT in IPVS: the "
        "client's FIN seen, the server still sending) holds its real server."
    )
    return "\n".join(out)


TITLES = {
    "drain": "draining ON (ipvsctl as shipped)",
    "nodrain": "draining OFF (real servers deleted at once)",
    "halfclose": "draining ON, with a half-closed download",
}


def render_half_closed(h: dict[str, Any]) -> list[str]:
    snap = h.get("snapshot") or {}
    kernel, mine = snap.get("kernel") or {}, snap.get("ipvsctl") or {}
    conns = mine.get("connections") or {}
    states = state_counts(snap.get("ipvs_states") or [])
    out = [
        f"half-closed download on {h['pod']} ({h['ip']}): opened at {_t(h['opened'])}, the "
        f"client shut its write side at {_t(h['half_closed'])}; the server read EOF at "
        f"{_t(h['server_eof'])}, its socket {h['server_tcp_state'] or '?'}, and kept "
        f"sending until {_t(h['stream_end'])} ({h['end']})",
        f"  client: {h['ticks']} ticks received, {h['ticks_after_weight0']} after the "
        f"backend's weight went 0 ({_t(h['weight0'])}), {h['ticks_after_sigterm']} after its "
        f"app's SIGTERM, the last at {_t(h['last_tick'])}",
    ]
    if snap:
        out.append(
            f"  at {_t(snap.get('t'))} (other v1 backends "
            f"{'deleted' if snap.get('others_gone') else 'not yet deleted'}): kernel weight "
            f"{kernel.get('weight', '-')}, ActiveConn {kernel.get('active', '-')}, InActConn "
            f"{kernel.get('inactive', '-')}, its connections in IPVS: {states}; "
            f"ipvsctl: {mine.get('state', '-')}, connections established "
            f"{conns.get('established', '-')} / closing {conns.get('closing', '-')} / closed "
            f"{conns.get('closed', '-')}"
        )
    gap = h["deleted_after_end"]
    out.append(
        f"  real server deleted at {_t(h['deleted'])} ({h['reason'] or '-'})"
        + ("" if gap is None else f", {gap:.2f}s after the stream ended")
        + f"; the pod's deadline was {_t(h['deadline'])}"
    )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m demo.rollout",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", default=str(REPO / "out" / "demo"))
    p.add_argument("--modes", default="drain,nodrain,halfclose")
    p.add_argument("--rate", type=float, default=8.0, help="short requests per second")
    p.add_argument("--long", type=int, default=3, help="long-lived connections")
    p.add_argument("--warmup", type=float, default=4.0)
    p.add_argument("--readiness-delay", type=float, default=1.5)
    p.add_argument("--pre-stop", type=float, default=5.0)
    p.add_argument("--grace", type=float, default=30.0)
    p.add_argument("--long-until", type=float, default=25.0)
    p.add_argument("--load-until", type=float, default=30.0)
    p.add_argument(
        "--half-close-until",
        type=float,
        default=38.0,
        help="halfclose mode: the server streams until then (past the pods' "
        "deadline, the connection holds the real server until that deadline)",
    )
    p.add_argument(
        "--half-close-grace",
        type=float,
        default=45.0,
        help="halfclose mode: the pods' grace period",
    )
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        sys.exit("demo: needs root and an IPVS kernel: run `make demo` (boots the lab VM)")
    for m in MODULES:
        subprocess.run(["modprobe", m], capture_output=True, check=False)
    if not Path("/proc/net/ip_vs").exists():
        sys.exit("demo: no IPVS in this kernel (modprobe ip_vs failed): run `make demo`")
    t = time.monotonic()
    say("importing ipvsctl, pyroute2 and the kubernetes client (slow under emulation)")
    say(f"imported in {time.monotonic() - t:.1f}s")
    docs = [run_mode(m.strip(), args) for m in args.modes.split(",") if m.strip()]
    (out / "rollout.json").write_text(
        json.dumps(
            {
                "modes": docs,
                "summary": [mode_summary(d) for d in docs],
                "kernel": os.uname().release,
            },
            indent=1,
            default=str,
        )
        + "\n"
    )
    report = render(docs)
    (out / "report.txt").write_text(report + "\n")
    print("\n" + report, flush=True)
    say(f"wrote {out / 'rollout.json'} and {out / 'report.txt'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Experiments on the lab kernel: what keeps an established connection through a flushed
IPVS table (kube-proxy's start-up cleanup), and what the hold rules cost while the table is
whole. Run in the VM:

    .venv/bin/python -m tests.lab.boot --run 'python -m devkit.flushlab NAME ...'

Each experiment builds a fresh lab node (labkit) with one dual-stack ClusterIP, a streaming
backend, a client pod and a node-local client, opens streams through the virtual servers,
flushes as kube-proxy does, restores the table after a delay and reports, per stream,
whether it carried data to its end and its longest stall. Results are printed and appended
as JSON lines to $IPVSCTL_LAB_OUT/flushlab.jsonl.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from devkit.flushkit import Stream, StreamServer, UdpFlow, flush_like_kube_proxy
from devkit.labkit import Node, sh, wait_for
from ipvsctl.model import Protocol, ServiceKey
from ipvsctl.netfilter.ruleset import Element, RulesetConfig, Verdict, replace_table_ruleset

VIP4, VIP6 = "10.96.0.10", "fd96::10"
POD4, POD6 = "10.244.1.1", "fd44::1"
PORT, TARGET = 80, 8081
UDP_PORT, UDP_TARGET = 53, 5353
TABLE = "inet ipvsctl"

IPVSADM_RULES = f"""\
-A -t {VIP4}:{PORT} -s rr
-a -t {VIP4}:{PORT} -r {POD4}:{TARGET} -m -w 1
-A -t [{VIP6}]:{PORT} -s rr
-a -t [{VIP6}]:{PORT} -r [{POD6}]:{TARGET} -m -w 1
-A -u {VIP4}:{UDP_PORT} -s rr
-a -u {VIP4}:{UDP_PORT} -r {POD4}:{UDP_TARGET} -m -w 1
"""


class Lab:
    """One node, one dual-stack ClusterIP to a streaming pod, a client pod."""

    def __init__(self, expire_nodest: int, hold: bool) -> None:
        self.node = Node()
        n = self.node
        n.netns.sysctl("net.ipv4.vs.conntrack", "1")
        n.netns.sysctl("net.ipv4.vs.expire_nodest_conn", str(expire_nodest))
        # an uplink with the default routes: in the gap the virtual IPs are "routed away"
        n.netns.ip_batch(
            [
                "link add up0 type dummy",
                "link set up0 up",
                "addr add 192.0.2.10/24 dev up0",
                "route add default dev up0",
                "route add ::/0 dev up0",
            ]
        )
        self.server_pod = n.make_pod(POD4, POD6, name="server", tcp=())
        self.server = StreamServer(self.server_pod, TARGET)
        self.server_pod.serve("udp", UDP_TARGET)
        self.client = n.make_client()
        sh("ipvsadm", "-R", netns=n.name, stdin=IPVSADM_RULES)
        n.netns.ip_batch(
            [f"addr add {VIP4}/32 dev kube-ipvs0", f"addr add {VIP6}/128 dev kube-ipvs0 nodad"]
        )
        # ipvsctl's table as the daemon writes it, with or without its hold chains
        config = RulesetConfig(cluster_cidrs=("10.244.0.0/16", "fd44::/64"), hold=hold)
        elements = {
            ServiceKey(Protocol.TCP, vip, PORT): Element(Verdict.CLUSTER_IP, None, True)
            for vip in (VIP4, VIP6)
        }
        udp = ServiceKey(Protocol.UDP, VIP4, UDP_PORT)
        elements[udp] = Element(Verdict.CLUSTER_IP, None, True)
        sh("nft", "-f", "-", netns=n.name, stdin=replace_table_ruleset(config, elements))

    def restore(self, address_first: bool) -> None:
        links = [
            "link add kube-ipvs0 type dummy",
            f"addr add {VIP4}/32 dev kube-ipvs0",
            f"addr add {VIP6}/128 dev kube-ipvs0 nodad",
        ]

        def link() -> None:  # -force: after `ipvsadm -C` alone the link is still there
            sh(
                "ip",
                "-n",
                self.node.name,
                "-force",
                "-batch",
                "-",
                stdin="\n".join(links) + "\n",
                check=False,
            )

        if address_first:
            link()
        sh("ipvsadm", "-R", netns=self.node.name, stdin=IPVSADM_RULES)
        if not address_first:
            link()

    def streams(self) -> dict[str, Stream]:
        return {
            "pod4": Stream(self.client.netns, VIP4, PORT),
            "pod6": Stream(self.client.netns, VIP6, PORT),
            "node4": Stream(self.node.netns, VIP4, PORT),
        }

    def counters(self) -> str:
        return sh("nft", "list", "table", *TABLE.split(), netns=self.node.name, check=False)

    def close(self) -> None:
        self.server.close()
        self.node.close()


def report(name: str, **values: Any) -> dict[str, Any]:
    row = {"experiment": name, "kernel": os.uname().release, **values}
    print(json.dumps(row), flush=True)
    out = os.environ.get("IPVSCTL_LAB_OUT")
    if out:
        with open(os.path.join(out, "flushlab.jsonl"), "a") as f:
            f.write(json.dumps(row) + "\n")
    return row


def flush_and_restore(
    expire_nodest: int,
    hold: bool,
    gap: float = 1.0,
    address_first: bool = False,
    flush: Callable[[Lab], None] | None = None,
    name: str = "flush",
) -> dict[str, Any]:
    lab = Lab(expire_nodest, hold)
    try:
        streams = lab.streams()
        udp = UdpFlow(lab.client.netns, VIP4, UDP_PORT)
        wait_for(lambda: all(s.lines >= 20 for s in streams.values()), 60, what="streams flowing")
        wait_for(lambda: udp.answered >= 5, 60, what="udp answered")
        conns_before = len(lab.node.ipvs_connections())
        ct_before = lab.node.conntrack("-p", "tcp")
        t0 = time.monotonic()
        (flush or (lambda lab: flush_like_kube_proxy(lab.node)))(lab)
        flushed = time.monotonic() - t0
        time.sleep(0.2)
        conns_gap = len(lab.node.ipvs_connections())
        ct_gap_text = lab.node.conntrack("-p", "tcp")
        ct_gap = len(ct_gap_text.splitlines())
        time.sleep(max(0.0, gap - (time.monotonic() - t0)))
        lab.restore(address_first)
        restored = time.monotonic() - t0
        marks = {k: s.lines for k, s in streams.items()}
        with contextlib.suppress(AssertionError):
            wait_for(
                lambda: all(s.lines > marks[k] + 20 or not s.alive() for k, s in streams.items()),
                60,
                what="streams moving again or dead",
            )
        results = {
            k: {
                "completed": s.finish(),
                "stall_s": round(max([g for _, g in s.gaps] or [0.0]), 2),
                "error": s.error,
                "lines": s.lines,
            }
            for k, s in streams.items()
        }
        return report(
            name,
            expire_nodest_conn=expire_nodest,
            hold=hold,
            gap_s=gap,
            address_first=address_first,
            flush_s=round(flushed, 3),
            restored_at_s=round(restored, 3),
            ipvs_conns_before=conns_before,
            ipvs_conns_in_gap=conns_gap,
            conntrack_tcp_in_gap=ct_gap,
            streams=results,
            udp=udp.stop(),
            server_errors=lab.server.errors,
            counters=lab.counters() if hold else "",
            conntrack_before=ct_before if os.environ.get("FLUSHLAB_DEBUG") else "",
            conntrack_gap=ct_gap_text if os.environ.get("FLUSHLAB_DEBUG") else "",
            conntrack_after=lab.node.conntrack("-p", "tcp")
            if os.environ.get("FLUSHLAB_DEBUG")
            else "",
        )
    finally:
        lab.close()


def ipvsadm_clear_only(lab: Lab) -> None:
    sh("ipvsadm", "-C", netns=lab.node.name)


EXPERIMENTS: dict[str, Callable[[], object]] = {
    # NOTES §8's observation, and each part of the remedy alone
    "baseline1": lambda: flush_and_restore(1, False, name="baseline1"),
    "baseline0": lambda: flush_and_restore(0, False, name="baseline0"),
    "hold1": lambda: flush_and_restore(1, True, name="hold1"),
    "hold0": lambda: flush_and_restore(0, True, name="hold0"),
    "hold0-addrfirst": lambda: flush_and_restore(
        0, True, address_first=True, name="hold0-addrfirst"
    ),
    "hold0-gap5": lambda: flush_and_restore(0, True, gap=5.0, name="hold0-gap5"),
    "hold0-clear": lambda: flush_and_restore(0, True, flush=ipvsadm_clear_only, name="hold0-clear"),
    "nohold0-clear": lambda: flush_and_restore(
        0, False, flush=ipvsadm_clear_only, name="nohold0-clear"
    ),
}


def main(argv: list[str]) -> int:
    names = argv or list(EXPERIMENTS)
    sh("modprobe", "-a", "ip_vs", "dummy", "veth", check=False)
    for name in names:
        try:
            EXPERIMENTS[name]()
        except Exception as exc:  # one experiment failing must not hide the others
            report(name, crashed=repr(exc))
    return 0


def probe_node_client() -> None:
    """Where a node-local client's connection is lost: conntrack and sockets after each
    step of the flush."""
    lab = Lab(0, True)
    try:
        s = Stream(lab.node.netns, VIP4, PORT)
        wait_for(lambda: s.lines >= 20, 60, what="stream")
        steps: dict[str, Any] = {"before": lab.node.conntrack("-p", "tcp")}
        sh("ipvsadm", "-C", netns=lab.node.name)
        time.sleep(0.5)
        steps["after_clear"] = lab.node.conntrack("-p", "tcp")
        steps["alive_after_clear"] = s.alive()
        sh("ip", "link", "del", "kube-ipvs0", netns=lab.node.name)
        time.sleep(0.5)
        steps["after_link"] = lab.node.conntrack("-p", "tcp")
        steps["alive_after_link"] = s.alive()
        steps["ipvs_conns"] = lab.node.ipvs_connections()
        steps["ss"] = sh("ss", "-tni", netns=lab.node.name)
        lab.restore(False)
        time.sleep(3)
        steps["after_restore"] = lab.node.conntrack("-p", "tcp")
        steps["error"] = s.error
        steps["counters"] = lab.counters()
        report("probe-node-client", **steps)
    finally:
        lab.close()


EXPERIMENTS["probe-node-client"] = probe_node_client


def trace_node_client() -> None:
    """nft trace of a node-local client's packets around `ipvsadm -C`."""
    import subprocess

    lab = Lab(0, True)
    try:
        lab.server.interval = 0.5
        s = Stream(lab.node.netns, VIP4, PORT, interval=0.5)
        s_srv_interval = lab.server.interval
        wait_for(lambda: s.lines >= 5, 60, what="stream")
        sh(
            "nft",
            "-f",
            "-",
            netns=lab.node.name,
            stdin="table inet trace {\n chain pre { type filter hook prerouting priority -400;\n"
            "tcp sport 8081 meta nftrace set 1\n tcp dport 80 meta nftrace set 1\n }\n"
            "chain out { type filter hook output priority -400;\n"
            "tcp dport {80, 8081} meta nftrace set 1\n tcp sport 80 meta nftrace set 1\n }\n}\n",
        )
        base = os.environ.get("IPVSCTL_LAB_OUT", "/tmp")
        with (
            open(os.path.join(base, "trace.txt"), "w") as f,
            open(os.path.join(base, "ctevents.txt"), "w") as g,
        ):
            mon = subprocess.Popen(
                ["ip", "netns", "exec", lab.node.name, "stdbuf", "-oL", "nft", "monitor", "trace"],
                stdout=f,
                text=True,
            )
            ev = subprocess.Popen(
                [
                    "ip",
                    "netns",
                    "exec",
                    lab.node.name,
                    "stdbuf",
                    "-oL",
                    "conntrack",
                    "-E",
                    "-o",
                    "timestamp",
                ],
                stdout=g,
                stderr=subprocess.STDOUT,
                text=True,
            )
            time.sleep(2.0)
            marks = [f"flush at {time.time():.3f}"]
            sh("ipvsadm", "-C", netns=lab.node.name)
            marks.append(f"flushed at {time.time():.3f}, alive={s.alive()} error={s.error}")
            time.sleep(3)
            marks.append(f"after 3 s alive={s.alive()} error={s.error}")
            mon.terminate()
            ev.terminate()
            mon.wait()
            ev.wait()
        out = "\n".join(marks)
        report(
            "trace-node-client",
            interval=s_srv_interval,
            trace=out,
            error=s.error,
            conntrack=lab.node.conntrack("-p", "tcp"),
            ipvs=lab.node.ipvs_connections(),
        )
    finally:
        lab.close()


EXPERIMENTS["trace-node-client"] = trace_node_client


def quiet_clear() -> None:
    """Is a node-local client's conntrack entry removed by `ipvsadm -C` itself (no packet
    in between)? And a pod client's?"""
    lab = Lab(0, True)
    try:
        lab.server.interval = 30.0
        s = Stream(lab.node.netns, VIP4, PORT, interval=30.0)
        p = Stream(lab.client.netns, VIP4, PORT, interval=30.0)
        time.sleep(1.0)
        before = lab.node.conntrack("-p", "tcp")
        sh("ipvsadm", "-C", netns=lab.node.name)
        after = lab.node.conntrack("-p", "tcp")
        ipvs = lab.node.ipvs_connections()
        sh("ipvsadm", "-R", netns=lab.node.name, stdin=IPVSADM_RULES)
        restored = lab.node.conntrack("-p", "tcp")
        lab.server.interval = 0.05
        report(
            "quiet-clear",
            before=before,
            after=after,
            ipvs=ipvs,
            restored=restored,
            node_alive=s.alive(),
            pod_alive=p.alive(),
        )
    finally:
        lab.close()


EXPERIMENTS["quiet-clear"] = quiet_clear


def deadline_cut(toggle: bool, hold: bool = True) -> dict[str, Any]:
    """A real server deleted at its deadline while a stream is open, with expire_nodest_conn
    0 between deletions: written 1 around the delete (`toggle`) or left 0. How soon does
    each end of the stream learn it is cut?"""
    lab = Lab(0, hold)
    try:
        lab.server.interval = 0.2
        streams = lab.streams()
        for s in streams.values():
            s.interval = 0.2
        wait_for(lambda: all(s.lines >= 5 for s in streams.values()), 60, what="streams")
        t0 = time.monotonic()
        if toggle:
            lab.node.netns.sysctl("net.ipv4.vs.expire_nodest_conn", "1")
        sh(
            "ipvsadm",
            "-R",
            netns=lab.node.name,
            stdin=(
                f"-d -t {VIP4}:{PORT} -r {POD4}:{TARGET}\n"
                f"-d -t [{VIP6}]:{PORT} -r [{POD6}]:{TARGET}\n"
            ),
        )
        if toggle:
            lab.node.netns.sysctl("net.ipv4.vs.expire_nodest_conn", "0")
        deleted = time.monotonic() - t0
        conns = lab.node.ipvs_connections()
        errors: dict[str, float | None] = {k: None for k in streams}

        def all_cut() -> bool:
            for k, s in streams.items():
                if errors[k] is None and not s.alive():
                    errors[k] = round(time.monotonic() - t0, 2)
            return all(v is not None for v in errors.values())

        with contextlib.suppress(AssertionError):
            wait_for(all_cut, 20, interval=0.05, what="every stream cut")
        return report(
            f"deadline-cut-{'toggle' if toggle else 'no-toggle'}{'' if hold else '-nohold'}",
            deleted_s=round(deleted, 3),
            ipvs_conns_after_delete=len(conns),
            cut_after_s=errors,
            stream_errors={k: s.error for k, s in streams.items()},
            conntrack=lab.node.conntrack("-p", "tcp"),
            counters=lab.counters() if hold else "",
        )
    finally:
        lab.close()


EXPERIMENTS["cut-toggle"] = lambda: deadline_cut(True)
EXPERIMENTS["cut-notoggle"] = lambda: deadline_cut(False)
EXPERIMENTS["cut-toggle-nohold"] = lambda: deadline_cut(True, hold=False)


KUBE_PROXY_DNAT = f"""\
table ip kube-proxy {{
    chain nat-prerouting {{
        type nat hook prerouting priority dstnat; policy accept;
        ip daddr {VIP4} tcp dport {PORT} dnat to {POD4}:{TARGET}
    }}
    chain nat-output {{
        type nat hook output priority -100; policy accept;
        ip daddr {VIP4} tcp dport {PORT} dnat to {POD4}:{TARGET}
    }}
    chain nat-postrouting {{
        type nat hook postrouting priority srcnat; policy accept;
        ip saddr != 10.244.0.0/16 ip daddr {POD4} tcp dport {TARGET} masquerade
    }}
}}
"""


def kube_proxy_lands(flush: bool) -> dict[str, Any]:
    """kube-proxy's nftables mode starts on the node: its DNAT for new connections (before
    IPVS) and, with `flush`, its IPVS cleanup; ipvsctl's table restored after. Connections
    through IPVS survive; new ones go through kube-proxy's DNAT, with the hold rules
    present, during the gap and after."""
    lab = Lab(0, True)
    try:
        old = {
            "pod4": Stream(lab.client.netns, VIP4, PORT),
            "node4": Stream(lab.node.netns, VIP4, PORT),
        }
        wait_for(lambda: all(s.lines >= 5 for s in old.values()), 60, what="streams")
        sh("nft", "-f", "-", netns=lab.node.name, stdin=KUBE_PROXY_DNAT)
        if flush:
            flush_like_kube_proxy(lab.node)
        new = {
            "pod4-new": Stream(lab.client.netns, VIP4, PORT),
            "node4-new": Stream(lab.node.netns, VIP4, PORT),
        }
        if flush:
            lab.restore(False)
        newer = {
            "pod4-after": Stream(lab.client.netns, VIP4, PORT),
            "node4-after": Stream(lab.node.netns, VIP4, PORT),
        }
        streams = {**old, **new, **newer}
        marks = {k: s.lines for k, s in streams.items()}
        with contextlib.suppress(AssertionError):
            wait_for(
                lambda: all(s.lines > marks[k] + 20 or not s.alive() for k, s in streams.items()),
                60,
            )
        ct = lab.node.conntrack("-p", "tcp")
        return report(
            f"kube-proxy-lands{'-flush' if flush else ''}",
            streams={
                k: {"completed": s.finish(), "error": s.error, "stall_s": round(s.stall(), 2)}
                for k, s in streams.items()
            },
            conntrack=ct,
            counters="\n".join(
                x for x in lab.counters().splitlines() if "packets" in x and "packets 0 " not in x
            ),
        )
    finally:
        lab.close()


EXPERIMENTS["kp-lands"] = lambda: kube_proxy_lands(False)
EXPERIMENTS["kp-lands-flush"] = lambda: kube_proxy_lands(True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

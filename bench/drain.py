"""Drain reaction: from a draining real server's connection counts reaching zero to its
deletion (lab VM, real traffic).

A node with `samples` pods behind one ClusterIP; ipvsctl's daemon as `ipvsctl run` builds
it (bench.harness: loop, drain reader thread, --drain-check-interval 1 s) programs it. One
client connection per pod through the virtual IP, then every endpoint goes not-ready: every
real server is at weight 0 with one connection. The connections are then closed one by one
at staggered times with a reset, so IPVS moves each to CLOSE (and drops it 10 s later).
The time is from that reset to the deletion: ipvsctl deletes a real server whose
connections are all closed (CLOSE, TIME_WAIT: the connection table says so) at its next
check, without waiting the 10 s for the counts to reach zero (before 2026-11-23 it waited,
and this measured from counts 0). A poller reading the kernel every 20 ms also notes when
ActiveConn+InActConn first reads 0 (if it does before the deletion) and when the real
server is gone; ipvsctl's own log gives its deletion time and reason.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import struct
import threading
import time
from typing import Any

from bench.common import log, summary

VIP, PORT = "10.96.0.20", 80


class _Deletions(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.deleted: dict[str, tuple[float, str]] = {}

    def emit(self, record: logging.LogRecord) -> None:
        f = getattr(record, "fields", None) or {}
        if record.getMessage() == "real server deleted":
            self.deleted[str(f.get("rs"))] = (record.created, str(f.get("reason")))


def run_drain(
    samples: int = 8, check_interval: float = 1.0, stagger: float = 1.37, poll: float = 0.02
) -> dict[str, Any]:
    from bench.harness import BenchDaemon
    from devkit.fakeapi import objects
    from devkit.ipvsnl import RawIPVS
    from devkit.labkit import Node, wait_for
    from ipvsctl.kernel.netlink import configure_host
    from ipvsctl.model import Protocol, ServiceKey

    node = Node()
    configure_host(kernel=node.kernel)
    client = node.make_client(ip6=None)
    ips = [f"10.244.2.{i + 1}" for i in range(samples)]
    for i, ip in enumerate(ips):
        node.make_pod(ip, name=f"d{i}")
    handler = _Deletions()
    logging.getLogger("ipvsctl.engine").addHandler(handler)
    logging.getLogger("ipvsctl.engine").setLevel(logging.INFO)
    raw = RawIPVS(netns=node.name)
    key = ServiceKey(Protocol.TCP, VIP, PORT)
    stop = threading.Event()
    stop_daemon = None
    try:
        svc = objects.service("drain", cluster_ip=VIP)

        def sl(ready: bool) -> dict[str, Any]:
            return objects.endpoint_slice(
                "drain-x",
                "drain",
                [objects.endpoint(ip, ready=ready, pod=f"d{i}") for i, ip in enumerate(ips)],
            )

        # the daemon as `ipvsctl run` builds it (loop, drain reader, state writer)
        bd = BenchDaemon(node.kernel, [svc], [sl(True)], drain_check_interval=check_interval)
        stop_daemon = bd.shutdown
        bd.start(timeout=120)
        wait_for(
            lambda: len(raw.list_real_servers(key)) == samples,
            timeout=120,
            what="real servers programmed",
        )
        conns = [client.connect(VIP, PORT) for _ in range(samples)]
        served = sorted(c.pod for c in conns)
        bd.source.send([(sl(False), None)])
        wait_for(
            lambda: all(r.weight == 0 for r in raw.list_real_servers(key)),
            timeout=60,
            what="every real server at weight 0",
        )

        zero_at: dict[str, float] = {}
        gone_at: dict[str, float] = {}
        seen: set[str] = set()

        def watch() -> None:
            while not stop.is_set():
                t = time.time()
                present = {}
                with contextlib.suppress(Exception):
                    present = {r.key.address: r.connections for r in raw.list_real_servers(key)}
                for ip in ips:
                    if ip in present:
                        seen.add(ip)
                        if present[ip] == 0 and ip not in zero_at:
                            zero_at[ip] = t
                    elif ip in seen and ip not in gone_at:
                        gone_at[ip] = t
                stop.wait(poll)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        closed_at: dict[str, float] = {}
        ip_of = {f"d{i}": ip for i, ip in enumerate(ips)}
        for c in conns:  # reset one connection at a time: IPVS CLOSE state, 10 s
            with contextlib.suppress(OSError):
                c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            closed_at[ip_of.get(c.pod.split()[0] if c.pod else "", "")] = time.time()
            c.close()
            time.sleep(stagger)
        wait_for(lambda: len(gone_at) == samples, timeout=120, what="every real server deleted")
        stop.set()
        watcher.join(timeout=5)
        latencies, from_zero, rows = [], [], []
        for ip in ips:
            rs = f"{ip}:8080"
            deleted, reason = handler.deleted.get(rs, (None, None))
            if ip in closed_at and deleted is not None:
                latencies.append(max(0.0, deleted - closed_at[ip]))
            if ip in zero_at and deleted is not None:
                from_zero.append(max(0.0, deleted - zero_at[ip]))
            rows.append(
                {
                    "rs": rs,
                    "closed_at": closed_at.get(ip),
                    "zero_at": zero_at.get(ip),
                    "deleted_at": deleted,
                    "kernel_gone_at": gone_at.get(ip),
                    "reason": reason,
                }
            )
        t0 = min(closed_at.values())
        for r in rows:
            for k in ("closed_at", "zero_at", "deleted_at", "kernel_gone_at"):
                if r[k] is not None:
                    r[k] = round(r[k] - t0, 3)
        out = {
            "samples": samples,
            "check_interval_s": check_interval,
            "target_s": check_interval + 0.5,
            "pods_served": served,
            "closed_to_deleted": summary(latencies),
            "zero_to_deleted": summary(from_zero),
            "real_servers": rows,
        }
        log(
            f"drain: last connection closed -> deleted p50 "
            f"{out['closed_to_deleted'].get('p50')} ms, max "
            f"{out['closed_to_deleted'].get('max')} ms ({len(latencies)} of {samples})"
        )
        return out
    finally:
        stop.set()
        if stop_daemon is not None:
            stop_daemon()
        logging.getLogger("ipvsctl.engine").removeHandler(handler)
        raw.close()
        node.close()

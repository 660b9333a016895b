"""The Service-deletion demo, run inside the lab VM (`make demo DEMO=service-delete`):

    python -m demo.service_delete [--out out/demo] [--modes drain,cut]

For each mode, on a fresh node (network namespace with its own IPVS table), ipvsctl's Daemon
runs in-process against an in-process FakeAPIServer (the real `kubernetes` client), serving
the Service `web` (ClusterIP 10.96.0.10:80) with one pod, `web-v1` (demo/app.py). Then:

1. a client pod starts a long download through the ClusterIP (`GET /stream`, one line every
   250 ms for `--download-for` seconds);
2. at `--delete-at` the Service and its EndpointSlice are deleted (`kubectl delete svc`);
3. a new connection to the ClusterIP is tried: how it fails, and how fast, is recorded;
4. at `--recreate-at` the Service is created again with a new pod, `web-v2` (a `kubectl
   apply` of the same manifest after a delete): a new request is sent and who answered it
   is recorded;
5. the download runs to its end, or breaks.

`drain` is ipvsctl as shipped (`--service-drain-timeout 30`, more than the download needs
after the deletion); `cut` is `--service-drain-timeout 0`, what kube-proxy's IPVS mode,
kube-router and Cilium do: the virtual server is deleted with the Service.

Writes out/demo/service-delete.json and out/demo/service-delete.txt and prints the report.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from demo.rollout import MODULES, REPO, LogCapture, say
from ipvsctl.daemon.options import DrainOptions, HTTPOptions, SourceOptions

VIP, PORT = "10.96.0.10", 80
V1 = ("web-v1", "10.244.1.11")
V2 = ("web-v2", "10.244.1.21")
SLICE_V1, SLICE_V2 = "web-abcde", "web-fghij"
ECHOED = ("virtual server draining", "draining virtual server taken over", "real server deleted")
# (the log lines of ipvsctl.engine the report quotes)


def try_connect(netns: str, timeout: float = 10.0) -> tuple[str, float, str | None]:
    """A new connection and one request through the ClusterIP: (outcome, seconds, pod)."""
    from demo.clients import classify, request
    from ipvsctl.kernel.netns import run_in_netns

    def attempt() -> tuple[str, float, str | None]:
        t0 = time.monotonic()
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.settimeout(timeout)
        try:
            s.connect((VIP, PORT))
            pod = request(s, 0, True, bytearray())
            return "answered", round(time.monotonic() - t0, 3), pod
        except Exception as exc:
            return classify(exc), round(time.monotonic() - t0, 3), None
        finally:
            s.close()

    return run_in_netns(netns, attempt)


def run_mode(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    from demo.app import App
    from demo.clients import HalfClosed
    from demo.cluster import NAMESPACE, NODE_NAME, DemoClock
    from devkit.fakeapi import objects
    from devkit.fakeapi.server import FakeAPIServer
    from devkit.labkit import Node, wait_for
    from ipvsctl.daemon.options import DaemonOptions
    from ipvsctl.daemon.wiring import Daemon
    from ipvsctl.kernel.netlink import configure_host
    from ipvsctl.kube.client import KubeSource
    from ipvsctl.model import NodeContext

    timeout = args.service_drain_timeout if mode == "drain" else 0.0
    say(f"--- mode {mode}: --service-drain-timeout {timeout:g}")
    clock = DemoClock()
    node = Node()
    configure_host(kernel=node.kernel)
    client = node.make_client(ip6=None)
    api = FakeAPIServer().start()
    capture = LogCapture(clock, echo=False)
    logging.getLogger("ipvsctl").addHandler(capture)
    logging.getLogger("ipvsctl").setLevel(logging.INFO)
    daemon = None
    apps: list[App] = []
    events: dict[str, Any] = {}
    vs = f"{VIP}:{PORT}/TCP"

    def weights() -> dict[str, int]:
        got = node.ipvsadm().get(vs)
        return {} if got is None else {k: r.weight for k, r in got.real_servers.items()}

    def publish(pod: tuple[str, str], slice_name: str) -> None:
        name, ip = pod
        netns = node.make_pod(ip, name=name, tcp=()).netns.name
        apps.append(App(name, netns, ip, 8080, clock=clock))
        api.upsert(objects.service("web", NAMESPACE, cluster_ip=VIP))
        api.upsert(
            objects.endpoint_slice(
                slice_name, "web", [objects.endpoint(ip, pod=name, node=NODE_NAME)], NAMESPACE
            )
        )

    try:
        publish(V1, SLICE_V1)
        daemon = Daemon(
            DaemonOptions(
                node=NodeContext(NODE_NAME),
                source=SourceOptions(apiserver=api.url),
                drain=DrainOptions(
                    service_timeout=timeout,
                    check_interval=1.0,
                    state_dir=tempfile.mkdtemp(prefix=f"ipvsctl-demo-{mode}-"),
                ),
                http=HTTPOptions(listen="127.0.0.1:0"),
            ),
            node.kernel,
            KubeSource.from_config(apiserver=api.url),
        )
        daemon.start()
        wait_for(lambda: daemon.engine.started, timeout=300, what="ipvsctl ready")
        wait_for(lambda: weights() == {f"{V1[1]}:8080": 1}, timeout=120, what="web-v1")
        clock.rebase()
        say(f"t={clock():6.2f}s ipvsctl ready: {vs} -> {V1[0]}; t=0 from here")
        download = HalfClosed(
            client.netns.name,
            VIP,
            PORT,
            until=args.download_for,
            every_ms=250,
            half_close=False,
            clock=clock,
        )
        download.start()
        say(f"t={clock():6.2f}s download from {download.pod}, until t={args.download_for:g}s")

        time.sleep(max(0.0, args.delete_at - clock()))
        events["deleted"] = round(clock(), 3)
        api.delete("Service", NAMESPACE, "web")
        api.delete("EndpointSlice", NAMESPACE, SLICE_V1)
        say(f"t={events['deleted']:6.2f}s kubectl delete service web (and its EndpointSlice)")
        wait_for(lambda: weights() in ({}, {f"{V1[1]}:8080": 0}), timeout=60, what="the deletion")
        events["kernel_after_delete"] = weights() or None
        events["addresses_after_delete"] = sorted(node.interface_addresses())
        say(
            f"t={clock():6.2f}s kernel: {vs} "
            + (
                f"kept, {V1[0]} at weight 0; {VIP} still bound"
                if events["kernel_after_delete"]
                else "gone"
            )
        )
        outcome, took, _ = try_connect(client.netns.name)
        events["new_connection"] = {"t": round(clock(), 3), "outcome": outcome, "seconds": took}
        say(f"t={clock():6.2f}s a new connection to {VIP}:{PORT}: {outcome} after {took:.3f}s")

        time.sleep(max(0.0, args.recreate_at - clock()))
        events["recreated"] = round(clock(), 3)
        publish(V2, SLICE_V2)
        say(f"t={events['recreated']:6.2f}s kubectl apply: Service web again, pod {V2[0]}")
        wait_for(lambda: weights().get(f"{V2[1]}:8080") == 1, timeout=60, what="the new endpoint")
        outcome, took, pod = try_connect(client.netns.name)
        events["after_recreate"] = {
            "t": round(clock(), 3),
            "outcome": outcome,
            "pod": pod,
            "kernel": weights(),
        }
        say(f"t={clock():6.2f}s a new request: {outcome} by {pod}; kernel {weights()}")

        download.join(timeout=max(0.0, args.download_for - clock()) + 60)
        expected = int(args.download_for * 4) - 1
        events["download"] = {
            "pod": download.pod,
            "end": download.end,
            "ended": download.ended,
            "ticks": len(download.ticks),
            "expected_ticks": expected,
            "last_tick": download.ticks[-1] if download.ticks else None,
        }
        say(
            f"t={clock():6.2f}s download from {download.pod}: {download.end}, "
            f"{len(download.ticks)} lines received (about {expected} sent)"
        )
        wait_for(lambda: f"{V1[1]}:8080" not in weights(), timeout=120, what="web-v1's real server")
        events["v1_gone"] = round(clock(), 3)
        events["kernel_at_end"] = weights()
        status = daemon.status()
        ipvsadm = node.run("ipvsadm", "-Ln")
    finally:
        if daemon is not None:
            daemon.shutdown()
        for app in apps:
            app.sigkill()
        logging.getLogger("ipvsctl").removeHandler(capture)
        api.stop()
        node.close()
    log = [
        r
        for r in capture.records
        if r["logger"] == "ipvsctl.engine" and r["msg"] in (*ECHOED, "drain started")
    ]
    return {
        "mode": mode,
        "service_drain_timeout": timeout,
        "events": events,
        "ipvsctl_log": log,
        "status_at_end": status,
        "ipvsadm_at_end": ipvsadm,
    }


def render(docs: list[dict[str, Any]]) -> str:
    out = ["Service deleted during a long download (ipvsctl, real IPVS kernel)", ""]
    for d in docs:
        e = d["events"]
        dl = e.get("download", {})
        nc = e.get("new_connection", {})
        ar = e.get("after_recreate", {})
        out += [
            f"mode {d['mode']} (--service-drain-timeout {d['service_drain_timeout']:g})",
            f"  deleted at t={e.get('deleted')}s; kernel then: "
            + (
                f"virtual server kept, real servers {e['kernel_after_delete']}"
                if e.get("kernel_after_delete")
                else "virtual server deleted"
            ),
            f"  new connection after the deletion: {nc.get('outcome')} in {nc.get('seconds')}s",
            f"  re-created at t={e.get('recreated')}s: a new request answered by "
            f"{ar.get('pod')} ({ar.get('outcome')}); kernel {ar.get('kernel')}",
            f"  download from {dl.get('pod')}: {dl.get('end')}, {dl.get('ticks')} of about "
            f"{dl.get('expected_ticks')} lines, last at t={dl.get('last_tick')}",
            f"  web-v1's real server gone at t={e.get('v1_gone')}s; kernel at the end "
            f"{e.get('kernel_at_end')}",
            "  ipvsctl: "
            + "; ".join(
                f"t={r['t']:.2f} {r['msg']}"
                + (f" {r.get('rs')}" if r.get("rs") else "")
                + (f" ({r['reason']})" if r.get("reason") else "")
                for r in d["ipvsctl_log"]
            ),
            "",
        ]
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m demo.service_delete",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", default=str(REPO / "out" / "demo"))
    p.add_argument("--modes", default="drain,cut")
    p.add_argument("--download-for", type=float, default=20.0)
    p.add_argument("--delete-at", type=float, default=4.0)
    p.add_argument("--recreate-at", type=float, default=10.0)
    p.add_argument("--service-drain-timeout", type=float, default=30.0)
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        sys.exit("demo: needs root and an IPVS kernel: run `make demo DEMO=service-delete`")
    for m in MODULES:
        subprocess.run(["modprobe", m], capture_output=True, check=False)
    if not Path("/proc/net/ip_vs").exists():
        sys.exit("demo: no IPVS in this kernel: run `make demo DEMO=service-delete`")
    docs = [run_mode(m.strip(), args) for m in args.modes.split(",") if m.strip()]
    (out / "service-delete.json").write_text(
        json.dumps({"modes": docs, "kernel": os.uname().release}, indent=1, default=str) + "\n"
    )
    report = render(docs)
    (out / "service-delete.txt").write_text(report)
    print("\n" + report, flush=True)
    say(f"wrote {out / 'service-delete.json'} and {out / 'service-delete.txt'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

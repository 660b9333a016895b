"""Control-plane cost: what one daemon asks of the API server, measured against the fake API
server (which counts requests and response bytes), then multiplied out to a cluster.

    python -m bench.control_plane [--out out/bench/control-plane.json] [--markdown]

`measure()` runs the real daemon wiring (KubeSource + engine, in-memory kernel) through the
scenarios at a small size and returns per-daemon request counts by phase, and the bytes per
object of each kind as served. `model()` scales them to 1,000 and 5,000 nodes with 10,000
Services and 100,000 endpoints, and puts kube-proxy's and kube-router's informers beside.
tests/unit/test_control_plane_cost.py asserts the per-daemon counts, so a change that adds a
request per event fails there. Timings (backoff, probe) are shortened for the run; the
10-minute outage is computed from the real defaults in `KubeSettings`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from devkit.fakeapi import FakeAPIServer, objects
from devkit.harness import rs, vs
from ipvsctl.daemon.adapters import open_event_writer
from ipvsctl.daemon.options import DaemonOptions, DrainOptions, HTTPOptions, SourceOptions
from ipvsctl.daemon.wiring import Daemon
from ipvsctl.kernel.fake import FakeKernel
from ipvsctl.kube.backoff import Backoff
from ipvsctl.kube.client import KubeSource
from ipvsctl.kube.events import RATE_BURST, RATE_PER_MINUTE
from ipvsctl.kube.settings import KubeSettings
from ipvsctl.model import NodeContext
from ipvsctl.obs.metrics import Metrics
from ipvsctl.reconcile.loop import LoopConfig

FAST = KubeSettings(
    backoff_initial=0.02,
    backoff_max=0.1,
    healthy_watch_seconds=0.05,
    probe_interval=0.05,
    recovery_spread=0.02,
    join_timeout=2.0,
)

# Sizes of the modelled cluster.
SERVICES = 10_000
ENDPOINTS = 100_000
ENDPOINTS_PER_SLICE = 10  # 10,000 slices
PODS = 150_000  # every pod in the cluster (kube-router's pod informer lists them all)
PODS_PER_NODE = 30  # a node drain evicts these
# EndpointSlice updates per rolled pod: new endpoint not ready, then ready; the old one
# terminating, then gone (the EndpointSlice controller may batch some: an upper bound).
SLICE_EVENTS_PER_ROLLED_POD = 4
# Pod watch events per rolled pod (kube-router): new pod created, scheduled, started, ready;
# old pod deletionTimestamp set, not ready, containers stopped, deleted.
POD_EVENTS_PER_ROLLED_POD = 8
STEADY_SLICE_UPDATES_PER_SECOND = 1.0  # background churn in the whole cluster (assumed)
# Bytes of real objects as kube-apiserver serves them (JSON, managedFields included): the
# fake's builders are leaner (measured sizes are reported beside), so the model takes these.
TYPICAL_BYTES = {"service": 1500, "endpointslice": 3000, "pod": 6000}
OUTAGE_SECONDS = 600.0
# A rollout whose every pod had connections cut on every node (the worst case for Events):
# how long the rollout lasts, for the per-node rate limit.
CUT_ROLLOUT_MINUTES = 10.0


def _wait(cond: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met")
        time.sleep(0.005)  # polling state with a timeout


@dataclasses.dataclass
class Snapshot:
    requests: dict[str, int]
    bytes: dict[str, int]


def _snap(api: FakeAPIServer) -> Snapshot:
    req: dict[str, int] = {}
    for r in api.requests:
        key = f"{r.verb} {r.resource or r.path}"
        req[key] = req.get(key, 0) + 1
    by = {
        f"{v} {k}": api.bytes_sent(v, k)
        for v in ("list", "watch", "get")
        for k in ("Service", "EndpointSlice", "Pod")
    }
    by["get /readyz"] = sum(n for (v, r), n in api._bytes.items() if r == "/readyz")
    return Snapshot(req, {k: v for k, v in by.items() if v})


def _delta(a: Snapshot, b: Snapshot) -> dict[str, Any]:
    req = {k: b.requests.get(k, 0) - a.requests.get(k, 0) for k in b.requests}
    by = {k: b.bytes.get(k, 0) - a.bytes.get(k, 0) for k in b.bytes}
    return {
        "requests": {k: v for k, v in req.items() if v},
        "bytes": {k: v for k, v in by.items() if v},
    }


def _object_bytes(obj: dict) -> int:
    return len(json.dumps(obj, separators=(",", ":")))


def measure(
    services: int = 50, endpoints_per_service: int = 10, rollout: int = 20, steady_updates: int = 20
) -> dict[str, Any]:
    """Per-daemon requests and bytes by phase (see the module docstring)."""
    out: dict[str, Any] = {
        "size": {
            "services": services,
            "endpoints_per_service": endpoints_per_service,
            "rollout": rollout,
        }
    }
    with FakeAPIServer() as api, tempfile.TemporaryDirectory() as state:
        api.add_many(objects.cluster(services, endpoints_per_service))
        roll_ips = [f"10.250.0.{i}" for i in range(rollout)]
        api.add(objects.service("roll", cluster_ip="10.96.255.1"))
        api.add(
            objects.endpoint_slice(
                "roll-1",
                "roll",
                [objects.endpoint(ip, pod=f"old-{i}") for i, ip in enumerate(roll_ips)],
            )
        )
        for i, ip in enumerate(roll_ips):
            api.add(objects.pod(f"old-{i}", ip=ip))
        kernel = FakeKernel()
        metrics = Metrics()
        source = KubeSource.from_config(
            apiserver=api.url,
            settings=FAST,
            environ={},
            on_watch_restart=lambda r, why: metrics.watch_restarts.labels(r, why).inc(),
        )
        opts = DaemonOptions(
            node=NodeContext("node-a"),
            source=SourceOptions(apiserver=api.url),
            drain=DrainOptions(state_dir=state, timeout=300, check_interval=0.05),
            http=HTTPOptions(listen="127.0.0.1:0"),
        )
        writer = open_event_writer(opts, source, metrics)
        d = Daemon(
            opts,
            kernel,
            source,
            metrics=metrics,
            loop_config=LoopConfig(drain_check_interval=0.05, idle_wakeup=0.05),
            event_writer=writer,
        )
        s0 = _snap(api)
        d.start()
        try:
            _wait(lambda: d.engine.started and api.open_watches() == 2)
            s1 = _snap(api)
            out["startup"] = _delta(s0, s1)

            # Steady state: slice updates arrive as watch events, no request.
            e2k = "ipvsctl_event_to_kernel_seconds_count"
            before = metrics.value(e2k)
            for i in range(steady_updates):
                ns, name = f"ns-{i % 10}", f"svc-{i}"
                sl = api.get("EndpointSlice", ns, f"{name}-abcde")
                assert sl is not None
                sl["endpoints"][0]["conditions"]["ready"] = False
                api.update(sl)
            _wait(lambda: metrics.value(e2k) >= before + steady_updates)
            s2 = _snap(api)
            out["steady"] = _delta(s1, s2) | {"events": steady_updates}
            out["bytes_per_slice_event"] = (
                s2.bytes.get("watch EndpointSlice", 0) - s1.bytes.get("watch EndpointSlice", 0)
            ) / max(1, steady_updates)

            # Rollout: every old pod terminates (deletionTimestamp, endpoint terminating),
            # a new one takes its place, then the old endpoint goes. The Pods are there to
            # be read; the daemon reads none (its drains are bounded by the slices).
            stamp = "2099-01-01T00:00:00Z"
            eps = [objects.endpoint(ip, pod=f"old-{i}") for i, ip in enumerate(roll_ips)]
            roll_vs = vs("10.96.255.1", 80)
            for i, ip in enumerate(roll_ips):
                api.update(objects.pod(f"old-{i}", ip=ip, deletion_timestamp=stamp))
                eps[i] = objects.endpoint(
                    ip, pod=f"old-{i}", ready=False, serving=True, terminating=True
                )
                eps.append(objects.endpoint(f"10.251.0.{i}", pod=f"new-{i}"))
                api.update(objects.endpoint_slice("roll-1", "roll", eps))
            _wait(lambda: all(kernel.weight(roll_vs, rs(ip)) in (0, None) for ip in roll_ips))
            eps = [e for e in eps if not e["conditions"]["terminating"]]
            api.update(objects.endpoint_slice("roll-1", "roll", eps))
            for i in range(rollout):
                api.delete("Pod", "default", f"old-{i}")
            _wait(
                lambda: (
                    all(kernel.weight(roll_vs, rs(f"10.251.0.{i}")) == 1 for i in range(rollout))
                    and all(kernel.weight(roll_vs, rs(ip)) in (0, None) for ip in roll_ips)
                )
            )
            assert writer is not None and writer.flush(10.0)
            s3 = _snap(api)
            out["rollout"] = _delta(s2, s3) | {"pods": rollout, "slice_events": 2 * rollout + 1}

            # A rollout that cuts: every old pod of a Service with a 1 s drain-timeout still
            # has established connections at its deadline. One ConnectionsCut Event per pod,
            # up to the node's rate limit; the rest only counted.
            cut_ips = [f"10.252.0.{i}" for i in range(rollout)]
            api.add(
                objects.service(
                    "cut", cluster_ip="10.96.255.3", annotations={"ipvsctl.io/drain-timeout": "1s"}
                )
            )
            api.add(
                objects.endpoint_slice(
                    "cut-1",
                    "cut",
                    [objects.endpoint(ip, pod=f"cut-{i}") for i, ip in enumerate(cut_ips)],
                )
            )
            cut_vs = vs("10.96.255.3", 80)
            _wait(lambda: all(kernel.weight(cut_vs, rs(ip)) == 1 for ip in cut_ips))
            with d.loop.lock:
                for ip in cut_ips:
                    kernel.set_connections(cut_vs, rs(ip), active=2)
            s3b = _snap(api)
            api.update(objects.endpoint_slice("cut-1", "cut", []))
            cuts = "ipvsctl_drain_connections_cut_total"
            _wait(lambda: metrics.value(cuts, {"protocol": "TCP"}) >= 2 * rollout)
            assert writer.flush(10.0)
            out["cut_rollout"] = _delta(s3b, _snap(api)) | {
                "pods": rollout,
                "connections_cut": metrics.value(cuts, {"protocol": "TCP"}),
                "rate_limited": metrics.value(
                    "ipvsctl_events_total", {"reason": "ConnectionsCut", "result": "rate_limited"}
                ),
            }
            s3 = _snap(api)

            # Outage longer than the watch history: resumed watches get 410, one relist each.
            api.down()
            _wait(
                lambda: (
                    metrics.value(
                        "ipvsctl_watch_restarts_total", {"resource": "services", "reason": "error"}
                    )
                    >= 1
                )
            )
            api.add(objects.service("after-outage", cluster_ip="10.96.255.2"))
            api.compact()
            s4 = _snap(api)
            api.up()
            _wait(lambda: any("10.96.255.2" in op for op in kernel.ops), 10.0)
            _wait(lambda: api.open_watches() == 2)
            out["outage_recovery"] = _delta(s4, _snap(api))
        finally:
            d.shutdown()
        out["object_bytes"] = {
            "service": _object_bytes(objects.service("svc-1234", "ns-1", cluster_ip="10.96.4.210")),
            "endpointslice": _object_bytes(
                next(o for o in objects.cluster(1, 10) if o["kind"] == "EndpointSlice")
            ),
            "pod": _object_bytes(objects.pod("web-7c9f8d-abcde", ip="10.128.3.4")),
        }
    return out


def outage_requests(
    settings: KubeSettings | None = None, seconds: float = OUTAGE_SECONDS
) -> dict[str, float]:
    """Requests one daemon sends during an outage of `seconds` (no answer at all), with the
    real defaults: each reflector retries its watch on the backoff schedule (mean jitter), and
    one shared /readyz probe runs every probe_interval (mean) once a pause is long."""
    settings = settings or KubeSettings()
    b = Backoff(settings.backoff_initial, settings.backoff_max, jitter=0.0)
    mean = 1.0 - b.jitter / 2
    t, attempts, failures = 0.0, 0, 0
    while t < seconds:
        attempts += 1
        t += b.delay(failures) * mean  # a refused connection fails at once
        failures += 1
    # Probes: while a pause exceeds probe_interval, one per probe_interval (shared).
    probes = seconds / settings.probe_interval if settings.probe_interval else 0.0
    return {"watch_attempts_per_resource": attempts, "probes": probes}


def model(m: dict[str, Any], nodes: int) -> dict[str, dict[str, float]]:
    """Requests and bytes per daemon and per cluster for each scenario."""
    ob = {k: max(v, m["object_bytes"].get(k, 0)) for k, v in TYPICAL_BYTES.items()}
    slices = ENDPOINTS // ENDPOINTS_PER_SLICE
    list_bytes = SERVICES * ob["service"] + slices * ob["endpointslice"]
    # A watch event carries the whole slice, plus the measured framing.
    slice_event = ob["endpointslice"] + max(
        0.0, m["bytes_per_slice_event"] - m["object_bytes"]["endpointslice"]
    )
    out_req = outage_requests()
    rows: dict[str, dict[str, float]] = {}

    def row(
        name: str,
        req: float,
        byt: float,
        pod_req: float = 0.0,
        kp_req: float = 0.0,
        kp_bytes: float = 0.0,
        kr_req: float = 0.0,
        kr_bytes: float = 0.0,
        events: float = 0.0,
        kr_events: float = 0.0,
    ) -> None:
        rows[name] = {
            "cluster_events": events * nodes,
            "kube_router_cluster_events": kr_events * nodes,
            "daemon_requests": req,
            "daemon_bytes": byt,
            "cluster_requests": req * nodes,
            "cluster_bytes": byt * nodes,
            "pod_gets_cluster": pod_req * nodes,
            "kube_proxy_cluster_requests": kp_req * nodes,
            "kube_proxy_cluster_bytes": kp_bytes * nodes,
            "kube_router_cluster_requests": kr_req * nodes,
            "kube_router_cluster_bytes": kr_bytes * nodes,
        }

    # Steady state, per hour: each watch re-opens every ~450 s (300-600 s); events flow.
    rewatch = 2 * 3600 / 450
    steady_events = STEADY_SLICE_UPDATES_PER_SECOND * 3600
    row(
        "steady state (per hour)",
        rewatch,
        steady_events * slice_event,
        kp_req=rewatch,
        kp_bytes=steady_events * slice_event,
        kr_req=rewatch * 1.5,
        kr_bytes=steady_events * slice_event,
        events=steady_events,
        kr_events=steady_events,
    )
    # 1,000-pod rollout: slice events only. Pod GETs per terminating pod as measured (0
    # since issue 23: the daemon reads no Pod; kube-router watches every pod).
    rolled = 1000
    startup = m["startup"]["requests"]
    start_requests = sum(startup.values())
    gets_per_pod = m["rollout"]["requests"].get("get pods", 0) / m["rollout"]["pods"]
    row(
        "1,000-pod rollout",
        rolled * gets_per_pod,
        rolled * SLICE_EVENTS_PER_ROLLED_POD * slice_event + rolled * gets_per_pod * ob["pod"],
        pod_req=rolled * gets_per_pod,
        kp_bytes=rolled * SLICE_EVENTS_PER_ROLLED_POD * slice_event,
        kr_bytes=rolled
        * (SLICE_EVENTS_PER_ROLLED_POD * slice_event + POD_EVENTS_PER_ROLLED_POD * ob["pod"]),
        events=rolled * SLICE_EVENTS_PER_ROLLED_POD,
        kr_events=rolled * (SLICE_EVENTS_PER_ROLLED_POD + POD_EVENTS_PER_ROLLED_POD),
    )
    # The same rollout, every pod's connections cut through every node: Events are what one
    # node may write in the rollout's time (its rate limit), whatever the cuts.
    per_node_events = min(rolled, RATE_BURST + RATE_PER_MINUTE * CUT_ROLLOUT_MINUTES)
    row(
        "1,000-pod rollout, every pod cut on every node (Events)",
        per_node_events,
        rolled * SLICE_EVENTS_PER_ROLLED_POD * slice_event,
        kp_bytes=rolled * SLICE_EVENTS_PER_ROLLED_POD * slice_event,
        kr_bytes=rolled
        * (SLICE_EVENTS_PER_ROLLED_POD * slice_event + POD_EVENTS_PER_ROLLED_POD * ob["pod"]),
        events=rolled * SLICE_EVENTS_PER_ROLLED_POD,
        kr_events=rolled * (SLICE_EVENTS_PER_ROLLED_POD + POD_EVENTS_PER_ROLLED_POD),
    )
    drained = PODS_PER_NODE
    row(
        "node drain (30 pods)",
        drained * gets_per_pod,
        drained * (SLICE_EVENTS_PER_ROLLED_POD * slice_event + gets_per_pod * ob["pod"]),
        pod_req=drained * gets_per_pod,
        kp_bytes=drained * SLICE_EVENTS_PER_ROLLED_POD * slice_event,
        kr_bytes=drained
        * (SLICE_EVENTS_PER_ROLLED_POD * slice_event + POD_EVENTS_PER_ROLLED_POD * ob["pod"]),
        events=drained * SLICE_EVENTS_PER_ROLLED_POD,
        kr_events=drained * (SLICE_EVENTS_PER_ROLLED_POD + POD_EVENTS_PER_ROLLED_POD),
    )
    # 10-minute outage and recovery: refused watch retries and probes during, then one
    # relist of each resource (from the watch cache) and two watches.
    recovery = sum(
        m["outage_recovery"]["requests"].get(k, 0)
        for k in ("list services", "list endpointslices", "watch services", "watch endpointslices")
    )
    during = 2 * out_req["watch_attempts_per_resource"] + out_req["probes"]
    row(
        "10-min API outage + recovery",
        during + recovery,
        list_bytes,
        kp_req=2 * out_req["watch_attempts_per_resource"] + 4,
        kp_bytes=list_bytes,
        kr_req=3 * out_req["watch_attempts_per_resource"] + 6,
        kr_bytes=list_bytes + PODS * ob["pod"],
    )
    # DaemonSet rollout: every daemon restarts once: two lists (cache) and two watches.
    row(
        "DaemonSet rollout",
        start_requests,
        list_bytes,
        kp_req=4,
        kp_bytes=list_bytes,
        kr_req=6,
        kr_bytes=list_bytes + PODS * ob["pod"],
    )
    return rows


def _human(n: float) -> str:
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def _count(n: float) -> str:
    return f"{n / 1e6:.1f} M" if n >= 1e6 else f"{n / 1e3:.1f} k" if n >= 1e4 else f"{n:.0f}"


def markdown(m: dict[str, Any]) -> str:
    lines = [
        "| scenario | nodes | per daemon: requests | per daemon: bytes | cluster: requests "
        "(of which pod GETs) | cluster: watch events | cluster: bytes | "
        "kube-proxy: requests / bytes | kube-router: requests / events / bytes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for nodes in (1000, 5000):
        for name, r in model(m, nodes).items():
            lines.append(
                f"| {name} | {nodes:,} | {_count(r['daemon_requests'])} | "
                f"{_human(r['daemon_bytes'])} | {_count(r['cluster_requests'])} "
                f"({_count(r['pod_gets_cluster'])}) | {_count(r['cluster_events'])} | "
                f"{_human(r['cluster_bytes'])} | "
                f"{_count(r['kube_proxy_cluster_requests'])} / "
                f"{_human(r['kube_proxy_cluster_bytes'])} | "
                f"{_count(r['kube_router_cluster_requests'])} / "
                f"{_count(r['kube_router_cluster_events'])} / "
                f"{_human(r['kube_router_cluster_bytes'])} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.control_plane")
    p.add_argument("--out", default="out/bench/control-plane.json")
    p.add_argument("--markdown", action="store_true")
    args = p.parse_args(argv)
    m = measure()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {"measured": m, "model": {n: model(m, n) for n in (1000, 5000)}},
            indent=1,
            sort_keys=True,
        )
    )
    print(markdown(m) if args.markdown else json.dumps(m, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    threading.current_thread().name = "bench"
    sys.exit(main())

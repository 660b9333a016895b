"""The control plane's moves, played as Kubernetes plays them, on the lab's fake API server.

- **Pods.** A pod is a netns on its node (labkit.Pod) running an app: `http` pods run
  demo/app.py (requests, `/stream` downloads; on SIGTERM it stops accepting and finishes
  what is open; SIGKILL resets it), `udp` pods a DNS-like responder (dns.py: on SIGTERM
  it stops answering at once). With the barrier on, each pod has the shutdown-manager sidecar on
  :9797 (`ipvsctl.daemon.shutdown_manager.ShutdownManager`, run in-process in the pod's
  netns: a Python process per pod costs tens of seconds in the emulated guest) asking every
  node's daemon; with it off, the pod has no preStop.
- **The kubelet** (per node): probes each pod's readiness every `probe_interval` from the
  node (an HTTP GET, or a UDP query; `probe_timeout`); a pod is ready after its first good
  probe and not ready after `probe_failures` bad ones in a row (failureThreshold). Deleting
  a pod: its Pod gets `deletionTimestamp` (now + grace) and its endpoint turns terminating;
  the kubelet runs the preStop (`httpGet /shutdown` on :9797, from the node) when there is
  one, then SIGTERM; at the grace period, SIGKILL; once the app has exited, the Pod is
  deleted and its endpoint leaves the slice.
- **The EndpointSlice controller**: one slice per Service, rewritten whenever a pod of its
  Deployment changes (kube.endpoint_slice: conditions, hints).
- **The Deployment and ReplicaSet controllers**: a rolling update with maxSurge 1 and
  maxUnavailable 0 (a new pod, ready, then an old one deleted, one at a time), scaling, and
  eviction of a node's pods (each replaced at once on another schedulable node).
- **Nodes and Services**: taints on Node objects, Services created, changed and deleted.

Every move is kept in `events` with its time on the lab clock.
"""

from __future__ import annotations

import contextlib
import datetime
import itertools
import json
import socket
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from clusterlab import kube
from clusterlab.dns import DnsResponder
from clusterlab.net import ClusterNode, Network
from demo.app import App
from devkit.fakeapi.server import FakeAPIServer
from devkit.labkit import NODE_GW4, Pod
from ipvsctl.kernel.netns import enter_netns, run_in_netns

APP_PORT = 8080
DNS_PORT = 5353
SIDECAR_PORT = 9797


class Clock:
    """Seconds since the lab started (monotonic), and the wall time of that start."""

    def __init__(self) -> None:
        self.mono0 = time.monotonic()
        self.wall0 = time.time()

    def __call__(self) -> float:
        return round(time.monotonic() - self.mono0, 3)

    def rfc3339(self, t: float) -> str:
        """A lab time as an API timestamp, rounded up to the second (never early)."""
        wall = self.wall0 + t
        return datetime.datetime.fromtimestamp(int(wall + 0.999), datetime.UTC).strftime(
            "%Y-%m-%dT%H:%M:%SZ"
        )


@dataclass
class Deployment:
    name: str
    kind: str  # "http" or "udp"
    version: str = "v1"
    grace: float = 40.0
    pods: list[str] = field(default_factory=list)


@dataclass
class PodRecord:
    """A pod's life on the lab clock (what the report shows)."""

    name: str
    deployment: str
    version: str
    node: str
    ip: str
    created: float
    ready: float | None = None
    deleting: float | None = None
    deadline: float | None = None
    prestop_start: float | None = None
    prestop_end: float | None = None
    prestop_answer: dict[str, Any] | None = None
    sigterm: float | None = None
    exited: float | None = None
    killed_connections: int = 0
    removed: float | None = None


class LivePod:
    """A pod's running parts: its netns, app, sidecar and the kubelet's view of it."""

    def __init__(self, record: PodRecord, node: ClusterNode, lab: Pod, dep: Deployment) -> None:
        self.record = record
        self.node = node
        self.lab = lab
        self.dep = dep
        self.uid = f"uid-{record.name}"
        self.app: App | None = None
        self.udp: DnsResponder | None = None
        self.sidecar: Any = None
        self.serving = False
        self.failures = 0  # readiness probes failed in a row
        self.exited = threading.Event()
        self.kubelet: threading.Thread | None = None

    @property
    def name(self) -> str:
        return self.record.name

    @property
    def ip(self) -> str:
        return self.record.ip

    @property
    def terminating(self) -> bool:
        return self.record.deleting is not None

    @property
    def gone(self) -> bool:
        return self.record.removed is not None

    def endpoint(self) -> kube.EndpointState:
        return kube.EndpointState(
            pod=self.name,
            uid=self.uid,
            ip=self.ip,
            node=self.node.name,
            zone=self.node.zone,
            ready=self.serving and not self.terminating,
            serving=self.serving,
            terminating=self.terminating,
        )


class ControlPlane:
    def __init__(
        self,
        api: FakeAPIServer,
        net: Network,
        clock: Clock,
        daemon_urls: Callable[[], list[str]],
        *,
        probe_interval: float = 2.0,
        probe_timeout: float = 3.0,
        probe_failures: int = 3,
        sidecar_timeout: float = 25.0,
        sidecar_check_interval: float = 0.5,
    ) -> None:
        self.api = api
        self.net = net
        self.clock = clock
        self.daemon_urls = daemon_urls
        self.probe_interval = probe_interval
        self.probe_timeout = probe_timeout
        self.probe_failures = probe_failures
        self.sidecar_timeout = sidecar_timeout
        self.sidecar_check_interval = sidecar_check_interval
        self.barrier = True  # pods get the shutdown-manager and its preStop
        self.service_annotations: dict[str, str] = {}
        self.responders: list[DnsResponder] = []  # every udp pod's, gone ones too
        self.services: dict[str, kube.ServiceSpec] = {}
        self.deployments: dict[str, Deployment] = {}
        self.pods: dict[str, LivePod] = {}
        self.records: list[PodRecord] = []
        self.nodes: dict[str, kube.NodeSpec] = {}
        self.events: list[tuple[float, str, str]] = []
        self._lock = threading.RLock()
        self._published: dict[str, Any] = {}
        self._seq = itertools.count(1)
        self._stop = threading.Event()
        for n in net.nodes:
            spec = kube.NodeSpec(n.name, n.ip, n.zone, n.pod_cidr)
            self.nodes[n.name] = spec
            api.upsert(kube.node_object(spec))
        self._probers = [
            threading.Thread(
                target=self._probe_loop, args=(n,), daemon=True, name=f"kubelet-{n.name}"
            )
            for n in net.nodes
        ]
        for t in self._probers:
            t.start()

    def note(self, what: str, detail: str = "") -> None:
        self.events.append((self.clock(), what, detail))

    # --- Services and the EndpointSlice controller ------------------------------------------
    def _service_object(self, spec: kube.ServiceSpec) -> dict[str, Any]:
        obj = kube.service_object(spec)
        obj["metadata"]["annotations"].update(self.service_annotations)
        return obj

    def set_service_annotations(self, annotations: dict[str, str]) -> None:
        """Annotations every Service carries (the lab's mode), applied to those there now."""
        with self._lock:
            self.service_annotations = dict(annotations)
            for spec in self.services.values():
                self.api.upsert(self._service_object(spec))
        self.note("service annotations", str(annotations))

    def create_service(self, spec: kube.ServiceSpec) -> None:
        with self._lock:
            self.services[spec.name] = spec
            self.api.upsert(self._service_object(spec))
            self._publish_slice(spec)
        self.note("service created", spec.name)

    def update_service(self, spec: kube.ServiceSpec) -> None:
        with self._lock:
            self.services[spec.name] = spec
            self.api.upsert(self._service_object(spec))
            self._publish_slice(spec)
        self.note("service changed", f"{spec.name} trafficDistribution={spec.traffic_distribution}")

    def delete_service(self, name: str) -> kube.ServiceSpec:
        """`kubectl delete svc`: the Service, then its slice (garbage-collected with it)."""
        with self._lock:
            spec = self.services.pop(name)
            self.api.delete("Service", kube.NAMESPACE, name)
            self.api.delete("EndpointSlice", kube.NAMESPACE, kube.slice_name(name))
            self._published.pop(name, None)
        self.note("service deleted", name)
        return spec

    def _publish_slice(self, spec: kube.ServiceSpec) -> None:
        eps = [
            p.endpoint() for p in self.pods.values() if p.dep.name == spec.selector and not p.gone
        ]
        obj = kube.endpoint_slice(spec, eps)
        if self._published.get(spec.name) != obj:
            self._published[spec.name] = obj
            self.api.upsert(obj)

    def _pods_changed(self, dep: str) -> None:
        with self._lock:
            for spec in self.services.values():
                if spec.selector == dep:
                    self._publish_slice(spec)

    # --- Nodes -----------------------------------------------------------------------------
    def taint(self, node: str, key: str, effect: str = "NoSchedule") -> None:
        with self._lock:
            spec = self.nodes[node]
            self.nodes[node] = kube.NodeSpec(
                spec.name, spec.ip, spec.zone, spec.pod_cidr, (*spec.taints, (key, effect))
            )
            self.api.upsert(kube.node_object(self.nodes[node]))
        self.note("node tainted", f"{node} {key}:{effect}")

    def untaint(self, node: str) -> None:
        with self._lock:
            spec = self.nodes[node]
            self.nodes[node] = kube.NodeSpec(spec.name, spec.ip, spec.zone, spec.pod_cidr)
            self.api.upsert(kube.node_object(self.nodes[node]))
        self.note("node untainted", node)

    def schedulable(self, node: str) -> bool:
        return not any(e in ("NoSchedule", "NoExecute") for _, e in self.nodes[node].taints)

    # --- pods ------------------------------------------------------------------------------
    def add_deployment(
        self, name: str, kind: str, replicas: int, grace: float = 40.0
    ) -> Deployment:
        dep = Deployment(name, kind, grace=grace)
        self.deployments[name] = dep
        for node in self._spread(dep, replicas):
            self.start_pod(dep, node)
        self.wait_ready(dep)
        return dep

    def live(self, dep: Deployment | None = None) -> list[LivePod]:
        """Pods not terminating (of `dep`), oldest first."""
        return [
            p for p in self.pods.values() if not p.terminating and (dep is None or p.dep is dep)
        ]

    def _spread(self, dep: Deployment, count: int, exclude: str | None = None) -> list[ClusterNode]:
        """Where the scheduler would put `count` more pods: schedulable nodes, fewest of the
        Deployment's pods first (topology spread)."""
        load = {n.name: 0 for n in self.net.nodes}
        for p in self.live(dep):
            load[p.node.name] += 1
        out = []
        for _ in range(count):
            candidates = [
                n for n in self.net.nodes if self.schedulable(n.name) and n.name != exclude
            ]
            if not candidates:
                raise RuntimeError("no schedulable node")
            best = min(candidates, key=lambda n: (load[n.name], n.index))
            load[best.name] += 1
            out.append(best)
        return out

    def start_pod(self, dep: Deployment, node: ClusterNode) -> LivePod:
        name = f"{dep.name}-{dep.version}-{next(self._seq)}"
        ip = node.pod_ip()
        record = PodRecord(name, dep.name, dep.version, node.name, ip, created=self.clock())
        lab = node.make_pod(name, ip)
        pod = LivePod(record, node, lab, dep)
        if dep.kind == "http":
            pod.app = App(name, lab.netns.name, ip, APP_PORT, clock=self.clock)
        else:
            pod.udp = DnsResponder(name, lab.netns.name, ip, DNS_PORT, self.clock)
            self.responders.append(pod.udp)
        if self.barrier:
            pod.sidecar = self._start_sidecar(pod)
        with self._lock:
            self.pods[name] = pod
            self.records.append(record)
            dep.pods.append(name)
        self.api.upsert(kube.pod_object(name, pod.uid, ip, node.name, dep.name, int(dep.grace)))
        self.note("pod created", f"{name} on {node.name} ({ip})")
        return pod

    def _start_sidecar(self, pod: LivePod) -> Any:
        """The shutdown-manager sidecar, in the pod's netns (its threads too)."""
        from ipvsctl.daemon.shutdown_manager import ManagerOptions, ShutdownManager
        from ipvsctl.shutdown.barrier import BarrierConfig

        options = ManagerOptions(
            pod_ips=(pod.ip,),
            listen=f"0.0.0.0:{SIDECAR_PORT}",
            daemons=tuple(self.daemon_urls()),
            ports=(APP_PORT,) if pod.dep.kind == "http" else (),
            proc_net=pod.lab.proc_net(),
            node_ips=(NODE_GW4,),
            barrier=BarrierConfig(
                check_interval=self.sidecar_check_interval, timeout=self.sidecar_timeout
            ),
        )

        def start() -> Any:
            manager = ShutdownManager(options)
            manager.start()
            return manager

        return run_in_netns(pod.lab.netns.name, start)

    def wait_ready(self, dep: Deployment | LivePod, timeout: float = 300.0) -> None:
        pods = [dep] if isinstance(dep, LivePod) else self.live(dep)
        deadline = time.monotonic() + timeout
        while not all(p.record.ready is not None for p in pods):
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"pods not ready: {[p.name for p in pods if not p.record.ready]}"
                )
            time.sleep(0.2)

    def delete_pod(self, pod: LivePod) -> None:
        """`kubectl delete pod` (or the ReplicaSet scaling down, or an eviction): returns at
        once; the kubelet's part runs in its own thread."""
        now = self.clock()
        with self._lock:
            pod.record.deleting = now
            pod.record.deadline = round(now + pod.dep.grace, 3)
            self._pods_changed(pod.dep.name)
        self.api.upsert(
            kube.pod_object(
                pod.name, pod.uid, pod.ip, pod.node.name, pod.dep.name, int(pod.dep.grace),
                deletion_timestamp=self.clock.rfc3339(pod.record.deadline),
            )
        )  # fmt: skip
        self.note("pod deleting", pod.name)
        pod.kubelet = threading.Thread(
            target=self._terminate, args=(pod,), daemon=True, name=f"kubelet-{pod.name}"
        )
        pod.kubelet.start()

    def _terminate(self, pod: LivePod) -> None:
        rec = pod.record
        assert rec.deadline is not None
        if self.barrier and pod.sidecar is not None:  # draining off: no preStop
            rec.prestop_start = self.clock()
            rec.prestop_answer = self._prestop(pod, max(1.0, rec.deadline - self.clock()))
            rec.prestop_end = self.clock()
            self.note("preStop returned", f"{pod.name} {rec.prestop_answer.get('outcome')}")
        rec.sigterm = self.clock()
        if pod.app is not None:
            pod.app.sigterm()
            exited = pod.app.exited.wait(max(0.0, rec.deadline - self.clock()))
            if not exited:
                rec.killed_connections = pod.app.sigkill()
                self.note(
                    "SIGKILL at the grace period", f"{pod.name} {rec.killed_connections} open"
                )
        elif pod.udp is not None:
            pod.udp.close()
        if pod.sidecar is not None:
            with contextlib.suppress(Exception):
                pod.sidecar.stop()
        rec.exited = self.clock()
        with self._lock:
            rec.removed = self.clock()
            self._pods_changed(pod.dep.name)
        self.api.delete("Pod", kube.NAMESPACE, pod.name)
        self.note("pod removed", pod.name)
        pod.lab.close()
        pod.exited.set()

    def _prestop(self, pod: LivePod, timeout: float) -> dict[str, Any]:
        """The kubelet's `httpGet /shutdown` from the node; any answer or failure is "done"."""
        url = f"http://{pod.ip}:{SIDECAR_PORT}/shutdown"

        def get() -> dict[str, Any]:
            try:
                with urllib.request.urlopen(url, timeout=timeout) as r:
                    doc = json.loads(r.read())
                    return doc if isinstance(doc, dict) else {"answer": doc}
            except (OSError, ValueError) as exc:
                return {"outcome": "error", "error": repr(exc)}

        return run_in_netns(pod.node.netns, get)

    def sidecar_status(self, pod: LivePod) -> dict[str, Any] | None:
        """The sidecar's /status, from the node (the barrier's stage and who it waits for)."""
        url = f"http://{pod.ip}:{SIDECAR_PORT}/status"

        def get() -> dict[str, Any] | None:
            try:
                with urllib.request.urlopen(url, timeout=5) as r:
                    doc = json.loads(r.read())
                    return doc if isinstance(doc, dict) else None
            except (OSError, ValueError):
                return None

        return run_in_netns(pod.node.netns, get)

    # --- the kubelet's readiness probes ----------------------------------------------------
    def _probe_loop(self, node: ClusterNode) -> None:
        enter_netns(node.netns)  # probes come from the node, as the kubelet's
        while not self._stop.is_set():
            started = time.monotonic()
            for pod in [p for p in list(self.pods.values()) if p.node is node and not p.gone]:
                passed = self._probe(pod, self.probe_timeout)
                pod.failures = 0 if passed else pod.failures + 1
                # ready at the first good probe; not ready after failureThreshold bad ones
                ok = passed or (pod.serving and pod.failures < self.probe_failures)
                if ok != pod.serving and not pod.gone:
                    with self._lock:
                        pod.serving = ok
                        if ok and pod.record.ready is None:
                            pod.record.ready = self.clock()
                        self._pods_changed(pod.dep.name)
                    self.note("pod ready" if ok else "pod not serving", pod.name)
            self._stop.wait(max(0.05, self.probe_interval - (time.monotonic() - started)))

    @staticmethod
    def _probe(pod: LivePod, timeout: float) -> bool:
        if pod.dep.kind == "http":
            try:
                with socket.create_connection((pod.ip, APP_PORT), timeout=timeout) as s:
                    s.sendall(b"GET /?work=0 HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n")
                    return s.recv(12).startswith(b"HTTP/1.1 200")
            except OSError:
                return False
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.settimeout(timeout)
            try:
                s.sendto(b"probe", (pod.ip, DNS_PORT))
                return bool(s.recvfrom(2048)[0])
            except OSError:
                return False

    # --- the Deployment's moves ------------------------------------------------------------
    def rollout(self, dep: Deployment, version: str, ready_timeout: float = 300.0) -> None:
        """A rolling update, maxSurge 1, maxUnavailable 0; returns once every old pod is
        deleting (not gone: `wait_settled`)."""
        old = self.live(dep)
        dep.version = version
        self.note("rollout started", f"{dep.name} -> {version}")
        for pod in old:
            node = pod.node if self.schedulable(pod.node.name) else self._spread(dep, 1)[0]
            new = self.start_pod(dep, node)
            self.wait_ready(new, ready_timeout)
            self.delete_pod(pod)
        self.note("rollout done", f"{dep.name} {version}")

    def scale(self, dep: Deployment, replicas: int) -> None:
        live = self.live(dep)
        if replicas < len(live):
            for pod in sorted(live, key=lambda p: p.record.created, reverse=True)[
                : len(live) - replicas
            ]:
                self.delete_pod(pod)
        else:
            for node in self._spread(dep, replicas - len(live)):
                self.start_pod(dep, node)
        self.note("scaled", f"{dep.name} to {replicas}")

    def evict(self, node: str) -> list[LivePod]:
        """The node's pods evicted (the drain); each replaced at once elsewhere."""
        evicted = [p for p in self.live() if p.node.name == node]
        for pod in evicted:
            self.delete_pod(pod)
            self.start_pod(pod.dep, self._spread(pod.dep, 1, exclude=node)[0])
        self.note("node drained of pods", f"{node}: {len(evicted)} evicted")
        return evicted

    def wait_settled(self, timeout: float = 300.0) -> None:
        """Until every deleted pod is gone (the kubelets are done)."""
        deadline = time.monotonic() + timeout
        for pod in list(self.pods.values()):
            if pod.kubelet is not None:
                pod.kubelet.join(max(0.0, deadline - time.monotonic()))
                if pod.kubelet.is_alive():
                    raise TimeoutError(f"pod {pod.name} still terminating")
        with self._lock:
            for name in [n for n, p in self.pods.items() if p.gone]:
                del self.pods[name]

    def close(self) -> None:
        self._stop.set()
        for pod in list(self.pods.values()):
            if pod.sidecar is not None:
                with contextlib.suppress(Exception):
                    pod.sidecar.stop()
            if pod.app is not None:
                pod.app.sigkill()
            if pod.udp is not None:
                pod.udp.close()
        for t in self._probers:
            t.join(timeout=10)

"""The simulated cluster: a FakeAPIServer serving one Deployment's Service, its EndpointSlice
and its Pods, and a small controller that does what the Deployment and EndpointSlice
controllers and the kubelet do during a rolling update (maxSurge 1, maxUnavailable 0):

1. a new pod starts (network namespace + app); after its readiness delay its endpoint is
   published `ready: true`;
2. then an old pod is deleted: its Pod gets `deletionTimestamp` = now + grace period and its
   endpoint turns `ready: false, serving: true, terminating: true` (as the EndpointSlice
   controller publishes terminating endpoints);
3. the kubelet runs the preStop hook (a sleep), then sends SIGTERM: the app stops accepting
   and finishes its open connections; when it exits, or when the grace period is over
   (SIGKILL), the Pod object is deleted and its endpoint removed from the slice;
4. the next pod is replaced once the new one is ready.

Every step is stamped on the demo's clock (seconds since the run started).
"""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from demo.app import App
from devkit.fakeapi import objects
from devkit.fakeapi.server import FakeAPIServer

NAMESPACE = "default"
SERVICE = "web"
SLICE = "web-abcde"
NODE_NAME = "node-1"


class DemoClock:
    """Seconds since the demo's time 0 (the start of the load, once `rebase` is called)."""

    def __init__(self) -> None:
        self.rebase()

    def rebase(self) -> float:
        """Make now time 0; returns by how much earlier readings must be shifted."""
        old = getattr(self, "mono0", None)
        self.mono0, self.wall0 = time.monotonic(), time.time()
        return 0.0 if old is None else self.mono0 - old

    def __call__(self) -> float:
        return time.monotonic() - self.mono0


def rfc3339(wall: float) -> str:
    # deletionTimestamp has second precision; round up so the deadline is never early
    return datetime.datetime.fromtimestamp(int(wall + 0.999), datetime.UTC).strftime(
        "%Y-%m-%dT%H:%M:%SZ"
    )


@dataclass
class PodRecord:
    name: str
    ip: str
    version: str
    created: float | None = None
    ready: float | None = None
    terminating: float | None = None
    deadline: float | None = None  # deletionTimestamp on the demo clock
    sigterm: float | None = None
    exited: float | None = None
    killed_connections: int = 0
    endpoint_removed: float | None = None
    served: int = 0

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Cluster:
    api: FakeAPIServer
    make_pod_netns: Callable[[str, str], str]  # (pod name, ip) -> netns name
    clock: DemoClock
    vip: str = "10.96.0.10"
    port: int = 80
    target_port: int = 8080
    annotations: dict[str, str] = field(default_factory=dict)
    readiness_delay: float = 1.5
    pre_stop: float = 5.0
    grace: float = 40.0
    pods: dict[str, PodRecord] = field(default_factory=dict)
    apps: dict[str, App] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._endpoints: dict[str, dict[str, Any]] = {}
        self._kubelets: list[threading.Thread] = []
        self.api.add(
            objects.service(
                SERVICE,
                NAMESPACE,
                cluster_ip=self.vip,
                ports=(("http", self.port, self.target_port),),
                annotations=self.annotations,
            )
        )
        self._publish()

    # --- EndpointSlice controller -------------------------------------------------------
    def _publish(self) -> None:
        with self._lock:
            eps = [dict(e) for e in self._endpoints.values()]
        self.api.upsert(
            objects.endpoint_slice(
                SLICE, SERVICE, eps, NAMESPACE, ports=(("http", self.target_port),)
            )
        )

    def _set_endpoint(self, pod: PodRecord, **conditions: Any) -> None:
        with self._lock:
            if conditions.get("remove"):
                self._endpoints.pop(pod.name, None)
            else:
                self._endpoints[pod.name] = objects.endpoint(
                    pod.ip, pod=pod.name, node=NODE_NAME, namespace=NAMESPACE, **conditions
                )
        self._publish()

    # --- pods -------------------------------------------------------------------------
    def start_pod(self, name: str, ip: str, version: str, wait_ready: bool = True) -> PodRecord:
        pod = PodRecord(name, ip, version, created=self.clock())
        self.pods[name] = pod
        netns = self.make_pod_netns(name, ip)
        self.apps[name] = App(name, netns, ip, self.target_port, clock=self.clock)
        self.api.upsert(objects.pod(name, NAMESPACE, ip=ip, node=NODE_NAME, grace=int(self.grace)))
        if wait_ready:
            time.sleep(self.readiness_delay)
        pod.ready = self.clock()
        self._set_endpoint(pod, ready=True)
        return pod

    def delete_pod(self, name: str) -> None:
        """What `kubectl delete pod` / the ReplicaSet does; returns at once, the kubelet
        part runs in a thread."""
        pod = self.pods[name]
        now = self.clock()
        pod.terminating = now
        deadline_wall = self.clock.wall0 + now + self.grace
        pod.deadline = round(int(deadline_wall + 0.999) - self.clock.wall0, 3)
        self.api.upsert(
            objects.pod(
                name,
                NAMESPACE,
                ip=pod.ip,
                node=NODE_NAME,
                deletion_timestamp=rfc3339(deadline_wall),
                grace=int(self.grace),
            )
        )
        self._set_endpoint(pod, ready=False, serving=True, terminating=True)
        t = threading.Thread(target=self._kubelet, args=(pod,), daemon=True, name=f"kubelet-{name}")
        self._kubelets.append(t)
        t.start()

    def _kubelet(self, pod: PodRecord) -> None:
        app = self.apps[pod.name]
        time.sleep(self.pre_stop)  # preStop: sleep
        pod.sigterm = self.clock()
        app.sigterm()
        assert pod.deadline is not None
        left = pod.deadline - self.clock()
        if not app.exited.wait(max(0.0, left)):
            pod.killed_connections = app.sigkill()
        pod.exited = app.exited_at if app.exited_at is not None else self.clock()
        pod.served = app.served
        self.api.delete("Pod", NAMESPACE, pod.name)
        pod.endpoint_removed = self.clock()
        self._set_endpoint(pod, remove=True)

    def rolling_update(self, old: list[str], new: list[tuple[str, str]], version: str) -> None:
        """Replace the pods `old` by `new` [(name, ip)], one at a time."""
        for old_name, (name, ip) in zip(old, new, strict=True):
            self.start_pod(name, ip, version)
            self.delete_pod(old_name)

    def wait_kubelets(self, timeout: float) -> bool:
        end = time.monotonic() + timeout
        for t in self._kubelets:
            t.join(max(0.0, end - time.monotonic()))
        return not any(t.is_alive() for t in self._kubelets)

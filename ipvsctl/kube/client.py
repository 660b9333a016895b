"""KubeSource: the API-server implementation of `ObjectSource`.

Threads (all daemon threads, started by `run` and stopped when `stop` is set):
- `ipvsctl-kube-services`, `ipvsctl-kube-endpointslices`: one reflector each (`kube.watch`):
  paginated list -> Replace -> watch -> Upsert/Delete, relisting on 410 and broken streams;
- `ipvsctl-kube-pods-N`: answer `request_pod` with single GETs (`kube.pods`);
- `ipvsctl-kube-nodes` (with a node name): this node's own Node, one object (`kube.node`).

Only the calls in `kube.permissions.REQUIRED_PERMISSIONS` are made: list+watch Services and
EndpointSlices in all namespaces, get Pods.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from ipvsctl.kube.config import load_configuration, new_api_client
from ipvsctl.kube.logs import log
from ipvsctl.kube.node import node_list_func
from ipvsctl.kube.pods import PodFetcher
from ipvsctl.kube.settings import KubeSettings
from ipvsctl.kube.trim import trim_endpoint_slice, trim_node, trim_service
from ipvsctl.kube.watch import Reflector, WatchRestartCallback
from ipvsctl.model import PodRef
from ipvsctl.source.events import EventSink, ObjectKind, RawObject, SourceEvent


class KubeSource:
    """Services and EndpointSlices from the API server (list+watch), Pods on request (get).

    `on_watch_restart(resource, reason)` is called on every watch restart, `resource` being
    "services" or "endpointslices" and `reason` one of closed (clean end, re-watch), expired
    (410, relist), timeout (read timeout, relist), error (relist); the daemon counts them in
    `ipvsctl_watch_restarts_total`. `sink` is called from several threads, one call at a
    time; emitted objects are trimmed (`kube.trim`) and must be treated as read-only (a pod
    answer may be emitted again from the cache). `clock` stamps `received` and times the
    pod cache; `rng` drives the jitter.
    """

    def __init__(
        self,
        api_client: k8s_client.ApiClient,
        *,
        settings: KubeSettings | None = None,
        on_watch_restart: WatchRestartCallback | None = None,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        node_name: str | None = None,
    ) -> None:
        self._api = api_client
        # With a node name, this node's Node is watched too and a Replace of it is part of
        # the first events (`emits_node`, for EngineConfig.wait_for_node).
        self.node_name = node_name
        self.emits_node = bool(node_name)
        self.settings = settings or KubeSettings()
        self._on_watch_restart = on_watch_restart
        self._clock = clock
        self._rng = rng or random.Random()
        self._core = k8s_client.CoreV1Api(api_client)
        self._discovery = k8s_client.DiscoveryV1Api(api_client)
        s = self.settings
        self._pods = PodFetcher(
            self._get_pod,
            workers=s.pod_workers,
            cache_seconds=s.pod_cache_seconds,
            attempts=s.pod_attempts,
            backoff_initial=s.pod_backoff_initial,
            backoff_max=s.pod_backoff_max,
            clock=clock,
            rng=self._rng,
        )
        self._halt = threading.Event()
        self._sink_lock = threading.Lock()
        self._started = False
        self.reflectors: list[Reflector] = []

    @classmethod
    def from_config(
        cls,
        kubeconfig: str | None = None,
        apiserver: str | None = None,
        *,
        context: str | None = None,
        environ: Mapping[str, str] | None = None,
        settings: KubeSettings | None = None,
        on_watch_restart: WatchRestartCallback | None = None,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        node_name: str | None = None,
    ) -> KubeSource:
        """Configure from `kubeconfig` (else $KUBECONFIG), else the in-cluster service
        account; `apiserver` overrides the server URL (http:// allowed). Raises
        SourceConfigError with one line saying what is wrong. Does not contact the server:
        an API server that is down at start-up is retried by `run`."""
        cfg = load_configuration(kubeconfig, apiserver, context=context, environ=environ)
        return cls(
            new_api_client(cfg),
            settings=settings,
            on_watch_restart=on_watch_restart,
            clock=clock,
            rng=rng,
            node_name=node_name,
        )

    @property
    def host(self) -> str:
        return str(self._api.configuration.host)

    # ---- ObjectSource -------------------------------------------------------------------

    def run(self, sink: EventSink, stop: threading.Event) -> None:
        """Emit a Replace of Services and one of EndpointSlices, then their changes, until
        `stop` is set; then stop every thread (in-flight requests are broken off) and return.
        Can be called once."""
        if self._started:
            raise RuntimeError("KubeSource.run() can only be called once")
        self._started = True
        halt = self._halt

        def emit(event: SourceEvent) -> None:
            with self._sink_lock:
                if not halt.is_set():
                    sink(event)

        s = self.settings
        common: dict[str, Any] = {
            "emit": emit,
            "settings": s,
            "on_restart": self._on_watch_restart,
            "clock": self._clock,
            "rng": self._rng,
        }
        self.reflectors = [
            Reflector(
                kind=ObjectKind.SERVICE,
                resource="services",
                list_func=self._core.list_service_for_all_namespaces,
                trim=trim_service,
                **common,
            ),
            Reflector(
                kind=ObjectKind.ENDPOINT_SLICE,
                resource="endpointslices",
                list_func=self._discovery.list_endpoint_slice_for_all_namespaces,
                trim=trim_endpoint_slice,
                **common,
            ),
        ]
        if self.node_name:
            self.reflectors.append(Reflector(
                kind=ObjectKind.NODE,
                resource="nodes",
                list_func=node_list_func(self._core.list_node, self.node_name, emit,
                                         clock=self._clock),
                trim=trim_node,
                **common,
            ))
        threads = [
            threading.Thread(
                target=self._run_reflector,
                args=(r, halt),
                name=f"ipvsctl-kube-{r.resource}",
                daemon=True,
            )
            for r in self.reflectors
        ]
        self._pods.start(emit, halt)
        for t in threads:
            t.start()
        log(logging.INFO, "API source started", host=self.host)
        try:
            stop.wait()
        finally:
            halt.set()
            for r in self.reflectors:
                r.interrupt()
            self._pods.wake()
            deadline = time.monotonic() + s.join_timeout
            for t in threads:
                t.join(max(0.0, deadline - time.monotonic()))
            stuck = [t.name for t in threads if t.is_alive()]
            stuck += [t.name for t in self._pods.join(max(0.0, deadline - time.monotonic()))]
            if stuck:
                log(logging.WARNING, "API source threads still busy at stop", threads=stuck)
            self._api.rest_client.pool_manager.clear()
            log(logging.INFO, "API source stopped")

    def request_pod(self, ref: PodRef) -> None:
        self._pods.request(ref)

    # ---- internals ----------------------------------------------------------------------

    @staticmethod
    def _run_reflector(reflector: Reflector, halt: threading.Event) -> None:
        try:
            reflector.run(halt)
        except BaseException as exc:  # a bug: say so loudly rather than go quiet
            logging.getLogger("ipvsctl.kube").exception(
                "reflector crashed", extra={"fields": {"resource": reflector.resource}}
            )
            if not isinstance(exc, Exception):
                raise

    def _get_pod(self, namespace: str, name: str) -> RawObject | None:
        s = self.settings
        try:
            resp = self._core.read_namespaced_pod(
                name,
                namespace,
                _preload_content=False,
                _request_timeout=(s.connect_timeout, s.pod_read_timeout),
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        try:
            body = resp.data
        finally:
            resp.release_conn()
        obj = json.loads(body)
        if not isinstance(obj, dict):
            raise ValueError("pod response is not a JSON object")
        return obj


__all__ = ["KubeSettings", "KubeSource"]

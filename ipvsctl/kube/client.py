"""KubeSource: the API-server implementation of `ObjectSource`.

Threads (all daemon threads, started by `run` and stopped when `stop` is set):
- `ipvsctl-kube-services`, `ipvsctl-kube-endpointslices`: one reflector each (`kube.watch`):
  list (watch cache) -> Replace -> watch -> Upsert/Delete, resuming broken watches and
  relisting on 410; a shared `/readyz` probe (`kube.probe`) shortens pauses after outages;
- `ipvsctl-kube-nodes` (with a node name): this node's own Node, one object (`kube.node`).

Only the calls in `kube.permissions.REQUIRED_PERMISSIONS` are made: list+watch Services and
EndpointSlices in all namespaces, this node's Node; plus `GET /readyz` (`PUBLIC_PATHS`),
which every client may read. No Pod is ever read: what a drain needs of a pod comes from
its endpoint (CONTRACT.md "Draining").
"""

from __future__ import annotations

import functools
import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes.client import ApiClient

from ipvsctl.kube.config import load_configuration, new_api_client
from ipvsctl.kube.listwatch import ENDPOINT_SLICES, NODES, SERVICES, ListWatch
from ipvsctl.kube.logs import log
from ipvsctl.kube.node import node_list_func
from ipvsctl.kube.probe import ReadyProbe
from ipvsctl.kube.settings import KubeSettings
from ipvsctl.kube.trim import trim_endpoint_slice, trim_node, trim_service
from ipvsctl.kube.watch import (
    InvalidObjectCallback,
    ListCheck,
    Reflector,
    WatchRestartCallback,
)
from ipvsctl.source.convert import SliceInfo
from ipvsctl.source.events import (
    EventSink,
    ObjectKind,
    PreparedReplace,
    RawObject,
    Replace,
    SourceEvent,
)
from ipvsctl.source.prepare import Prepared, Preparer

# The Service every real cluster has: a Service list without it is not the cluster's truth
# (an empty 200 from a broken proxy, a restored-empty etcd) and must not empty the table.
SENTINEL_SERVICE = ("default", "kubernetes")


def count_nodes(event: Replace | PreparedReplace) -> int:
    """Nodes that run endpoints: a lower bound of the cluster's size, for the herd spread.
    Of a prepared list, the nodes of the slices that parsed."""
    nodes: set[str] = set()
    match event:
        case PreparedReplace():
            for sl in event.objects:
                if isinstance(sl.value, SliceInfo):
                    nodes.update(ep.node_name for ep in sl.value.endpoints if ep.node_name)
        case Replace():
            for obj in event.objects:
                endpoints = obj.get("endpoints")
                for ep in endpoints if isinstance(endpoints, list) else ():
                    if isinstance(ep, dict) and isinstance(ep.get("nodeName"), str):
                        nodes.add(ep["nodeName"])
    return len(nodes)


def require_service(namespace: str, name: str) -> ListCheck:
    def check(event: Replace | PreparedReplace) -> str | None:
        match event:
            case PreparedReplace():
                if any(obj.key == (namespace, name) for obj in event.objects):
                    return None
            case Replace():
                for obj in event.objects:
                    meta = obj.get("metadata")  # trimmed, but as sent when not a mapping
                    if isinstance(meta, Mapping) and (
                        meta.get("namespace"),
                        meta.get("name"),
                    ) == (namespace, name):
                        return None
        return f"no Service {namespace}/{name} among {len(event.objects)}"

    return check


class KubeSource:
    """Services, EndpointSlices and this node's Node from the API server (list+watch).

    `on_watch_restart(resource, reason)` is called on every watch restart, `resource` being
    "services" or "endpointslices" and `reason` one of closed (clean end, re-watch), expired
    (410, relist), timeout (read timeout, relist), error (relist); the daemon counts them in
    `ipvsctl_watch_restarts_total`. `sink` is called from several threads, one call at a
    time; emitted objects are trimmed (`kube.trim`) and must be treated as read-only.
    `clock` stamps `received`; `rng` drives the jitter. With `prepare` (the store's
    `Preparer`), every listed object is parsed as it is decoded and a Replace carries
    `Prepared` objects: the raw tree of one object lives only while it is parsed, so a list
    of 100,000 endpoints never exists raw beside the store built from it. Watch events'
    objects are prepared too (`Preparer.event`): a backlog of updates waits parsed. A Service
    list without `sentinel` (default `default/kubernetes`; None: no check) is refused: the
    table is kept, one warning is logged, the restart is counted with reason `suspect`, and
    the list is retried with backoff.

    An object that cannot be read (in a list or a watch event) is skipped and
    `on_invalid_object(kind)` called (ipvsctl_invalid_objects_total). `on_health(why)` is
    told why the lists or watches of one or more resources keep failing
    (`KubeSettings.degraded_after`), and None once they all work again: the daemon's `source`
    degraded condition.
    """

    def __init__(
        self,
        api_client: ApiClient,
        *,
        settings: KubeSettings | None = None,
        on_watch_restart: WatchRestartCallback | None = None,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        service_label_selector: str | None = None,
        node_name: str | None = None,
        sentinel: tuple[str, str] | None = SENTINEL_SERVICE,
        prepare: Preparer | None = None,
        on_invalid_object: InvalidObjectCallback | None = None,
        on_health: Callable[[str | None], None] | None = None,
    ) -> None:
        self._api = api_client
        self._on_invalid_object = on_invalid_object
        self._on_health = on_health
        self._failing: dict[str, str] = {}  # resource -> why it keeps failing
        self._health_lock = threading.Lock()
        self._prepare = prepare
        self._sentinel = sentinel
        # --service-proxy-name: only Services this proxy serves are listed and watched
        self._service_selector = service_label_selector
        # With a node name, this node's Node is watched too and a Replace of it is part of
        # the first events (`emits_node`, for EngineConfig.wait_for_node).
        self.node_name = node_name
        self.emits_node = bool(node_name)
        self.settings = settings or KubeSettings()
        self._on_watch_restart = on_watch_restart
        self._clock = clock
        self._rng = rng or random.Random()
        # Not the generated CoreV1Api/DiscoveryV1Api: ~20 MB of imports (kube.listwatch)
        self._services = ListWatch(api_client, SERVICES)
        self._endpoint_slices = ListWatch(api_client, ENDPOINT_SLICES)
        self._nodes = ListWatch(api_client, NODES)
        s = self.settings
        self.probe = ReadyProbe(self._readyz, max_age=s.probe_interval / 2, clock=clock)
        self.cluster_nodes = 0  # distinct nodeNames in the last EndpointSlice list
        # Told (kind, watching) as each resource's watch opens and breaks (the reflectors'
        # `on_watching`): the engine holds pod_gone deletions while EndpointSlices are not
        # watched (reconcile/termination.py). Append before `run`.
        self.watch_listeners: list[Callable[[ObjectKind, bool], None]] = []
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
        service_label_selector: str | None = None,
        node_name: str | None = None,
        sentinel: tuple[str, str] | None = SENTINEL_SERVICE,
        prepare: Preparer | None = None,
        on_invalid_object: InvalidObjectCallback | None = None,
        on_health: Callable[[str | None], None] | None = None,
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
            service_label_selector=service_label_selector,
            node_name=node_name,
            sentinel=sentinel,
            prepare=prepare,
            on_invalid_object=on_invalid_object,
            on_health=on_health,
        )

    @property
    def api_client(self) -> ApiClient:
        """The configured client, shared with the Events writer (`kube.events`)."""
        return self._api

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
            if (
                isinstance(event, Replace | PreparedReplace)
                and event.kind is ObjectKind.ENDPOINT_SLICE
            ):
                self.cluster_nodes = count_nodes(event)
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
            "probe": self.probe,
            "cluster_nodes": lambda: self.cluster_nodes,
            "on_invalid": self._on_invalid_object,
            "on_health": self._resource_health,
        }
        list_services: Any = self._services
        if self._service_selector:
            # On the list and on every watch: a Service relabelled away from the selector
            # then arrives as DELETED (the store also drops one that does not match).
            list_services = functools.partial(list_services, label_selector=self._service_selector)
        self.reflectors = [
            Reflector(
                kind=ObjectKind.SERVICE,
                resource="services",
                list_func=list_services,
                trim=trim_service,
                prepare=self._prepared(ObjectKind.SERVICE),
                prepare_event=self._prepared_event(ObjectKind.SERVICE),
                check=require_service(*self._sentinel) if self._sentinel else None,
                on_watching=self._watching(ObjectKind.SERVICE),
                **common,
            ),
            Reflector(
                kind=ObjectKind.ENDPOINT_SLICE,
                resource="endpointslices",
                list_func=self._endpoint_slices,
                trim=trim_endpoint_slice,
                prepare=self._prepared(ObjectKind.ENDPOINT_SLICE),
                prepare_event=self._prepared_event(ObjectKind.ENDPOINT_SLICE),
                on_watching=self._watching(ObjectKind.ENDPOINT_SLICE),
                **common,
            ),
        ]
        if self.node_name:
            self.reflectors.append(
                Reflector(
                    kind=ObjectKind.NODE,
                    resource="nodes",
                    list_func=node_list_func(self._nodes, self.node_name, emit, clock=self._clock),
                    trim=trim_node,
                    prepare=self._prepared(ObjectKind.NODE),
                    prepare_event=self._prepared_event(ObjectKind.NODE),
                    **common,
                )
            )
        threads = [
            threading.Thread(
                target=self._run_reflector,
                args=(r, halt),
                name=f"ipvsctl-kube-{r.resource}",
                daemon=True,
            )
            for r in self.reflectors
        ]
        self._threads = threads
        for t in threads:
            t.start()
        log(logging.INFO, "API source started", host=self.host)
        try:
            stop.wait()
        finally:
            halt.set()
            for r in self.reflectors:
                r.interrupt()
            deadline = time.monotonic() + s.join_timeout
            for t in threads:
                t.join(max(0.0, deadline - time.monotonic()))
            stuck = [t.name for t in threads if t.is_alive()]
            if stuck:
                log(logging.WARNING, "API source threads still busy at stop", threads=stuck)
            self._api.rest_client.pool_manager.clear()
            log(logging.INFO, "API source stopped")

    def dead_threads(self) -> list[str]:
        """Names of this source's threads that ended while it runs (for /healthz)."""
        if self._halt.is_set():
            return []
        threads = getattr(self, "_threads", [])
        return [t.name for t in threads if not t.is_alive()]

    # ---- internals ----------------------------------------------------------------------

    def _resource_health(self, resource: str, why: str | None) -> None:
        """One reflector's failing streak began, went on or ended: `on_health` gets every
        failing resource's reason, or None when none is failing. Called from the reflector
        threads and their timers; serialised, so the last word is the current one."""
        with self._health_lock:
            if why is None:
                if self._failing.pop(resource, None) is None:
                    return
            else:
                self._failing[resource] = why
            if self._on_health is not None:
                summary = "; ".join(f"{r}: {w}" for r, w in sorted(self._failing.items()))
                self._on_health(summary or None)

    def _prepared(self, kind: ObjectKind) -> Callable[[RawObject], Prepared] | None:
        return None if self._prepare is None else functools.partial(self._prepare, kind)

    def _prepared_event(self, kind: ObjectKind) -> Callable[[RawObject], Prepared] | None:
        return None if self._prepare is None else functools.partial(self._prepare.event, kind)

    def _watching(self, kind: ObjectKind) -> Callable[[bool], None]:
        def tell(watching: bool) -> None:
            for listener in self.watch_listeners:
                listener(kind, watching)

        return tell

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

    def _readyz(self) -> int:
        s = self.settings
        method, url, headers, body, post = self._api.param_serialize(
            "GET", "/readyz", auth_settings=["BearerToken"]
        )
        resp = self._api.call_api(
            method, url, headers, body, post, _request_timeout=(s.connect_timeout, s.probe_timeout)
        )
        resp.read()  # a few bytes; reading them returns the connection to the pool
        return int(resp.status)


__all__ = ["KubeSettings", "KubeSource"]

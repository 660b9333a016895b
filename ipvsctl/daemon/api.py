"""The node daemon's own HTTP API on --listen: /metrics, /healthz, /readyz, /status (this
node's clients only), /v1/quiesced, and the inputs of kube-proxy's health answer on
--healthz-bind-address (healthcheck/proxy.py); features add their routes beside these
(daemon/feature.py). Read from the engine's view; the loop's lock is taken only where the
engine's state is walked.

The probes (`PROBES`) are answered by the HTTP server's selector thread, never behind other
requests: they read plain attributes and take no lock another thread holds for long.
/metrics is one rendering shared by the scrapes that come together (metrics_http.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ipvsctl.daemon.metrics_http import MetricsDocument
from ipvsctl.daemon.status_http import StatusDocument
from ipvsctl.daemon.status_json import quiesced_json
from ipvsctl.healthcheck.proxy import ProxyState
from ipvsctl.httpd import Handler, as_json, is_loopback_peer, text
from ipvsctl.model import normalize_ip
from ipvsctl.obs.metrics import Metrics
from ipvsctl.reconcile.view import EngineView


class DaemonAPI:
    def __init__(
        self,
        view: EngineView,
        lock: AbstractContextManager[Any],
        metrics: Metrics,
        *,
        heartbeat: Callable[[], float],
        threads: Callable[[], Sequence[threading.Thread]],
        source_dead_threads: Callable[[], list[str]],
        stale_after: float,
    ) -> None:
        self.view = view
        self.lock = lock
        self.metrics = metrics
        self.heartbeat = heartbeat  # monotonic: the loop's last turn
        self.threads = threads  # the daemon's threads: one that ended fails /healthz
        # A source's own threads (the API reflectors) die unseen behind its run() thread.
        self.source_dead_threads = source_dead_threads
        self.stale_after = stale_after  # /healthz fails when the loop has not turned since
        self.status_doc = StatusDocument(view, lock, on_render=self._rendered)
        self.metrics_doc = MetricsDocument(
            metrics.render, CONTENT_TYPE_LATEST, on_render=self._metrics_rendered
        )

    def _rendered(self, seconds: float) -> None:
        self.metrics.status_renders.inc()
        self.metrics.status_render_seconds.set(seconds)

    def _metrics_rendered(self, seconds: float) -> None:
        self.metrics.metrics_renders.inc()
        self.metrics.metrics_render_seconds.set(seconds)

    # Answered inline by the server's selector thread (see the module docstring); /metrics
    # only registers the scrape there and parks it.
    PROBES = frozenset({"/healthz", "/readyz"})
    INLINE = PROBES | {"/metrics"}

    def routes(self) -> dict[str, Handler]:
        return {
            "/metrics": self.metrics_doc.handler,
            "/healthz": self.healthz,
            "/readyz": self.readyz,
            "/status": self.status_doc.handler,
            "/v1/quiesced": self.quiesced,
        }

    # /status names Services, pods and their addresses.
    LOCAL_ONLY = frozenset({"/status"})

    def is_local_peer(self, peer: str) -> bool:
        """A client on this node: loopback or one of the node's addresses (/status names
        Services, pods and their addresses: not for every pod on the network)."""
        return is_loopback_peer(peer) or peer in self.view.node_ips_known

    def healthz(self, q: dict[str, list[str]]) -> tuple[int, str, bytes]:
        age = time.monotonic() - self.heartbeat()
        dead = [t.name for t in self.threads() if not t.is_alive()]
        dead += self.source_dead_threads()
        if dead or age > self.stale_after:
            return text(503, f"unhealthy: stopped={dead} loop_idle={age:.1f}s\n")
        return text(200, "ok\n")

    def readyz(self, q: dict[str, list[str]]) -> tuple[int, str, bytes]:
        """Ready once the first full list is in the kernel. A degraded condition (a part
        that keeps failing, obs/degraded.py) is named in the body but fails nothing: the
        table it serves is still right."""
        degraded = "".join(
            f"degraded: {name}: {error}\n" for name, error in self.metrics.degraded.active().items()
        )
        if self.view.started and all(t.is_alive() for t in self.threads()):
            return text(200, "ready\n" + degraded)
        return text(503, "waiting for the first full list to reach the kernel\n" + degraded)

    def quiesced(self, q: dict[str, list[str]]) -> tuple[int, str, bytes]:
        try:
            ip = normalize_ip((q.get("ip") or [""])[0])
        except ValueError:
            return as_json(400, {"error": "query parameter ip must be an IP address"})
        with self.lock:
            return as_json(200, quiesced_json(self.view, ip))

    def proxy_state(self, node_eligible: bool) -> ProxyState:
        """kube-proxy's health inputs, read without the loop's lock (plain attributes);
        `node_eligible`: this node is not leaving."""
        return ProxyState(
            now=time.time(),
            monotonic=time.monotonic(),
            heartbeat=self.heartbeat(),
            pending_since=self.view.pending_since,
            last_updated=self.view.last_updated,
            node_eligible=node_eligible,
            timeout=self.stale_after,
        )

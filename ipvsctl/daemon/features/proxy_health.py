"""kube-proxy's health server on --healthz-bind-address (healthcheck/proxy_server.py): for
cloud load balancers, /healthz answers 503 when updates are stale or this node is leaving
(its Node deleted, being deleted, tainted with a --draining-taints key, network
unavailable), and /livez. Opened on its own thread, retried while the port is taken."""

from __future__ import annotations

from ipvsctl.daemon.feature import Feature, Parts
from ipvsctl.healthcheck.proxy_server import ProxyHealthServer
from ipvsctl.source.node import leaving_reasons


def feature(p: Parts) -> Feature | None:
    address = p.options.http.healthz_bind_address
    if not address:
        return None
    taints = frozenset(p.options.node_drain.draining_taints)
    server = ProxyHealthServer(
        address,
        # a Node never seen (not readable) counts eligible; read without the loop's lock
        lambda: p.api.proxy_state(node_eligible=not leaving_reasons(p.view.node_object, taints)),
        p.metrics,
        trusted=p.api.is_local_peer,
    )
    return Feature(
        "proxy-health",
        part=server,
        threads=(("proxy-health", server.run),),
        stop=server.close,
    )

"""healthCheckNodePorts (healthcheck/server.py): kube-proxy's health answer for
`externalTrafficPolicy: Local` load balancers, a port per such Service on every node
address, opened and closed as it hears the Services; 503 while the daemon's own /healthz
fails. The node's own peers are never refused on them."""

from __future__ import annotations

from ipvsctl.daemon.feature import Feature, Parts
from ipvsctl.healthcheck.server import HealthServer
from ipvsctl.reconcile.feed import Subscriptions


def feature(p: Parts) -> Feature | None:
    if p.health_ports is None:
        return None
    health = HealthServer(
        p.options.node.node_name,
        metrics=p.metrics,
        listen=p.health_ports,
        proxy_healthy=lambda: p.api.healthz({})[0] == 200,
        trusted=p.api.is_local_peer,
    )
    return Feature(
        "health-check-ports",
        part=health,
        hears=Subscriptions(service=health.on_service),
        threads=(("health", health.run),),
        stop=health.close,
    )

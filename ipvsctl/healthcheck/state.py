"""kube-proxy's healthCheckNodePort answer, as pure state: which ports to serve, for which
Service, and what each answers.

For a `type: LoadBalancer` Service with `externalTrafficPolicy: Local`, the API server
allocates `spec.healthCheckNodePort`; cloud load balancers probe it on every node and send
traffic only to nodes that answer 200, that is nodes with a local ready endpoint
(kube-proxy `pkg/proxy/healthcheck/service_health.go`). The answer, on any path:

    200 (local endpoints and a healthy proxy) or 503, Content-Type application/json,
    {"service": {"namespace": NS, "name": NAME}, "localEndpoints": N,
     "serviceProxyHealthy": true|false}

`localEndpoints` counts this node's ready endpoints of the Service: distinct pods (an
endpoint without a pod reference counts by address), so a dual-stack pod counts once.
Serving-but-terminating endpoints do not count (kube-proxy counts ready ones): a node
whose pods are all terminating answers 503, and the load balancer moves away from it while
they drain.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from ipvsctl.model import DesiredService, ServiceRef


def local_ready_endpoints(desired: DesiredService, node_name: str) -> int:
    seen: set[object] = set()
    for address, meta in desired.endpoints.items():
        if meta.ready and meta.node_name == node_name:
            seen.add(meta.pod if meta.pod is not None else address)
    return len(seen)


@dataclass(frozen=True, slots=True)
class HealthCheck:
    ref: ServiceRef
    port: int
    local_endpoints: int


@dataclass(frozen=True, slots=True)
class PortChanges:
    open: tuple[int, ...] = ()
    close: tuple[int, ...] = ()


@dataclass
class HealthState:
    """Which Service each health-check port answers for. `update` is a service listener's
    body: O(the Service)."""

    node_name: str
    by_ref: dict[ServiceRef, HealthCheck] = field(default_factory=dict)
    by_port: dict[int, ServiceRef] = field(default_factory=dict)
    waiting: dict[ServiceRef, HealthCheck] = field(default_factory=dict)  # port held by another

    def update(self, ref: ServiceRef, new: DesiredService | None) -> PortChanges:
        """Take in a Service's new desired state (None: deleted); the ports to open and to
        close. Two Services with one port (the API server never allocates that): the first
        keeps it, the other takes it over when the first lets it go."""
        want = None
        if new is not None and new.health_check_node_port is not None:
            want = HealthCheck(
                ref, new.health_check_node_port, local_ready_endpoints(new, self.node_name)
            )
        before = set(self.by_port)
        self.waiting.pop(ref, None)
        old = self.by_ref.get(ref)
        if old is not None and want is not None and old.port == want.port:
            self.by_ref[ref] = want  # the count changed, the port did not
            return PortChanges()
        if old is not None:
            del self.by_ref[ref]
            del self.by_port[old.port]
            for other, hc in sorted(self.waiting.items()):
                if hc.port == old.port:
                    del self.waiting[other]
                    self._hold(hc)
                    break
        if want is not None:
            if want.port in self.by_port:
                self.waiting[ref] = want
            else:
                self._hold(want)
        after = set(self.by_port)
        return PortChanges(tuple(sorted(after - before)), tuple(sorted(before - after)))

    def _hold(self, hc: HealthCheck) -> None:
        self.by_port[hc.port] = hc.ref
        self.by_ref[hc.ref] = hc

    def answer(self, port: int, proxy_healthy: bool = True) -> tuple[int, bytes] | None:
        """(HTTP status, JSON body) for a request on `port`; None if no Service has it."""
        ref = self.by_port.get(port)
        hc = self.by_ref.get(ref) if ref is not None else None
        if hc is None:
            return None
        return answer(hc, proxy_healthy)


def answer(hc: HealthCheck, proxy_healthy: bool = True) -> tuple[int, bytes]:
    doc = {
        "service": {"namespace": hc.ref.namespace, "name": hc.ref.name},
        "localEndpoints": hc.local_endpoints,
        "serviceProxyHealthy": proxy_healthy,
    }
    code = 200 if hc.local_endpoints > 0 and proxy_healthy else 503
    # kube-proxy's layout: tab-indented, no trailing newline
    return code, json.dumps(doc, indent="\t").encode()

"""healthCheckNodePort state: local endpoint counts, ports per Service, kube-proxy's answer."""

from __future__ import annotations

import json

from devkit.builders import endpoint, endpoint_slice, service
from ipvsctl.healthcheck.state import (
    HealthCheck,
    HealthState,
    PortChanges,
    answer,
    local_ready_endpoints,
)
from ipvsctl.model import NodeContext, ServiceRef
from ipvsctl.plan.desired import build_desired_service
from ipvsctl.source.convert import parse_endpoint_slice, parse_service

NODE = NodeContext("node-a", ("192.0.2.10",), "rr")
REF = ServiceRef("default", "lb")


def lb(name: str = "lb", hc: int | None = 32000, local: bool = True, type: str = "LoadBalancer"):
    spec = {"type": type, "ports": [{"name": "http", "port": 80, "nodePort": 30080}]}
    if local:
        spec["externalTrafficPolicy"] = "Local"
    if hc is not None:
        spec["healthCheckNodePort"] = hc
    return service(name, **spec)


def desired(svc, *eps, address_type="IPv4", more=()):
    slices = [endpoint_slice(svc["metadata"]["name"], list(eps), address_type=address_type), *more]
    return build_desired_service(
        parse_service(svc).value, [parse_endpoint_slice(s).value for s in slices], NODE
    )


def test_local_ready_endpoints_counts_this_nodes_ready_pods_once():
    d = desired(
        lb(),
        endpoint("10.244.1.5", pod="a"),
        endpoint("10.244.1.6", pod="b"),
        endpoint("10.244.1.7", pod="c", ready=False),
        endpoint("10.244.1.8", pod="d", node="node-b"),
        endpoint("10.244.1.9", pod=None),
        endpoint("10.244.1.10", pod="e", ready=False, serving=True, terminating=True),
        more=[
            endpoint_slice("lb", [endpoint("fd00::5", pod="a")], name="lb-v6", address_type="IPv6")
        ],
    )
    # a (v4 and v6: one pod), b, and the pod-less 10.244.1.9; not the not-ready, terminating
    # or remote ones
    assert local_ready_endpoints(d, "node-a") == 3
    assert local_ready_endpoints(d, "node-b") == 1


def test_ports_open_follow_close_and_move():
    st = HealthState("node-a")
    assert st.update(REF, desired(lb(), endpoint("10.244.1.5"))) == PortChanges(open=(32000,))
    assert st.by_ref[REF] == HealthCheck(REF, 32000, 1)
    # endpoints change: the count, not the port
    assert st.update(REF, desired(lb())) == PortChanges()
    assert st.answer(32000)[0] == 503
    assert st.update(REF, desired(lb(hc=32001), endpoint("10.244.1.5"))) == PortChanges(
        open=(32001,), close=(32000,)
    )
    assert st.answer(32000) is None and st.answer(32001)[0] == 200
    # Cluster policy: kube-proxy serves no health check for it
    assert st.update(REF, desired(lb(local=False))) == PortChanges(close=(32001,))
    assert st.update(REF, desired(lb(hc=32002, type="NodePort"))) == PortChanges()
    assert st.update(REF, desired(lb())) == PortChanges(open=(32000,))
    assert st.update(REF, None) == PortChanges(close=(32000,))
    assert st.by_ref == {} and st.by_port == {}


def test_two_services_one_port_the_first_keeps_it_the_second_takes_over():
    st = HealthState("node-a")
    other = ServiceRef("default", "other")
    assert st.update(REF, desired(lb())) == PortChanges(open=(32000,))
    assert st.update(other, desired(lb("other"), endpoint("10.244.1.5"))) == PortChanges()
    assert st.answer(32000)[1].count(b'"lb"') == 1
    # the first goes: the port stays open and answers for the second
    assert st.update(REF, None) == PortChanges()
    code, body = st.answer(32000)
    assert code == 200 and json.loads(body)["service"]["name"] == "other"


def test_answer_is_kube_proxys_json():
    code, body = answer(HealthCheck(REF, 32000, 2))
    assert code == 200
    assert body == (
        b'{\n\t"service": {\n\t\t"namespace": "default",\n\t\t"name": "lb"\n\t},'
        b'\n\t"localEndpoints": 2,\n\t"serviceProxyHealthy": true\n}'
    )
    assert answer(HealthCheck(REF, 32000, 0))[0] == 503
    code, body = answer(HealthCheck(REF, 32000, 2), proxy_healthy=False)
    assert code == 503 and json.loads(body)["serviceProxyHealthy"] is False

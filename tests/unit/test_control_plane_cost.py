"""Per-daemon requests to the API server, counted by the fake API server (issue 17.1): a
change that adds a request per event, per pod or per restart fails here. The model in
bench/control_plane.py (docs/benchmarks.md, "Control-plane cost") multiplies these out."""

from __future__ import annotations

import pytest

from bench import control_plane


@pytest.fixture(scope="module")
def measured() -> dict:
    return control_plane.measure(services=30, endpoints_per_service=10, rollout=12,
                                 steady_updates=15)


def test_startup_is_one_list_and_one_watch_per_resource(measured) -> None:
    assert measured["startup"]["requests"] == {
        "list services": 1, "list endpointslices": 1,
        "watch services": 1, "watch endpointslices": 1,
    }


def test_steady_state_events_cost_no_request(measured) -> None:
    assert measured["steady"]["requests"] == {}
    assert measured["steady"]["bytes"]["watch EndpointSlice"] > 0


def test_rollout_costs_at_most_one_pod_get_per_terminating_pod(measured) -> None:
    assert measured["rollout"]["requests"] == {"get pods": 12}


def test_recovery_after_a_long_outage_is_one_relist_per_resource(measured) -> None:
    req = measured["outage_recovery"]["requests"]
    assert req.get("list services") == 1 and req.get("list endpointslices") == 1
    # The resumed watch that got 410, then the watch after the relist.
    assert req.get("watch services") == 2 and req.get("watch endpointslices") == 2
    assert set(req) <= {"list services", "list endpointslices", "watch services",
                        "watch endpointslices", "get /readyz"}


def test_model_orders_of_magnitude(measured) -> None:
    rows = control_plane.model(measured, 5000)
    rollout = rows["1,000-pod rollout"]
    assert rollout["pod_gets_cluster"] == 5000 * 1000
    # Within kube-router's pod informer: 8 pod watch events per rolled pod per node.
    assert rollout["pod_gets_cluster"] <= 5000 * 1000 * control_plane.POD_EVENTS_PER_ROLLED_POD
    assert rollout["cluster_bytes"] < rollout["kube_router_cluster_bytes"]
    outage = control_plane.outage_requests()
    assert outage["watch_attempts_per_resource"] < 40  # backoff to 30 s, not a spin

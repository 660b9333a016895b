"""Per-daemon requests to the API server, counted by the fake API server: a
change that adds a request per event, per pod or per restart fails here; no scenario reads
a Pod. The model in
bench/control_plane.py (docs/benchmarks.md, "Control-plane cost") multiplies these out."""

from __future__ import annotations

import pytest

from bench import control_plane


@pytest.fixture(scope="module")
def measured() -> dict:
    return control_plane.measure(
        services=30, endpoints_per_service=10, rollout=12, steady_updates=15
    )


def test_startup_is_one_list_and_one_watch_per_resource(measured) -> None:
    assert measured["startup"]["requests"] == {
        "list services": 1,
        "list endpointslices": 1,
        "watch services": 1,
        "watch endpointslices": 1,
    }


def test_steady_state_events_cost_no_request(measured) -> None:
    assert measured["steady"]["requests"] == {}
    assert measured["steady"]["bytes"]["watch EndpointSlice"] > 0


def test_rollout_costs_no_request(measured) -> None:
    # One pod GET per terminating pod on every node was 1 M GETs per 1,000-pod
    # rollout at 1,000 nodes; the drains are bounded by the slices alone.
    assert measured["rollout"]["requests"] == {}
    assert measured["rollout"]["bytes"]["watch EndpointSlice"] > 0


def test_a_rollout_that_cuts_writes_one_event_per_pod_up_to_the_rate_limit(measured) -> None:
    # A rollout with no cuts wrote nothing (above); one that cuts every pod's
    # connections writes a ConnectionsCut Event per pod, never more than the node's burst,
    # and reads nothing.
    cut = measured["cut_rollout"]
    assert cut["connections_cut"] == 2 * cut["pods"]
    created = cut["requests"].get("create events", 0)
    assert created == min(cut["pods"], control_plane.RATE_BURST)
    assert cut["rate_limited"] == cut["pods"] - created
    assert set(cut["requests"]) <= {"create events"}


def test_no_scenario_reads_a_pod(measured) -> None:
    for phase in ("startup", "steady", "rollout", "cut_rollout", "outage_recovery"):
        assert not [k for k in measured[phase]["requests"] if "pod" in k], phase


def test_recovery_after_a_long_outage_is_one_relist_per_resource(measured) -> None:
    req = measured["outage_recovery"]["requests"]
    assert req.get("list services") == 1 and req.get("list endpointslices") == 1
    # The resumed watch that got 410, then the watch after the relist.
    assert req.get("watch services") == 2 and req.get("watch endpointslices") == 2
    assert set(req) <= {
        "list services",
        "list endpointslices",
        "watch services",
        "watch endpointslices",
        "get /readyz",
    }


def test_model_orders_of_magnitude(measured) -> None:
    rows = control_plane.model(measured, 5000)
    rollout = rows["1,000-pod rollout"]
    for nodes in (1000, 5000):
        for name, row in control_plane.model(measured, nodes).items():
            assert row["pod_gets_cluster"] == 0, name
    assert rollout["cluster_requests"] == 0
    cut = rows["1,000-pod rollout, every pod cut on every node (Events)"]
    assert cut["daemon_requests"] == control_plane.RATE_BURST + 4 * 10  # the rate limit
    # What kube-proxy moves (slice events only), far below kube-router's pod informer.
    assert rollout["cluster_bytes"] == rollout["kube_proxy_cluster_bytes"]
    assert rollout["cluster_bytes"] < rollout["kube_router_cluster_bytes"]
    outage = control_plane.outage_requests()
    assert outage["watch_attempts_per_resource"] < 40  # backoff to 30 s, not a spin

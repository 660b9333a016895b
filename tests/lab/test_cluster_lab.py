"""A three-node cluster on the real kernel, under load (clusterlab): the part of `make
cluster-lab` that `make test` runs.

Three nodes (network namespaces), each with its own `ipvsctl run` process following one fake
API server, a load balancer health-checking their `:10256/healthz`, clients on every node and
outside (short requests, long-lived streams). With ipvsctl as shipped, a rolling update and a
pod deleted while one node's daemon is held back (SIGSTOP) lose nothing: no failed request,
no reset, no cut stream; and the held-back node holds the pod's preStop until it catches up.
With draining off (the Services' `ipvsctl.io/drain-timeout: "0"`, no preStop), the same
counters see what is lost, proving they can count.

The other scenarios (upgrade, node drain, Service deletion, topology, scale to zero, UDP)
run in `make cluster-lab` only: the whole set takes too long for CI's budget under
emulation (docs/benchmarks.md, "Rollout under load"). Every result is written to
$IPVSCTL_LAB_OUT/cluster-lab-ci.json.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from clusterlab.cluster import Lab
from clusterlab.scenarios import run_scenario

pytestmark = pytest.mark.lab

RESULTS: list[dict[str, Any]] = []


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    out = Path(os.environ.get("IPVSCTL_LAB_OUT") or tmp_path_factory.mktemp("cluster"))
    the_lab = Lab(out / "cluster-lab-ci")
    try:
        the_lab.start("ipvsctl")
        yield the_lab
    finally:
        the_lab.close()
        (out / "cluster-lab-ci.json").write_text(json.dumps(RESULTS, indent=1, default=str))


def scenario(lab: Lab, name: str, mode: str) -> dict[str, Any]:
    result = run_scenario(lab, name, mode)
    RESULTS.append(result)
    s = result["summary"]
    print(
        f"{name}, {mode}: {s['requests']} requests, {s['streams']} streams: failed "
        f"{s['failed']}, resets {s['resets']}, cut {s['cut_streams']}, connect p99 "
        f"{s['connect_p99_ms']} ms; failures {s['failures'][:10]}"
    )
    assert result["error"] is None, result["error"]
    # the load ran from every client (not a count: a quiet machine runs a rollout in half
    # the time of a busy one)
    clients = {"node-1", "node-2", "node-3", "outside"}
    short = [r for r in result["records"]["short"] if r[3]]
    streams = [r for r in result["records"]["streams"] if r[3] == "complete"]
    assert {r[0] for r in short} == clients and {r[0] for r in streams} == clients, "load ran"
    return result


def assert_nothing_lost(result: dict[str, Any]) -> None:
    s = result["summary"]
    assert (s["failed"], s["resets"], s["cut_streams"]) == (0, 0, 0), s["failures"]


def test_a_rolling_update_under_load_loses_nothing(cluster: Lab) -> None:
    result = scenario(cluster, "rollout", "ipvsctl")
    assert_nothing_lost(result)
    old = [p for p in result["pods"] if p["deleting"] is not None]
    assert len(old) == 3
    for pod in old:  # each waited for every node, and only for that
        assert pod["prestop_answer"]["outcome"] == "drained", pod
        assert pod["prestop_answer"]["daemons"]["quiesced"] == 3
        assert pod["killed_connections"] == 0


def test_a_held_back_node_holds_the_pods_prestop_until_it_catches_up(cluster: Lab) -> None:
    result = scenario(cluster, "slow-node", "ipvsctl")
    assert_nothing_lost(result)
    notes = result["notes"]
    (victim,) = [p for p in result["pods"] if p["name"] == notes["victim"]["pod"]]
    slow_url = f"http://{cluster.net.node(notes['slow_node']).ip}:9796"
    # while its daemon was stopped, the barrier waited for it, and for it alone (once the
    # first round of questions was answered)
    waiting = [
        b
        for b in notes["barrier"]
        if b["t"] < notes["daemon_continued"] and "no answer yet" not in b["not_quiesced"].values()
    ]
    assert waiting and all(set(b["not_quiesced"]) == {slow_url} for b in waiting), notes
    assert notes["preStop_returned_before_continue"] is False
    # it returned once that node had caught up (its daemon drained the pod), not before
    caught_up = [
        r["t"]
        for r in result["daemon_log"][notes["slow_node"]]
        if r.get("msg") == "drain started" and str(r.get("rs", "")).startswith(victim["ip"] + ":")
    ]
    assert caught_up and min(caught_up) > notes["daemon_continued"]
    assert victim["prestop_end"] >= min(caught_up)
    assert victim["prestop_answer"]["outcome"] == "drained"
    assert victim["sigterm"] >= victim["prestop_end"]


def test_with_draining_off_the_same_moves_lose_requests_and_streams(cluster: Lab) -> None:
    """The contrast is a measurement (docs/benchmarks.md), but it proves the counters can
    count: without the barrier, the held-back node sends new connections to a pod that got
    SIGTERM at once. The Services' drain-timeout annotation turns draining off without
    restarting the daemons (three starts would cost minutes of CI under emulation); make
    cluster-lab restarts them with the flags as well."""
    cluster.set_mode("nodrain", restart=False)
    result = scenario(cluster, "slow-node", "nodrain")
    s = result["summary"]
    assert s["failed"] > 0, s
    assert {f["kind"] for f in s["failures"] if f["what"] == "request"} <= {
        "refused",
        "reset",
        "timeout",
        "closed",
    }

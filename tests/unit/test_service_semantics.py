"""Issue 15: the Service semantics kube-proxy and kube-router users rely on (CONTRACT.md
"What becomes a virtual server", "Durations"), table-style as kube-proxy's tests, through
the real conversion and planner (`plan --json`) and the engine on the in-memory kernel."""

from __future__ import annotations

import datetime

import pytest

from ipvsctl.model import DeadlineSource, NodeContext
from ipvsctl.plan.cluster import plan_objects
from ipvsctl.shell.render import plan_json
from ipvsctl.source.events import ObjectKind
from tests.builders import endpoint, endpoint_slice, pod, service, terminating
from tests.harness import Harness, rs, vs

NODE = NodeContext("node-a", ("192.0.2.10",), "rr")
A, B = "10.244.1.5", "10.244.1.6"


def plan(services, slices=(), node=NODE):
    result, problems = plan_objects(
        {ObjectKind.SERVICE: list(services), ObjectKind.ENDPOINT_SLICE: list(slices)}, node)
    got = {}
    for v in plan_json(result)["virtual_servers"]:
        got[f"{v['protocol']} {v['address']}:{v['port']}"] = sorted(
            f"{r['address']}:{r['port']}" for r in v["real_servers"])
    return got, problems


def labelled(svc, **labels):
    svc["metadata"]["labels"] = dict(labels)
    return svc


# --- ipvsctl.io/drain-timeout: durations ----------------------------------------------

@pytest.mark.parametrize(("value", "deadline", "source", "warned"), [
    ("5", 5, DeadlineSource.ANNOTATION, False),
    ("2.5", 2.5, DeadlineSource.ANNOTATION, False),
    ("5m", 300, DeadlineSource.ANNOTATION, False),
    ("1m30s", 90, DeadlineSource.ANNOTATION, False),
    ("1h", 3600, DeadlineSource.ANNOTATION, False),
    ("500ms", 0.5, DeadlineSource.ANNOTATION, False),
    # Invalid: one warning, counted, and the next rule: the pod's deadline (45 s away).
    ("5 minutes", 45, DeadlineSource.POD, True),
    ("-5s", 45, DeadlineSource.POD, True),
    ("nan", 45, DeadlineSource.POD, True),
    ("1d", 45, DeadlineSource.POD, True),
    ("99999999h", 45, DeadlineSource.POD, True),
])
def test_drain_timeout_annotation(value, deadline, source, warned):
    svc = service("web", annotations={"ipvsctl.io/drain-timeout": value})
    h = Harness(drain_timeout=300)
    now = h.clock.wall()
    stamp = datetime.datetime.fromtimestamp(now + 45, datetime.UTC).strftime(
        "%Y-%m-%dT%H:%M:%SZ")
    h.start([svc], [endpoint_slice("web", [endpoint(A, pod="pod-5"), endpoint(B)])],
            pods=[pod("pod-5", deletion_timestamp=stamp)])
    h.fake.set_connections(vs(), rs(A), active=1)
    h.upsert(endpoint_slice("web", [endpoint(B), terminating(A, pod="pod-5")]))
    e = h.engine.queue.get(vs(), rs(A))
    assert e.deadline_source is source
    assert e.deadline - e.since == pytest.approx(deadline, abs=1)
    invalid = h.metrics.value("ipvsctl_invalid_objects_total", {"kind": "Service"})
    assert invalid == (1 if warned else 0)


def test_invalid_drain_timeout_annotation_without_pod_falls_to_the_flag():
    svc = service("web", annotations={"ipvsctl.io/drain-timeout": "soon"})
    h = Harness(drain_timeout=30)
    h.start([svc], [endpoint_slice("web", [endpoint(A), endpoint(B)])])
    h.fake.set_connections(vs(), rs(A), active=1)
    h.upsert(endpoint_slice("web", [endpoint(B)]))
    e = h.engine.queue.get(vs(), rs(A))
    assert (e.deadline - e.since, e.deadline_source) == (30, DeadlineSource.DEFAULT)


def test_plan_warns_once_about_an_invalid_drain_timeout():
    _, problems = plan([service("web", annotations={"ipvsctl.io/drain-timeout": "5 min"})])
    assert len(problems) == 1 and not problems[0].fatal
    assert "ipvsctl.io/drain-timeout" in problems[0].reason

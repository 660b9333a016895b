"""CONTRACT.md "Events": which drains report a cut (the engine's hook, the cut counter) and
how Events aggregate and are rate-limited (plan/events.py, client-go's EventBroadcaster)."""

from __future__ import annotations

from devkit.builders import endpoint, endpoint_slice, service
from devkit.harness import Harness, rs, vs
from ipvsctl.model import ConnectionsCut, PodRef, ServiceRef
from ipvsctl.plan.events import (
    FINISH_AFTER,
    REFRESH_EVERY,
    EventSeries,
    Outcome,
    TokenBucket,
    connections_cut,
    event_name,
    in_own_namespace,
    merge_cuts,
    quiesce_outcome,
)
from ipvsctl.reconcile.feed import Subscriptions

SVC = service("web")
A, B = "10.244.1.5", "10.244.1.6"
POD = PodRef("default", "pod-5", "uid-5")


def started(drain_timeout: float = 30) -> tuple[Harness, list[ConnectionsCut]]:
    h = Harness(drain_timeout=drain_timeout)
    h.start(
        [SVC],
        [
            endpoint_slice(
                "web",
                [endpoint(A, pod="pod-5", uid="uid-5"), endpoint(B, pod="pod-6")],
                name="web-abc",
            )
        ],
    )
    cuts: list[ConnectionsCut] = []
    h.feed.subscribe(Subscriptions(cut=cuts.append))
    h.ops()
    return h, cuts


def cut_total(h: Harness) -> float:
    return h.metrics.value("ipvsctl_drain_connections_cut_total", {"protocol": "TCP"})


def test_a_deadline_with_established_connections_reports_one_cut():
    h, cuts = started()
    h.fake.set_connections(vs(), rs(A), active=3, inactive=2)
    h.upsert(endpoint_slice("web", [endpoint(B, pod="pod-6")], name="web-abc"))
    h.check(29.5)
    assert cuts == [] and cut_total(h) == 0
    h.check(0.5)
    assert h.deletions("deadline") == 1
    assert cuts == [
        ConnectionsCut(POD, ServiceRef("default", "web"), vs(), rs(A), 3, cuts[0].drained_for)
    ]
    assert 29.0 <= cuts[0].drained_for <= 31.0
    assert cut_total(h) == 3  # established only: TIME_WAIT and the like are not cut


def test_a_drained_drain_reports_nothing():
    h, cuts = started()
    h.fake.set_connections(vs(), rs(A), active=2)
    h.upsert(endpoint_slice("web", [endpoint(B, pod="pod-6")], name="web-abc"))
    h.check(1)
    h.fake.set_connections(vs(), rs(A), active=0, inactive=0)
    h.check(1)
    assert h.deletions("drained") == 1 and cuts == [] and cut_total(h) == 0


def test_a_deadline_with_only_closing_connections_cuts_nothing():
    h, cuts = started()
    h.fake.set_connections(vs(), rs(A), active=0, inactive=4)
    h.upsert(endpoint_slice("web", [endpoint(B, pod="pod-6")], name="web-abc"))
    h.check(31)
    assert h.deletions("deadline") == 1 and cuts == [] and cut_total(h) == 0


def test_a_cut_names_the_pod_its_slice_names_in_whatever_namespace_it_says():
    # The engine reports what the slice said; the Event's writer keeps to its namespace.
    h = Harness(drain_timeout=30)
    theirs = endpoint(A, pod="coredns-1", namespace="kube-system", uid="uid-dns")
    h.start([SVC], [endpoint_slice("web", [theirs, endpoint(B, pod="pod-6")], name="web-abc")])
    cuts: list[ConnectionsCut] = []
    h.feed.subscribe(Subscriptions(cut=cuts.append))
    h.fake.set_connections(vs(), rs(A), active=2)
    h.upsert(endpoint_slice("web", [endpoint(B, pod="pod-6")], name="web-abc"))
    h.check(31)
    (cut,) = cuts
    assert cut.pod == PodRef("kube-system", "coredns-1", "uid-dns")
    assert not in_own_namespace(cut)


def test_only_a_pod_of_the_slices_own_namespace_may_carry_the_event():
    web = ServiceRef("shop", "web")
    for pod, svc, expected in [
        (PodRef("shop", "web-1"), web, True),
        (PodRef("kube-system", "coredns-1"), web, False),
        (PodRef("default", "web-1"), web, False),
        (PodRef("shop", "web-1"), None, False),  # no Service known: no namespace to match
    ]:
        cut = ConnectionsCut(pod, svc, vs(), rs(A), 1, 30.0)
        assert in_own_namespace(cut) is expected, (pod, svc)


def spec(pod: PodRef = POD, n: int = 1):
    cut = ConnectionsCut(pod, ServiceRef("default", "web"), vs(), rs(A), n, 30.0)
    return connections_cut(cut, 1, "node-1")


def test_the_note_says_how_many_where_and_after_how_long():
    s = spec(n=3)
    assert s.reason == "ConnectionsCut" and s.type.value == "Warning" and s.regarding == POD
    assert "3 established connections cut through node node-1 after 30s" in s.note
    assert "default/web" in s.note


def test_cuts_of_one_pod_in_a_batch_are_one_event():
    other = PodRef("default", "pod-6", "uid-6")
    cuts = [
        ConnectionsCut(POD, None, vs(), rs(A), 2, 30.0),
        ConnectionsCut(other, None, vs(), rs(B), 1, 30.0),
        ConnectionsCut(POD, None, vs(port=8443), rs(A), 5, 31.0),
    ]
    merged = merge_cuts(cuts)
    assert [(c.pod, c.connections, c.drained_for, n) for c, n in merged] == [
        (POD, 7, 31.0, 2),
        (other, 1, 30.0, 1),
    ]
    assert "and 1 other" in connections_cut(*merged[0], "n").note


def test_series_as_client_go_second_patches_later_ones_count():
    series = EventSeries(TokenBucket(100, 1.0, 0.0))
    outcome, w = series.observe(spec(), 0.0)
    assert outcome is Outcome.CREATE and w is not None and w.create and w.count == 1
    outcome, w2 = series.observe(spec(n=9), 10.0)  # the note is not part of the key
    assert outcome is Outcome.SERIES and w2 is not None and not w2.create
    assert (w2.name, w2.count, w2.last) == (w.name, 2, 10.0)
    for t in (20.0, 30.0):
        assert series.observe(spec(), t) == (Outcome.AGGREGATED, None)
    assert series.due(30.0 + FINISH_AFTER - 1) == []
    (final,) = series.due(30.0 + FINISH_AFTER)
    assert (final.name, final.count, final.last, final.create) == (w.name, 4, 30.0, False)
    assert len(series) == 0
    outcome, w3 = series.observe(spec(), 1000.0)  # after the series ended: a new Event
    assert outcome is Outcome.CREATE and w3 is not None and w3.name != w.name


def test_a_long_series_is_refreshed():
    series = EventSeries(TokenBucket(100, 1.0, 0.0))
    series.observe(spec(), 0.0)
    series.observe(spec(), 1.0)
    t = 1.0
    while t < REFRESH_EVERY + 2:
        t += 60.0
        series.observe(spec(), t)
        writes = series.due(t)
        if writes:
            assert writes[0].count > 2 and t >= REFRESH_EVERY
            break
    else:
        raise AssertionError("never refreshed")


def test_rate_limit_per_node_drops_new_events_not_counts():
    series = EventSeries(TokenBucket(3, 1 / 20.0, 0.0))
    pods = [PodRef("default", f"p{i}", f"u{i}") for i in range(6)]
    outcomes = [series.observe(spec(p), 0.0)[0] for p in pods]
    assert outcomes == [Outcome.CREATE] * 3 + [Outcome.RATE_LIMITED] * 3
    assert series.observe(spec(pods[3]), 19.0)[0] is Outcome.RATE_LIMITED
    # refilled at 1 per 20 s: two more by t=40 (0.95 were left at t=19)
    assert series.observe(spec(pods[4]), 40.0)[0] is Outcome.CREATE
    assert series.observe(spec(pods[5]), 40.0)[0] is Outcome.CREATE
    # a second of a kind with no token left waits for the series' final write
    assert series.observe(spec(pods[0]), 40.0) == (Outcome.AGGREGATED, None)
    final = [w for w in series.due(40.0 + FINISH_AFTER) if w.spec.regarding == pods[0]]
    assert [w.count for w in final] == [2]


def test_a_failed_create_is_forgotten():
    series = EventSeries(TokenBucket(10, 1.0, 0.0))
    _, w = series.observe(spec(), 0.0)
    assert w is not None
    series.failed(w)
    assert series.observe(spec(), 1.0)[0] is Outcome.CREATE


def test_names_are_valid_whatever_the_pod_name():
    name = event_name("p" * 253, 1.5)
    assert len(name) <= 253 and name.endswith(f".{int(1.5e9):x}")


def test_quiesce_outcomes():
    ok = quiesce_outcome(POD, quiesced=True, nodes=3, seconds=4.25, established=0)
    assert (ok.reason, ok.type.value) == ("Quiesced", "Normal")
    assert "3 nodes quiesced in 4.2s" in ok.note or "3 nodes quiesced in 4.3s" in ok.note
    late = quiesce_outcome(
        POD, quiesced=False, nodes=3, seconds=60, still_sending=["n2", "n1"], established=4
    )
    assert (late.reason, late.type.value) == ("QuiesceTimeout", "Warning")
    assert "still sending: n1, n2" in late.note and "4 established connections" in late.note

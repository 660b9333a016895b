"""CONTRACT.md "Draining" on the in-memory kernel, plus kube-proxy's graceful-termination
cases and the kube-proxy / kube-router bugs of NOTES.md §2 as regressions."""

from __future__ import annotations

from devkit.builders import endpoint, endpoint_slice, service, terminating
from devkit.harness import Harness, rs, vs
from ipvsctl.kernel.fake import FakeKernel
from ipvsctl.model import (
    NO_DEADLINE,
    DeadlineSource,
    DrainEntry,
    DrainReason,
    PodRef,
    VirtualServer,
)
from ipvsctl.plan.diff import POD_GONE_GRACE
from ipvsctl.plan.drain import deadline_passed
from ipvsctl.reconcile.feed import Subscriptions
from ipvsctl.source.events import ObjectKind, Replace

SVC = service("web")
A, B, C = "10.244.1.5", "10.244.1.6", "10.244.1.7"


def slice_of(*eps, name="web-abc", **kw):
    return endpoint_slice("web", list(eps), name=name, **kw)


def started(*addresses, h=None, svc=SVC, **kw):
    h = h or Harness(**kw)
    h.start([svc], [slice_of(*(endpoint(a, pod=f"pod-{a[-1]}") for a in addresses))])
    h.ops()
    return h


def test_nothing_touches_the_kernel_before_both_lists():
    h = Harness()
    h.fake.add_virtual_server(VirtualServer(vs("10.96.0.99")), True)  # from an earlier run
    h.ops()
    h.upsert(SVC)
    h.engine.handle(Replace(ObjectKind.SERVICE, [SVC], 0.0))
    h.engine.sync()
    assert h.ops() == [] and not h.engine.ready
    h.engine.handle(Replace(ObjectKind.ENDPOINT_SLICE, [slice_of(endpoint(A))], 0.0))
    h.engine.sync()
    assert h.fake.dump() == (
        "10.96.0.10:80/TCP rr\n  -> 10.244.1.5:8080 weight 1 active 0 inactive 0\n"
    )


def test_removed_endpoint_goes_to_weight_0_then_is_deleted_when_idle():
    h = started(A, B)
    h.fake.set_connections(vs(), rs(A), active=2, inactive=1)
    h.upsert(slice_of(endpoint(B)))
    assert h.ops() == ["set-rs 10.96.0.10:80/TCP -> 10.244.1.5:8080 weight 0"]
    entry = h.engine.drains.queue.get(vs(), rs(A))
    assert entry.reason is DrainReason.REMOVED and entry.deadline_source is DeadlineSource.DEFAULT
    assert entry.pod == PodRef("default", "pod-5")  # known from before it was removed
    h.check(1)
    assert h.ops() == [] and h.fake.weight(vs(), rs(A)) == 0
    h.fake.set_connections(vs(), rs(A), active=0, inactive=0)
    h.check(1)
    assert h.ops() == ["del-rs 10.96.0.10:80/TCP -> 10.244.1.5:8080"]
    assert len(h.engine.drains.queue) == 0 and h.deletions("drained") == 1


def test_inactive_connections_also_hold_a_real_server():
    h = started(A, B)
    h.fake.set_connections(vs(), rs(A), active=0, inactive=3)  # TIME_WAIT etc.
    h.upsert(slice_of(endpoint(B)))
    h.check(1)
    assert h.fake.weight(vs(), rs(A)) == 0 and len(h.engine.drains.queue) == 1


def test_deadline_deletes_a_real_server_with_open_connections():
    h = started(A, B, drain_timeout=30)
    h.fake.set_connections(vs(), rs(A), active=1)
    h.upsert(slice_of(endpoint(B)))
    h.ops()
    h.check(29.5)
    assert h.ops() == []
    h.check(0.5)
    assert h.ops() == ["del-rs 10.96.0.10:80/TCP -> 10.244.1.5:8080"]
    assert h.deletions("deadline") == 1 and h.deletions("drained") == 0


def test_idle_real_server_is_deleted_at_the_first_check():
    h = started(A, B)
    h.upsert(slice_of(endpoint(B)))
    h.check(0)
    assert h.ops() == [
        "set-rs 10.96.0.10:80/TCP -> 10.244.1.5:8080 weight 0",
        "del-rs 10.96.0.10:80/TCP -> 10.244.1.5:8080",
    ]


def test_annotation_deadline_wins():
    svc = service("web", annotations={"ipvsctl.io/drain-timeout": "5"})
    h = started(A, B, svc=svc, drain_timeout=30)
    h.fake.set_connections(vs(), rs(A), active=1)
    h.upsert(slice_of(endpoint(B), terminating(A, pod="pod-5")))
    e = h.engine.drains.queue.get(vs(), rs(A))
    assert (e.deadline - e.since, e.deadline_source) == (5, DeadlineSource.ANNOTATION)
    h.check(5)
    assert h.deletions("deadline") == 1


def test_terminating_endpoint_still_listed_has_no_deadline_of_its_own():
    # CONTRACT.md "Draining" rule 2: its pod's lifetime bounds it, not --drain-timeout.
    h = started(A, B, drain_timeout=30)
    h.fake.set_connections(vs(), rs(A), active=1)
    h.upsert(slice_of(endpoint(B), terminating(A, pod="pod-5", uid="u5")))
    e = h.engine.drains.queue.get(vs(), rs(A))
    assert e.reason is DrainReason.TERMINATING and e.deadline_source is DeadlineSource.POD
    assert not e.has_deadline and e.pod == PodRef("default", "pod-5", "u5")
    h.check(10_000)
    assert h.fake.weight(vs(), rs(A)) == 0 and h.deletions("deadline") == 0
    h.fake.set_connections(vs(), rs(A), active=0)
    h.check(1)
    assert h.deletions("drained") == 1


def test_terminating_endpoint_gone_from_every_slice_is_pod_gone_after_a_grace():
    # Rule 3: the pod is gone; no connection to it can finish.
    h = started(A, B, drain_timeout=300)
    h.fake.set_connections(vs(), rs(A), active=2)
    h.upsert(slice_of(endpoint(B), terminating(A, pod="pod-5", uid="u5")))
    h.check(100)
    h.upsert(slice_of(endpoint(B)))
    e = h.engine.drains.queue.get(vs(), rs(A))
    assert e.deadline_source is DeadlineSource.POD_GONE and e.reason is DrainReason.TERMINATING
    assert e.deadline == h.clock.wall() + POD_GONE_GRACE
    h.check(POD_GONE_GRACE - 1)
    assert h.fake.weight(vs(), rs(A)) == 0
    h.check(1)
    assert h.fake.weight(vs(), rs(A)) is None
    assert h.deletions("pod_gone") == 1 and h.deletions("deadline") == 0


def test_endpoint_removed_without_terminating_keeps_the_flag_deadline():
    # Rule 4: never listed as terminating (force-deleted, or an old endpoint controller).
    h = started(A, B, drain_timeout=30)
    h.fake.set_connections(vs(), rs(A), active=1)
    h.upsert(slice_of(endpoint(B)))
    e = h.engine.drains.queue.get(vs(), rs(A))
    assert (e.reason, e.deadline_source, e.deadline - e.since) == (
        DrainReason.REMOVED,
        DeadlineSource.DEFAULT,
        30,
    )


def _repacked(h, first, second):
    """The endpoint of pod-5 moves from slice web-abc to web-def, in two events."""
    for event in (first, second):
        if event == "delete":
            h.upsert(slice_of(endpoint(B), name="web-abc"))
        else:
            h.upsert(slice_of(terminating(A, pod="pod-5", uid="u5"), name="web-def"))
        h.check(1)  # a drain check between the two events, a second apart


def test_slice_repack_delete_then_add_cuts_nothing():
    h = started(A, B, drain_timeout=300)
    h.fake.set_connections(vs(), rs(A), active=3)
    h.upsert(slice_of(endpoint(B), terminating(A, pod="pod-5", uid="u5")))
    _repacked(h, "delete", "add")
    e = h.engine.drains.queue.get(vs(), rs(A))
    assert e.deadline_source is DeadlineSource.POD and not e.has_deadline
    h.check(POD_GONE_GRACE * 10)
    assert h.fake.weight(vs(), rs(A)) == 0
    assert h.deletions("pod_gone") == 0 and h.deletions("deadline") == 0


def test_slice_repack_add_then_delete_cuts_nothing():
    h = started(A, B, drain_timeout=300)
    h.fake.set_connections(vs(), rs(A), active=3)
    h.upsert(slice_of(endpoint(B), terminating(A, pod="pod-5", uid="u5")))
    _repacked(h, "add", "delete")
    e = h.engine.drains.queue.get(vs(), rs(A))
    assert e.deadline_source is DeadlineSource.POD and not e.has_deadline
    h.check(POD_GONE_GRACE * 10)
    assert h.fake.weight(vs(), rs(A)) == 0
    assert h.deletions("pod_gone") == 0 and h.deletions("deadline") == 0


def test_a_pod_gone_deadline_also_waits_for_the_watch():
    def entry(source):
        return DrainEntry(vs(), rs(A), None, DrainReason.TERMINATING, 0.0, 10.0, source)

    inf = float("inf")
    for source, now, after, passed in [
        (DeadlineSource.POD_GONE, 9.9, -inf, False),  # before its deadline
        (DeadlineSource.POD_GONE, 10.0, -inf, True),  # the watch never broke
        (DeadlineSource.POD_GONE, 12.0, inf, False),  # the watch is broken
        (DeadlineSource.POD_GONE, 12.0, 14.0, False),  # back, its grace not yet run
        (DeadlineSource.POD_GONE, 14.0, 14.0, True),
        (DeadlineSource.DEFAULT, 10.0, inf, True),  # other deadlines: the clock alone
        (DeadlineSource.ANNOTATION, 10.0, inf, True),
        (DeadlineSource.VIRTUAL_SERVER, 10.0, inf, True),
    ]:
        assert deadline_passed(entry(source), now, after) is passed, (source, now, after)


def _first_half_then_watch_down(h):
    """pod-5's endpoint leaves web-abc (the first half of a re-pack, or its pod gone), then
    the EndpointSlice watch breaks before anything else comes."""
    h.fake.set_connections(vs(), rs(A), active=3)
    h.upsert(slice_of(endpoint(B), terminating(A, pod="pod-5", uid="u5")))
    h.upsert(slice_of(endpoint(B), name="web-abc"))
    assert h.engine.drains.queue.get(vs(), rs(A)).deadline_source is DeadlineSource.POD_GONE
    h.engine.slices_watched(False)


def test_a_repack_whose_second_half_comes_after_a_broken_watch_cuts_nothing():
    # The second half arrives 6 s late (the watch broken, re-opened): the grace counted
    # only while the watch was open, so the real server is still there to be found.
    h = started(A, B, drain_timeout=300)
    _first_half_then_watch_down(h)
    for _ in range(6):
        h.check(1)
    assert h.fake.weight(vs(), rs(A)) == 0 and h.deletions("pod_gone") == 0
    h.engine.slices_watched(True)
    h.upsert(slice_of(terminating(A, pod="pod-5", uid="u5"), name="web-def"))
    assert h.engine.drains.queue.get(vs(), rs(A)).deadline_source is DeadlineSource.POD
    h.check(POD_GONE_GRACE * 10)
    assert h.fake.weight(vs(), rs(A)) == 0
    assert h.deletions("pod_gone") == 0 and h.deletions("deadline") == 0


def test_pod_gone_grace_restarts_when_the_watch_is_open_again():
    # No second half after all: the pod is gone, its real server goes a grace after the
    # watch is back (whatever it missed was delivered at once), not before.
    h = started(A, B, drain_timeout=300)
    _first_half_then_watch_down(h)
    h.check(60)  # a minute-long outage
    assert h.fake.weight(vs(), rs(A)) == 0
    h.engine.slices_watched(True)
    h.check(POD_GONE_GRACE - 0.5)
    assert h.fake.weight(vs(), rs(A)) == 0 and h.deletions("pod_gone") == 0
    h.check(0.5)
    assert h.fake.weight(vs(), rs(A)) is None and h.deletions("pod_gone") == 1


def test_a_pod_gone_deletion_judged_before_the_watch_broke_is_not_applied_after():
    h = started(A, B, drain_timeout=300)
    h.fake.set_connections(vs(), rs(A), active=3)
    h.upsert(slice_of(endpoint(B), terminating(A, pod="pod-5", uid="u5")))
    h.upsert(slice_of(endpoint(B), name="web-abc"))
    h.clock.advance(POD_GONE_GRACE)
    check = h.engine.drain_check
    snapshot = check.snapshot()
    assert snapshot is not None
    verdict = check.read(snapshot)  # off the lock: the deletion judged due
    assert [op.reason.value for _, ops in verdict.ops for _, op in ops] == ["pod_gone"]
    h.engine.slices_watched(False)  # meanwhile the watch broke
    check.apply(verdict)
    assert h.fake.weight(vs(), rs(A)) == 0 and h.deletions("pod_gone") == 0


def test_other_deadlines_do_not_wait_for_the_watch():
    h = started(A, B, drain_timeout=30)
    h.fake.set_connections(vs(), rs(A), active=1)
    h.upsert(slice_of(endpoint(B)))  # removed, never terminating: --drain-timeout
    h.engine.slices_watched(False)
    h.check(30)
    assert h.deletions("deadline") == 1


def test_statefulset_pod_of_the_same_name_is_another_endpoint():
    # web-0 re-created (a new uid) at the old address while the old one drains: the old
    # pod is gone (rule 3), the new one is not mistaken for it.
    h = started(A, B, drain_timeout=300)
    h.upsert(slice_of(endpoint(A, pod="web-0", uid="uid-1"), endpoint(B)))
    h.fake.set_connections(vs(), rs(A), active=1)
    h.upsert(slice_of(terminating(A, pod="web-0", uid="uid-1"), endpoint(B)))
    h.upsert(slice_of(endpoint(A, pod="web-0", uid="uid-2", ready=False), endpoint(B)))
    e = h.engine.drains.queue.get(vs(), rs(A))
    assert e.pod == PodRef("default", "web-0", "uid-1")
    assert e.deadline_source is DeadlineSource.POD_GONE
    # The same pod listed again (the same uid) is the same endpoint: no deadline again.
    h.upsert(slice_of(terminating(A, pod="web-0", uid="uid-1"), endpoint(B)))
    assert h.engine.drains.queue.get(vs(), rs(A)).deadline_source is DeadlineSource.POD


def test_not_ready_endpoint_that_turns_terminating_loses_its_flag_deadline():
    h = started(A, B, drain_timeout=30)
    h.fake.set_connections(vs(), rs(A), active=1)
    h.upsert(slice_of(endpoint(A, pod="pod-5", ready=False), endpoint(B)))
    assert h.engine.drains.queue.get(vs(), rs(A)).deadline_source is DeadlineSource.DEFAULT
    h.check(10)
    h.upsert(slice_of(terminating(A, pod="pod-5"), endpoint(B)))
    e = h.engine.drains.queue.get(vs(), rs(A))
    assert (e.reason, e.deadline_source) == (DrainReason.TERMINATING, DeadlineSource.POD)
    h.check(60)
    assert h.fake.weight(vs(), rs(A)) == 0


def test_returning_endpoint_gets_weight_1_in_place_never_delete_and_add():
    # kubernetes#81775: kube-proxy deleted and re-added it, resetting its connections.
    h = started(A, B)
    h.fake.set_connections(vs(), rs(A), active=3)
    h.upsert(slice_of(endpoint(B)))
    h.ops()
    h.upsert(slice_of(endpoint(A), endpoint(B)))
    assert h.ops() == ["set-rs 10.96.0.10:80/TCP -> 10.244.1.5:8080 weight 1"]
    assert len(h.engine.drains.queue) == 0
    assert h.fake.services[vs()].dests[rs(A)].active == 3  # its connections survived


def test_returned_endpoint_is_not_deleted_later_by_the_drain_check():
    # kube-router: a returning real server got weight 1 but stayed queued, and was
    # deleted later while live.
    h = started(A, B, drain_timeout=10)
    h.upsert(slice_of(endpoint(B)))
    h.fake.set_connections(vs(), rs(A), active=1)
    h.upsert(slice_of(endpoint(A), endpoint(B)))
    h.fake.set_connections(vs(), rs(A), active=0)
    h.ops()
    h.check(60)
    assert h.ops() == [] and h.fake.weight(vs(), rs(A)) == 1


def test_udp_real_server_deleted_at_once_with_conntrack():
    svc = service("dns", ports=[{"name": "dns", "port": 53, "protocol": "UDP"}])
    ports = [{"name": "dns", "port": 5353, "protocol": "UDP"}]
    h = Harness()
    h.start([svc], [endpoint_slice("dns", [endpoint(A), endpoint(B)], ports=ports)])
    h.ops()
    h.upsert(endpoint_slice("dns", [endpoint(B)], ports=ports))
    assert h.ops() == [
        "del-rs 10.96.0.10:53/UDP -> 10.244.1.5:5353",
        "flush-conntrack 10.96.0.10:53/UDP -> 10.244.1.5:5353",
    ]
    assert len(h.engine.drains.queue) == 0 and h.deletions("udp") == 1


def test_sctp_is_deleted_at_once_too():
    svc = service("s", ports=[{"name": "s", "port": 9, "protocol": "SCTP"}])
    ports = [{"name": "s", "port": 9, "protocol": "SCTP"}]
    h = Harness()
    h.start([svc], [endpoint_slice("s", [endpoint(A), endpoint(B)], ports=ports)])
    h.ops()
    h.upsert(endpoint_slice("s", [endpoint(B)], ports=ports))
    assert h.ops()[0] == "del-rs 10.96.0.10:9/SCTP -> 10.244.1.5:9"


def test_deleted_service_removes_its_virtual_server_at_once():
    h = started(A, B)
    h.fake.set_connections(vs(), rs(A), active=1)
    h.upsert(slice_of(endpoint(B)))
    h.ops()
    h.delete(SVC)
    assert h.ops() == ["del-vs 10.96.0.10:80/TCP"]
    assert len(h.engine.drains.queue) == 0 and h.fake.dump() == ""
    assert h.deletions("service_deleted") == 2
    assert h.metrics.value("ipvsctl_virtual_servers") == 0


def test_port_removed_from_service_removes_its_virtual_server():
    svc2 = service("web", ports=[{"name": "http", "port": 80}, {"name": "x", "port": 81}])
    h = Harness()
    h.start([svc2], [slice_of(endpoint(A))])
    h.ops()
    h.upsert(SVC)
    assert h.ops() == ["del-vs 10.96.0.10:81/TCP"]


def test_all_terminating_keeps_serving_then_drains_when_replacements_are_ready():
    h = started(A, B)
    h.upsert(slice_of(terminating(A), terminating(B)))
    assert h.ops() == [] and len(h.engine.drains.queue) == 0  # KEP-1669: still serving
    h.upsert(slice_of(terminating(A), terminating(B), endpoint(C)))
    assert h.ops() == [
        "add-rs 10.96.0.10:80/TCP -> 10.244.1.7:8080 weight 1",
        "set-rs 10.96.0.10:80/TCP -> 10.244.1.5:8080 weight 0",
        "set-rs 10.96.0.10:80/TCP -> 10.244.1.6:8080 weight 0",
    ]
    assert {e.reason for e in h.engine.drains.queue} == {DrainReason.TERMINATING}


def test_one_read_per_check_for_every_draining_real_server_of_a_virtual_server():
    h = started(A, B, C, "10.244.1.8")
    for a in (A, B, C):
        h.fake.set_connections(vs(), rs(a), active=1)
    h.upsert(slice_of(endpoint("10.244.1.8")))
    h.fake.dumps = h.fake.table_reads = 0
    h.check(1)
    # one dump of its virtual server (the whole table is read only when dumps cost more)
    assert (h.fake.table_reads, h.fake.dumps, h.fake.conn_reads) == (0, 1, 0)


def test_queue_entry_forgotten_when_real_server_vanishes():
    h = started(A, B)
    h.fake.set_connections(vs(), rs(A), active=1)
    h.upsert(slice_of(endpoint(B)))
    h.fake.delete_real_server(vs(), rs(A))  # someone else deleted it
    h.ops()
    h.check(1)
    assert len(h.engine.drains.queue) == 0 and h.ops() == []


def test_relist_of_unchanged_objects_causes_no_work():
    h = started(A, B)
    h.engine.handle(Replace(ObjectKind.SERVICE, [service("web")], 0.0))
    h.engine.handle(
        Replace(
            ObjectKind.ENDPOINT_SLICE,
            [slice_of(endpoint(A, pod="pod-5"), endpoint(B, pod="pod-6"))],
            0.0,
        )
    )
    assert h.engine.dirty == set()
    h.engine.sync()
    assert h.ops() == []


def test_relist_missing_a_slice_drains_its_endpoints():
    h = started(A)
    h.fake.set_connections(vs(), rs(A), active=1)
    h.engine.handle(Replace(ObjectKind.ENDPOINT_SLICE, [], 0.0))
    h.engine.sync()
    assert h.ops() == ["set-rs 10.96.0.10:80/TCP -> 10.244.1.5:8080 weight 0"]


# --- restarts -------------------------------------------------------------------------
def _kernel_with(weights, conns=None):
    k = FakeKernel()
    k.add_virtual_server(VirtualServer(vs()), True)
    for a, w in weights.items():
        k.add_real_server(vs(), rs(a), w)
        if conns and a in conns:
            k.set_connections(vs(), rs(a), conns[a])
    k.take_ops()
    return k


def test_restart_adopts_unwanted_weight_0_real_server_without_touching_it():
    k = _kernel_with({A: 1, B: 0}, conns={B: 2})
    h = Harness(kernel=k)
    h.start([SVC], [slice_of(endpoint(A))])
    assert h.ops() == []  # neither deleted abruptly nor set back to 1
    e = h.engine.drains.queue.get(vs(), rs(B))
    assert e.reason is DrainReason.ADOPTED and e.deadline == h.clock.wall() + 30
    h.fake.set_connections(vs(), rs(B), 0)
    h.check(1)
    assert h.ops() == ["del-rs 10.96.0.10:80/TCP -> 10.244.1.6:8080"]


def test_restart_keeps_the_persisted_deadline():
    k = _kernel_with({A: 1, B: 0}, conns={B: 2})
    h0 = Harness()
    saved = DrainEntry(
        vs(),
        rs(B),
        None,
        DrainReason.REMOVED,
        h0.clock.wall() - 20,
        h0.clock.wall() + 7,
        DeadlineSource.DEFAULT,
    )
    h = Harness(kernel=k, restored=[saved], drain_timeout=300)
    h.start([SVC], [slice_of(endpoint(A))])
    assert h.engine.drains.queue.get(vs(), rs(B)) == saved
    h.check(7)
    assert h.deletions("deadline") == 1


def test_restart_judges_a_drain_its_pod_bounded_from_the_slices():
    # Saved while web-6 was listed as terminating; gone by the time the daemon is back.
    k = _kernel_with({A: 1, B: 0}, conns={B: 2})
    h0 = Harness()
    saved = DrainEntry(
        vs(),
        rs(B),
        None,
        DrainReason.TERMINATING,
        h0.clock.wall() - 20,
        NO_DEADLINE,
        DeadlineSource.POD,
        PodRef("default", "pod-6", "u6"),
    )
    h = Harness(kernel=k, restored=[saved], drain_timeout=300)
    h.start([SVC], [slice_of(endpoint(A))])
    assert h.engine.drains.queue.get(vs(), rs(B)).deadline_source is DeadlineSource.POD_GONE
    h.check(POD_GONE_GRACE)
    assert h.deletions("pod_gone") == 1


def test_restart_sets_wanted_weight_0_real_server_back_to_1():
    # kubernetes#92019: weights stuck at 0 after a restart.
    k = _kernel_with({A: 0, B: 1})
    h = Harness(kernel=k)
    h.start([SVC], [slice_of(endpoint(A), endpoint(B))])
    assert h.ops() == ["set-rs 10.96.0.10:80/TCP -> 10.244.1.5:8080 weight 1"]


def test_restart_drains_unwanted_live_real_server_and_deletes_orphan_virtual_server():
    k = _kernel_with({A: 1, B: 1}, conns={B: 1})
    k.add_virtual_server(VirtualServer(vs("10.96.0.77")), True)
    k.take_ops()
    h = Harness(kernel=k)
    h.start([SVC], [slice_of(endpoint(A))])
    assert h.ops() == [
        "del-vs 10.96.0.77:80/TCP",
        "set-rs 10.96.0.10:80/TCP -> 10.244.1.6:8080 weight 0",
    ]


def test_restart_with_unchanged_kernel_makes_no_changes():
    h1 = started(A, B)
    h2 = Harness(kernel=h1.fake)
    h2.start([SVC], [slice_of(endpoint(A, pod="pod-5"), endpoint(B, pod="pod-6"))])
    assert h2.ops() == []


def test_restart_fixes_scheduler_in_place():
    k = _kernel_with({A: 1})
    h = Harness(kernel=k)
    h.start([service("web", annotations={"ipvsctl.io/scheduler": "lc"})], [slice_of(endpoint(A))])
    assert h.ops() == ["set-vs 10.96.0.10:80/TCP lc"]


# --- kube-proxy pkg/proxy/ipvs/graceful_termination_test.go, ported ------------------
def test_kube_proxy_graceful_delete_rs_with_connections_is_queued():
    # "graceful delete, destination has active connections": weight 0, kept.
    h = started(A, B)
    h.fake.set_connections(vs(), rs(A), active=10, inactive=10)
    h.upsert(slice_of(endpoint(B)))
    h.check(1)
    assert h.fake.weight(vs(), rs(A)) == 0


def test_kube_proxy_graceful_delete_rs_without_connections_is_removed():
    # "graceful delete, destination has no active connections": removed.
    h = started(A, B)
    h.upsert(slice_of(endpoint(B)))
    h.check(0)
    assert h.fake.weight(vs(), rs(A)) is None


def test_kube_proxy_graceful_delete_udp_is_immediate():
    # "graceful delete, UDP destination with active connections": removed at once.
    svc = service("u", ports=[{"name": "u", "port": 53, "protocol": "UDP"}])
    ports = [{"name": "u", "port": 53, "protocol": "UDP"}]
    h = Harness()
    h.start([svc], [endpoint_slice("u", [endpoint(A), endpoint(B)], ports=ports)])
    h.fake.set_connections(vs(port=53, proto="UDP"), rs(A, 53), active=10)
    h.upsert(endpoint_slice("u", [endpoint(B)], ports=ports))
    assert h.fake.weight(vs(port=53, proto="UDP"), rs(A, 53)) is None


def test_restart_takes_over_a_wanted_virtual_server_it_does_not_own_in_place():
    # Migration from kube-router: its VIPs are on kube-dummy-if, not ours, but a virtual
    # server we want is adopted with its real servers (no delete, no re-add).
    k = _kernel_with({A: 1, B: 1}, conns={A: 4})
    k.add_virtual_server(VirtualServer(vs("10.96.5.5")), False)  # someone else's, unwanted
    k.take_ops()
    h = Harness(kernel=k)
    h.engine.owned = lambda key: False
    h.start([SVC], [slice_of(endpoint(A))])
    assert h.ops() == ["set-rs 10.96.0.10:80/TCP -> 10.244.1.6:8080 weight 0"]
    assert h.fake.services[vs()].dests[rs(A)].active == 4
    assert vs("10.96.5.5") in h.fake.services


def test_the_feed_tells_each_applied_service_change_once():
    seen = []
    h = Harness()
    h.feed.subscribe(
        Subscriptions(
            service=lambda ref, old, new: seen.append((str(ref), old is None, new is None))
        )
    )
    h.start([SVC], [slice_of(endpoint(A))])
    h.upsert(slice_of(endpoint(A)))  # no change: no call
    h.upsert(slice_of(endpoint(A), endpoint(B)))
    h.delete(SVC)
    assert seen == [
        ("default/web", True, False),
        ("default/web", False, False),
        ("default/web", False, True),
    ]


class _FailingRestore(FakeKernel):
    """Setting a weight to 1 fails while `failing`: a restore that did not reach the kernel."""

    failing = False

    def set_real_server_weight(self, key, rs, weight):
        if self.failing and weight == 1:
            from ipvsctl.kernel.port import KernelTransient

            raise KernelTransient("injected", "set_real_server_weight")
        super().set_real_server_weight(key, rs, weight)


def test_a_failed_weight_restore_never_lets_the_drain_check_delete_a_wanted_server():
    """Regression: the entry stayed queued when the restore failed, and the drain check
    then deleted the wanted real server at its deadline, live connections and all."""
    kernel = _FailingRestore()
    h = started(A, B, h=Harness(kernel=kernel, drain_timeout=10))
    h.upsert(slice_of(endpoint(B)))  # A drains
    h.fake.set_connections(vs(), rs(A), active=2)
    kernel.failing = True
    h.upsert(slice_of(endpoint(A), endpoint(B)))  # A is back; its restore fails
    h.ops()
    h.check(60)  # past A's old deadline
    assert h.ops() == [] and rs(A) in h.fake.services[vs()].dests
    assert h.deletions("deadline") == 0
    kernel.failing = False
    h.clock.advance(60)
    h.engine.sync()  # the retry restores it in place
    assert h.fake.weight(vs(), rs(A)) == 1
    assert h.fake.services[vs()].dests[rs(A)].active == 2

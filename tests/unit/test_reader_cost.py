"""The kernel readers' costs: an audit round's start sorts nothing under the
loop's lock, drain checks never wait behind the audit's reads, and the audit is paced by
its own cost. Counted, not timed."""

from __future__ import annotations

import queue
import threading

from devkit.builders import endpoint, endpoint_slice, service
from devkit.harness import Harness, rs, vs
from ipvsctl.kernel.fake import FakeKernel
from ipvsctl.model import ServiceKey
from ipvsctl.reconcile.loop import AUDIT_DUTY, Loop, LoopConfig
from ipvsctl.reconcile.paced import Pace, PacedRunner

A, B = "10.244.1.5", "10.244.1.6"


def test_an_audit_round_sorts_no_keys_and_reads_each_once():
    """No order is needed, only every key once per round, so nothing is sorted under the
    loop's lock (two sorts of every key per round held it 70 ms at 10,000): the round hands
    out the keys in the applied state's own order, here not the keys' order."""
    h = Harness()
    h.engine.audit.batch = 40
    # named in the reverse order of their addresses: the state holds them in sync order
    h.start(
        [
            service(f"s{i:03}", cluster_ip=f"10.96.{(399 - i) // 200}.{(399 - i) % 200 + 1}")
            for i in range(400)
        ],
        [],
    )
    in_state = list(h.engine.state.owner)
    assert in_state != sorted(in_state)
    h.fake.dumps = 0
    planned: list[ServiceKey] = []
    read: list[ServiceKey] = []
    for _ in range(10):  # one round: 400 keys, 40 a step
        plan = h.engine.audit.snapshot()
        assert plan is not None
        planned += plan.keys
        reading = h.engine.audit.read(plan)
        read += reading.real_servers
        assert not h.engine.audit.apply(reading).found
    assert planned == in_state  # unsorted: the state's order
    assert sorted(read) == sorted(in_state) and len(read) == len(set(read)) == 400
    assert h.fake.dumps == 400  # the fake's count of real server reads


def test_a_drain_check_judges_off_the_lock_and_applies_only_its_deletions(monkeypatch):
    """With 300 real servers draining and held, the part of a check under the loop's lock
    (accepting the verdict) runs the drain rule for none of them; one released real server
    is one deletion. (Judging every entry under the lock held events up ~5 ms a second at
    1,000 draining on the host.)"""
    from ipvsctl.reconcile import termination

    h = Harness(drain_timeout=600)
    n = 300
    h.start(
        [service(f"s{i}", cluster_ip=f"10.96.{i // 200}.{i % 200 + 1}") for i in range(n)],
        [endpoint_slice(f"s{i}", [endpoint(A), endpoint(B)]) for i in range(n)],
    )
    keys = [ServiceKey(vs().protocol, f"10.96.{i // 200}.{i % 200 + 1}", 80) for i in range(n)]
    for i, key in enumerate(keys):
        h.fake.set_connections(key, rs(A), active=1)
        h.upsert(endpoint_slice(f"s{i}", [endpoint(B)]))
    assert len(h.engine.drains.queue) == n
    h.fake.set_connections(keys[7], rs(A), active=0)
    judged = 0
    rule = termination.check_drains

    def counting_rule(*args, **kwargs):
        nonlocal judged
        judged += 1
        return rule(*args, **kwargs)

    monkeypatch.setattr(termination, "check_drains", counting_rule)
    check = h.engine.drain_check
    verdict = check.read(check.snapshot())  # off the lock
    assert judged == n
    h.ops()
    judged = 0
    check.apply(verdict)  # under the lock
    assert judged == 0
    assert h.ops() == [f"del-rs {keys[7]} -> {rs(A)}"] and h.deletions("drained") == 1
    assert len(h.engine.drains.queue) == n - 1
    assert h.engine.drains.counts(keys[8], rs(A)) == (1, 0)  # what was read is shown


class BlockingDumpKernel(FakeKernel):
    """The audit's full dump (a round's start) waits until released: a 40 s dump."""

    def __init__(self) -> None:
        super().__init__()
        self.dumping = threading.Event()
        self.release = threading.Event()
        self.deleted = threading.Event()
        self.block = False

    def list_virtual_servers(self):
        if self.block:
            self.dumping.set()
            assert self.release.wait(30)
        return super().list_virtual_servers()

    def delete_real_server(self, *args, **kwargs):
        out = super().delete_real_server(*args, **kwargs)
        self.deleted.set()
        return out


def test_a_drain_check_is_not_held_up_by_the_audits_full_dump():
    kernel = BlockingDumpKernel()
    h = Harness(kernel=kernel, drain_timeout=600)
    loop = Loop(
        h.engine,
        queue.Queue(),
        LoopConfig(drain_check_interval=0.05, audit_interval=0.05),
        clock=h.clock,
    )
    h.start([service("web")], [endpoint_slice("web", [endpoint(A), endpoint(B)])])
    h.fake.set_connections(vs(), rs(A), active=1)
    h.upsert(endpoint_slice("web", [endpoint(B)]))  # A drains, held by its connection
    assert len(h.engine.drains.queue) == 1
    kernel.block = True
    stop = threading.Event()
    reader = threading.Thread(target=loop.drain_runner.run, args=(stop,))
    auditor = threading.Thread(target=loop.audit_runner.run, args=(stop,))
    h.clock.advance(0.05)  # the first audit step is due
    auditor.start()
    reader.start()
    try:
        assert kernel.dumping.wait(30)  # the audit is inside its full dump...
        with loop.lock:
            h.fake.set_connections(vs(), rs(A), active=0)
            h.clock.advance(1.0)  # the next drain check is due
        assert kernel.deleted.wait(30)  # ...and the drain check still deletes the idle one
        assert not kernel.release.is_set() and h.fake.weight(vs(), rs(A)) is None
    finally:
        kernel.release.set()
        stop.set()
        loop.drain_runner.wake.set()
        loop.audit_runner.wake.set()
        reader.join(30)
        auditor.join(30)
    assert not reader.is_alive() and not auditor.is_alive()


class TimedRead:
    """A background read whose kernel part takes `took` seconds of the clock."""

    def __init__(self, clock, took: float) -> None:
        self.clock, self.took, self.applied = clock, took, 0

    def snapshot(self) -> str:
        return "plan"

    def read(self, plan: str) -> str:
        self.clock.advance(self.took)
        return plan

    def apply(self, reading: str) -> None:
        self.applied += 1


def test_the_audit_reads_at_most_a_tenth_of_the_time():
    from ipvsctl.reconcile.clock import ManualClock

    clock = ManualClock()
    pace = Pace(every=1.0, duty=AUDIT_DUTY)
    cheap = PacedRunner("audit", TimedRead(clock, 0.01), threading.Lock(), pace, clock=clock)
    assert cheap.step() and round(cheap.timeout(), 6) == 0.99  # cheap steps: one per interval
    assert not cheap.step()  # not due again yet
    slow = PacedRunner("audit", TimedRead(clock, 4.0), threading.Lock(), pace, clock=clock)
    start = clock.monotonic()
    assert slow.step() and slow.not_before == start + 4.0 + 4.0 * AUDIT_DUTY  # 36 s pause
    assert slow.task.applied == 1
    assert AUDIT_DUTY >= 9.0


class SlowDumpKernel(FakeKernel):
    """The full dump takes 2 s of the harness's clock."""

    clock = None

    def list_virtual_servers(self):
        self.clock.advance(2.0)
        return super().list_virtual_servers()


def test_the_audit_pacing_counts_its_reads_not_its_wait_for_the_lock():
    # In the bench the first audit step waited ~4 s for the lock behind the 10,000-Service
    # initial sync, was measured as a 4 s step and then paused 36 s.
    kernel = SlowDumpKernel()
    h = Harness(kernel=kernel)
    kernel.clock = h.clock
    h.start([service("web")], [endpoint_slice("web", [endpoint(A)])])
    loop = Loop(h.engine, queue.Queue(), LoopConfig(), clock=h.clock)
    h.clock.advance(loop.config.audit_interval)  # the first step is due
    with loop.lock:
        step = threading.Thread(target=loop.audit_runner.step)
        step.start()
        h.clock.advance(30.0)  # a long sync holds the lock meanwhile
    step.join(30)
    # paced by the round start's 2 s dump only, not the 30 s wait
    assert loop.audit_runner.not_before == h.clock.monotonic() + 2.0 * AUDIT_DUTY


def test_drain_checks_are_paced_start_to_start():
    """A check whose read takes 0.8 s is followed by the next 0.2 s later (interval 1 s),
    not 1 s later: a drain is seen within the interval plus one read, not two reads."""

    class SlowRead(FakeKernel):
        def dump_real_servers(self, keys, only=None):
            h.clock.advance(0.8)
            return super().dump_real_servers(keys, only)

    h = Harness(kernel=SlowRead(), drain_timeout=600)
    loop = Loop(h.engine, queue.Queue(), LoopConfig(drain_check_interval=1.0), clock=h.clock)
    h.start([service("web")], [endpoint_slice("web", [endpoint(A), endpoint(B)])])
    h.fake.set_connections(vs(), rs(A), active=1)
    h.upsert(endpoint_slice("web", [endpoint(B)]))
    assert loop.drain_runner.step()
    assert round(loop.drain_runner.timeout(), 6) == 0.2


def test_one_pacing_rule_for_every_background_read():
    from ipvsctl.reconcile.clock import paced

    assert paced(10.0, 10.01, duty=9.0, every=1.0) == 11.0  # cheap: once per `every`
    assert paced(10.0, 14.0, duty=9.0, every=1.0) == 50.0  # 4 s of reading, 36 s of rest
    assert paced(10.0, 10.5, duty=4.0, rest=60.0) == 70.5  # at least `rest` after it ended
    assert paced(10.0, 10.5, duty=9.0) == 15.0  # the connection-table pass: duty alone


def test_a_round_start_compares_the_virtual_servers_off_the_lock():
    """The walk comparing every applied virtual server with the kernel's dump is in the
    read; under the lock only the differences are applied (one changed behind our back)."""
    from ipvsctl.model import VirtualServer

    h = Harness()
    h.start(
        [service(f"s{i}", cluster_ip=f"10.96.{i // 200}.{i % 200 + 1}") for i in range(300)], []
    )
    changed = ServiceKey(vs().protocol, "10.96.0.7", 80)
    h.fake.update_virtual_server(VirtualServer(changed, "wlc"))  # an operator's ipvsadm -E
    auditor = h.engine.audit
    plan = auditor.snapshot()
    assert plan is not None and plan.full
    before = auditor.compared
    reading = auditor.read(plan)  # off the lock
    assert auditor.compared - before == 300  # every applied virtual server, in the read
    before = auditor.compared
    assert auditor.apply(reading).found == 1  # under the lock
    assert auditor.compared == before  # none compared: only the difference applied
    assert h.engine.state.get(None, changed).vs.scheduler == "wlc"  # seen as it is now
    h.engine.sync()
    assert h.fake.services[changed].vs.scheduler == "rr"  # and put right


def test_a_round_start_read_while_the_state_changed_is_read_again():
    h = Harness()
    h.start([service(f"s{i}", cluster_ip=f"10.96.0.{i + 1}") for i in range(5)], [])
    plan = h.engine.audit.snapshot()
    assert plan is not None
    reading = h.engine.audit.read(plan)
    h.upsert(service("s9", cluster_ip="10.96.0.99"))  # the loop applies a change meanwhile
    assert h.engine.audit.apply(reading).found == 0
    again = h.engine.audit.snapshot()
    assert again is not None and again.full  # the round starts again


def test_a_drain_snapshot_is_one_shallow_copy_and_later_changes_leave_it_alone():
    """The queue's per-virtual-server maps are replaced on change, never changed in place:
    the snapshot shares them (no copy per entry under the lock) and stays as it was."""
    from ipvsctl.model import DrainEntry, DrainQueue, DrainReason, RealServerKey
    from ipvsctl.model.drain import DeadlineSource

    q = DrainQueue()
    keys = [ServiceKey(vs().protocol, f"10.96.0.{i + 1}", 80) for i in range(50)]
    a, b = RealServerKey(A, 8080), RealServerKey(B, 8080)
    for key in keys:
        for rs_ in (a, b):
            q.add(
                DrainEntry(key, rs_, None, DrainReason.REMOVED, 0.0, 60.0, DeadlineSource.DEFAULT)
            )
    snap = q.snapshot()
    assert all(snap[k] is q.for_vs(k) for k in keys)  # shared, not copied
    q.remove(keys[0], a)
    q.remove_vs(keys[1])
    q.add(
        DrainEntry(
            keys[2],
            RealServerKey("10.244.9.9", 8080),
            None,
            DrainReason.REMOVED,
            0.0,
            60.0,
            DeadlineSource.DEFAULT,
        )
    )
    assert set(snap[keys[0]]) == {a, b} and set(snap[keys[1]]) == {a, b}
    assert len(snap[keys[2]]) == 2 and len(q.for_vs(keys[2])) == 3
    assert set(q.for_vs(keys[0])) == {b} and not q.for_vs(keys[1]) and len(q) == 98


def test_a_round_start_lists_its_keys_off_the_lock():
    """The round's cursor (every applied key) is listed in the read with the walk; the part
    under the lock lists none (a list of 10,000 keys held the loop's lock at every round
    start)."""
    h = Harness()
    h.start(
        [service(f"s{i}", cluster_ip=f"10.96.{i // 200}.{i % 200 + 1}") for i in range(300)], []
    )
    listed = 0

    class Owners(dict):
        def __iter__(self):
            nonlocal listed
            listed += 1
            return super().__iter__()

    h.engine.state.owner = Owners(h.engine.state.owner)
    auditor = h.engine.audit
    plan = auditor.snapshot()
    assert plan is not None and plan.full
    reading = auditor.read(plan)  # off the lock
    assert listed >= 1
    listed = 0
    auditor.apply(reading)  # under the lock
    assert listed == 0
    next_plan = auditor.snapshot()
    assert next_plan is not None and not next_plan.full  # the round goes on from the cursor
    assert len(next_plan.keys) == auditor.batch

"""Events before background reads: a reader busy in Python steps aside for the
loop while an event waits, so the change's GIL handoffs do not each wait a switch interval
behind it. Counted in the reader's own work (Services compared, give-way points), not
timed."""

from __future__ import annotations

import math
import queue
import sys
import threading

import pytest

from devkit.builders import endpoint, endpoint_slice, service
from devkit.harness import Harness, rs, vs
from ipvsctl.kernel.fake import FakeKernel
from ipvsctl.model import ServiceKey
from ipvsctl.reconcile.audit import SERVICES_PER_GIVE_WAY
from ipvsctl.reconcile.drain_reader import DUMP_BATCH, PROBE_DUMPS
from ipvsctl.reconcile.events_first import READING_SWITCH_INTERVAL, EventsFirst
from ipvsctl.reconcile.loop import Loop, LoopConfig
from ipvsctl.source.events import ObjectKind, Upsert

A, B = "10.244.1.5", "10.244.1.6"


class NotingKernel(FakeKernel):
    """Notes how far the audit's walk had got when each real server write was made."""

    def __init__(self) -> None:
        super().__init__()
        self.progress = lambda: -1
        self.written_at: list[int] = []

    def set_real_server_weight(self, *args, **kwargs):
        self.written_at.append(self.progress())
        return super().set_real_server_weight(*args, **kwargs)

    def delete_real_server(self, *args, **kwargs):
        self.written_at.append(self.progress())
        return super().delete_real_server(*args, **kwargs)


def test_a_busy_audit_steps_aside_for_a_queued_event_until_the_loop_applied_it():
    kernel = NotingKernel()
    h = Harness(kernel=kernel, drain_timeout=600)
    n = 300
    h.start(
        [service(f"s{i}", cluster_ip=f"10.96.{i // 200}.{i % 200 + 1}") for i in range(n)],
        [endpoint_slice(f"s{i}", [endpoint(A), endpoint(B)]) for i in range(n)],
    )
    events: queue.Queue = queue.Queue()
    loop = Loop(h.engine, events, LoopConfig(), clock=h.clock)
    auditor = h.engine.audit
    kernel.progress = lambda: auditor.compared
    arrived: list[int] = []
    change = endpoint_slice("s7", [endpoint(B)])  # A goes: its weight to 0 (draining)

    class Tap(dict):
        """The applied state's per-Service map: the event arrives (the source thread puts
        it) when the audit's walk reaches the 100th Service."""

        def items(self):
            for i, item in enumerate(super().items()):
                if i == 100 and not arrived:
                    arrived.append(auditor.compared)
                    events.put(Upsert(ObjectKind.ENDPOINT_SLICE, change, h.clock.monotonic()))
                yield item

    h.engine.state.by_service = Tap(h.engine.state.by_service)
    plan = auditor.snapshot()
    assert plan is not None and plan.full
    readings: list = []
    reader = threading.Thread(target=lambda: readings.append(auditor.read(plan)))
    reader.start()
    first = loop.events_first
    try:
        assert first.wait_parked(1, 30)  # the reader stepped aside...
        parked_at = auditor.compared
        # ...within one give-way stride of the Services it compares (one virtual server each)
        assert arrived == [100] and 0 <= parked_at - arrived[0] <= SERVICES_PER_GIVE_WAY
        loop.step()  # the loop takes the event and applies it
    finally:
        reader.join(30)
    assert not reader.is_alive()
    # the change reached the kernel while the reader stood still, then the reader went on
    assert kernel.written_at == [parked_at]
    assert h.fake.weight(ServiceKey(vs().protocol, "10.96.0.8", 80), rs(A)) == 0  # s7's
    assert first.gave_way == 1 and auditor.compared == n
    assert auditor.apply(readings[0]).found == 0  # the walk met a change: read again later


def test_a_reader_waits_for_each_step_once_and_for_at_most_max_wait():
    """No loop takes the queued event here: the reader waits `max_wait` for the step, then
    reads on without waiting again for that same step; the next step it waits for again."""
    events: queue.Queue = queue.Queue()
    first = EventsFirst(events, max_wait=0.01)
    first.give_way()
    assert first.gave_way == 0  # nothing waiting: returns at once
    events.put("event")
    first.give_way()
    first.give_way()
    assert first.gave_way == 1 and first.parked == 0
    events.get()
    first.took_events()  # the loop applies it: the readers still step aside
    first.step_done()
    first.took_events()
    first.give_way()
    assert first.gave_way == 2
    first.step_done()
    first.give_way()
    assert first.gave_way == 2  # the loop idle, the queue empty


def test_the_switch_interval_is_short_only_while_a_reader_reads():
    before = sys.getswitchinterval()
    first = EventsFirst(queue.Queue())
    try:
        with first.reading():
            assert sys.getswitchinterval() == pytest.approx(READING_SWITCH_INTERVAL)
            with first.reading():  # two readers at once
                pass
            assert sys.getswitchinterval() == pytest.approx(READING_SWITCH_INTERVAL)
        assert sys.getswitchinterval() == before
    finally:
        sys.setswitchinterval(before)


def test_the_loops_step_runs_at_its_own_interval_while_a_reader_reads():
    # A short interval during the loop's step cut its work into 50 us turns with the
    # reader's Python: only the loop's wake-up gets it.
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.001)
    first = EventsFirst(queue.Queue())
    try:
        with first.reading():
            first.took_events()
            assert sys.getswitchinterval() == pytest.approx(0.001)
            first.step_done()
            assert sys.getswitchinterval() == pytest.approx(READING_SWITCH_INTERVAL)
        first.took_events()  # a read that starts during a step waits for its end
        with first.reading():
            assert sys.getswitchinterval() == pytest.approx(0.001)
            first.step_done()
            assert sys.getswitchinterval() == pytest.approx(READING_SWITCH_INTERVAL)
        assert sys.getswitchinterval() == pytest.approx(0.001)
        first.took_events()
        first.step_done()  # no reader: the interval is left alone
        assert sys.getswitchinterval() == pytest.approx(0.001)
    finally:
        sys.setswitchinterval(before)


def test_drain_checks_give_way_between_dumps_and_while_judging():
    calls = 0

    def count() -> None:
        nonlocal calls
        calls += 1

    h = Harness(drain_timeout=600)
    n = 40
    h.start(
        [service(f"s{i}", cluster_ip=f"10.96.0.{i + 1}") for i in range(n)],
        [endpoint_slice(f"s{i}", [endpoint(A), endpoint(B)]) for i in range(n)],
    )
    h.engine.give_way = count
    for i in range(n):
        h.upsert(endpoint_slice(f"s{i}", [endpoint(B)]))
    check = h.engine.drain_check
    check.read(check.snapshot())
    # one per batch of dumps (the two probes', the first opening the socket, then the
    # rest's), and the judging of 40 virtual servers: every 16th
    assert calls == 2 + math.ceil((n - 2 * PROBE_DUMPS) / DUMP_BATCH) + 3
    calls = 0
    h.engine.drain_check.reader._table_cost = 0.0  # the table measured cheaper: one read
    check.read(check.snapshot())
    assert calls == 3  # the judging alone

"""The event backlog (source/backlog.py): one waiting event per EndpointSlice, the newest;
nothing lost for another key, the order kept, every merged version still observed."""

from __future__ import annotations

import queue
import threading
from datetime import UTC, datetime

import pytest

from devkit.builders import endpoint, endpoint_slice, service
from devkit.harness import Harness
from ipvsctl.source.backlog import Backlog
from ipvsctl.source.convert import TRIGGER_TIME_ANNOTATION
from ipvsctl.source.events import Delete, ObjectKind, PreparedUpsert, Replace, SourceEvent, Upsert

SLICE, SVC = ObjectKind.ENDPOINT_SLICE, ObjectKind.SERVICE


def sl(name: str, *addresses: str, service_name: str = "web", trigger: str | None = None) -> dict:
    obj = endpoint_slice(service_name, [endpoint(a) for a in addresses], name=name)
    if trigger is not None:
        obj["metadata"]["annotations"] = {TRIGGER_TIME_ANNOTATION: trigger}
    return obj


def drain(q: queue.Queue[SourceEvent]) -> list[SourceEvent]:
    out = []
    while True:
        try:
            out.append(q.get_nowait())
        except queue.Empty:
            return out


def test_the_newest_version_of_a_slice_wins_in_the_first_ones_place():
    q = Backlog()
    q.put(Upsert(SLICE, sl("a", "10.0.0.1"), 1.0))
    q.put(Upsert(SLICE, sl("b", "10.0.0.2"), 2.0))
    q.put(Upsert(SLICE, sl("a", "10.0.0.3"), 3.0))
    q.put(Upsert(SLICE, sl("a", "10.0.0.4"), 4.0))
    assert q.qsize() == 2
    got = drain(q)
    assert [e.obj["metadata"]["name"] for e in got] == ["a", "b"]
    first = got[0]
    assert isinstance(first, Upsert)
    assert first.obj["endpoints"][0]["addresses"] == ["10.0.0.4"]
    assert (first.earlier, first.received) == ((1.0, 3.0), 4.0)
    assert q.merged == 2


def test_no_event_of_another_key_or_kind_is_lost_or_reordered():
    q = Backlog()
    events: list[SourceEvent] = [
        Upsert(SVC, service("web"), 1.0),
        Upsert(SVC, service("web"), 2.0),  # Services are kept as they come
        Upsert(SLICE, sl("a", "10.0.0.1"), 3.0),
        Upsert(SLICE, sl("a", "10.0.0.1", service_name="api"), 3.5),
        Delete(SLICE, "default", "b", 4.0),
        Upsert(ObjectKind.NODE, {"metadata": {"name": "n1"}}, 5.0),
        Upsert(SLICE, {"metadata": "junk"}, 6.0),  # no readable name: never merged
        Upsert(SLICE, {"metadata": "junk"}, 7.0),
    ]
    for e in events:
        q.put(e)
    got = drain(q)
    assert [e.received for e in got] == [1.0, 2.0, 3.5, 4.0, 5.0, 6.0, 7.0]
    assert got[2].earlier == (3.0,)


def test_a_delete_replaces_a_waiting_update_and_an_update_a_waiting_delete():
    q = Backlog()
    q.put(Upsert(SLICE, sl("a", "10.0.0.1"), 1.0))
    q.put(Delete(SLICE, "default", "a", 2.0))
    (got,) = drain(q)
    assert isinstance(got, Delete) and got.earlier == (1.0,)
    q.put(Delete(SLICE, "default", "a", 3.0))
    q.put(Upsert(SLICE, sl("a", "10.0.0.9"), 4.0))
    (got,) = drain(q)
    assert isinstance(got, Upsert) and got.earlier == (3.0,)


def test_no_update_merges_across_a_relist_nor_into_a_taken_slot():
    q = Backlog()
    q.put(Upsert(SLICE, sl("a", "10.0.0.1"), 1.0))
    q.put(Replace(SLICE, [sl("a", "10.0.0.2")], 2.0))
    q.put(Upsert(SLICE, sl("a", "10.0.0.3"), 3.0))
    assert [e.received for e in drain(q)] == [1.0, 2.0, 3.0]
    q.put(Upsert(SLICE, sl("a", "10.0.0.1"), 4.0))
    assert q.get_nowait().received == 4.0  # taken: the next one waits on its own
    q.put(Upsert(SLICE, sl("a", "10.0.0.2"), 5.0))
    assert [e.earlier for e in drain(q)] == [()]


def test_join_and_task_done_still_balance():
    q = Backlog()
    for t in range(5):
        q.put(Upsert(SLICE, sl("a", f"10.0.0.{t + 1}"), float(t)))
    assert q.qsize() == 1
    q.get_nowait()
    q.task_done()
    done = threading.Event()
    threading.Thread(target=lambda: (q.join(), done.set()), daemon=True).start()
    assert done.wait(5)


def rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.mark.parametrize("prepared", [False, True], ids=["raw", "prepared"])
def test_every_merged_version_is_observed_from_its_own_arrival_and_trigger(prepared):
    """Raw, or prepared in the source's thread (kube/watch.py): a waiting parsed slice keeps
    its trigger-time annotation as sent, so a merged one is observed alike."""
    h = Harness()
    h.start([service("web")], [sl("web-1", "10.0.0.1")])
    preparer = h.engine.intake.store.preparer

    def upsert(obj: dict, received: float) -> Upsert | PreparedUpsert:
        if prepared:
            return PreparedUpsert(SLICE, preparer.event(SLICE, obj), received)
        return Upsert(SLICE, obj, received)

    h.clock.advance(100)  # trigger times from before the daemon started are not observed
    m = h.metrics
    before = m.value("ipvsctl_event_to_kernel_seconds_count")
    before_sum = m.value("ipvsctl_event_to_kernel_seconds_sum")
    q = Backlog()
    t0 = h.clock.monotonic()
    wall = h.clock.wall()
    q.put(upsert(sl("web-1", "10.0.0.2", trigger=rfc3339(wall - 5)), t0))
    h.clock.advance(1)
    q.put(upsert(sl("web-1", "10.0.0.3", trigger="not a time"), t0 + 1))
    h.clock.advance(1)
    q.put(upsert(sl("web-1", "10.0.0.4", trigger=rfc3339(wall - 1)), t0 + 2))
    (event,) = drain(q)
    h.clock.advance(1)
    h.engine.handle(event)
    assert h.engine.pending_since == t0  # the oldest version's arrival
    h.engine.sync()
    assert m.value("ipvsctl_event_to_kernel_seconds_count") - before == 3
    sum_ = m.value("ipvsctl_event_to_kernel_seconds_sum") - before_sum
    assert sum_ == pytest.approx(3 + 2 + 1)
    name = "ipvsctl_network_programming_duration_seconds"
    assert m.value(f"{name}_count") == 2
    assert m.value(f"{name}_sum") == pytest.approx(8 + 4)
    skipped = "ipvsctl_network_programming_skipped_total"
    assert m.value(skipped, {"reason": "malformed"}) == 1
    assert "10.0.0.4" in str(h.kernel.services) and "10.0.0.2" not in str(h.kernel.services)


def test_a_long_history_of_one_waiting_slice_keeps_every_stamp_and_trigger_in_order():
    # A stalled loop and one hot slice: every version is still observed, oldest first.
    q = Backlog()
    n = 3_000
    for i in range(n):
        q.put(Upsert(SLICE, sl("a", "10.0.0.1", trigger=f"2026-01-01T00:00:{i % 60:02d}Z"), i))
    (got,) = drain(q)
    assert got.received == n - 1
    assert got.earlier == tuple(float(i) for i in range(n - 1))
    assert got.earlier_triggers == tuple(f"2026-01-01T00:00:{i % 60:02d}Z" for i in range(n - 1))
    assert q.merged == n - 1 and q.unfinished_tasks == 1


def test_a_premerged_event_keeps_its_own_history_after_the_waiting_ones():
    q = Backlog()
    q.put(Upsert(SLICE, sl("a", "10.0.0.1", trigger="2026-01-01T00:00:01Z"), 1.0))
    q.put(Upsert(SLICE, sl("a", "10.0.0.2"), 5.0, (2.0, 3.0), ("t2",)))
    q.put(Delete(SLICE, "default", "a", 6.0))
    (got,) = drain(q)
    assert isinstance(got, Delete)
    assert got.earlier == (1.0, 2.0, 3.0, 5.0)
    assert got.earlier_triggers == ("2026-01-01T00:00:01Z", "t2")

"""The loop: batching, retry with backoff, kernel trouble at start-up."""

from __future__ import annotations

import queue

from devkit.builders import endpoint, endpoint_slice, service
from devkit.harness import Harness
from ipvsctl.kernel.fake import FakeKernel
from ipvsctl.kernel.port import KernelTransient
from ipvsctl.reconcile.loop import Loop, LoopConfig
from ipvsctl.source.events import ObjectKind, Replace, Upsert


class FlakyListKernel(FakeKernel):
    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    def list_virtual_servers(self):
        if self.failures:
            self.failures -= 1
            raise KernelTransient("dump interrupted", "list_virtual_servers")
        return super().list_virtual_servers()


def make(kernel=None):
    h = Harness(kernel=kernel)
    events: queue.Queue = queue.Queue()
    loop = Loop(h.engine, events, LoopConfig(retry_min=1, retry_max=4), clock=h.clock)
    return h, events, loop


def test_kernel_error_at_start_up_is_retried_with_backoff_not_fatal():
    h, events, loop = make(FlakyListKernel(failures=2))
    events.put(Replace(ObjectKind.SERVICE, [service("web")], 0))
    events.put(
        Replace(ObjectKind.ENDPOINT_SLICE, [endpoint_slice("web", [endpoint("10.0.0.1")])], 0)
    )
    loop.step()
    assert not h.engine.started
    assert (
        h.metrics.value("ipvsctl_netlink_errors_total", {"operation": "list_virtual_servers"}) == 1
    )
    loop.step()  # the retry is not due yet
    assert (
        h.metrics.value("ipvsctl_netlink_errors_total", {"operation": "list_virtual_servers"}) == 1
    )
    h.clock.advance(1)
    loop.step()  # second failure: the delay doubles
    h.clock.advance(1)
    loop.step()
    assert not h.engine.started
    h.clock.advance(1)
    loop.step()
    assert h.engine.started and len(h.fake.services) == 1


def test_a_burst_of_events_is_one_sync():
    h, events, loop = make()
    events.put(Replace(ObjectKind.SERVICE, [service("web")], 0))
    events.put(Replace(ObjectKind.ENDPOINT_SLICE, [], 0))
    loop.step()
    syncs = h.metrics.value("ipvsctl_sync_duration_seconds_count")
    for i in range(50):
        events.put(
            Upsert(
                ObjectKind.ENDPOINT_SLICE,
                endpoint_slice("web", [endpoint(f"10.0.0.{j + 1}") for j in range(i + 1)]),
                0,
            )
        )
    loop.step()
    assert h.metrics.value("ipvsctl_sync_duration_seconds_count") == syncs + 1
    assert len(h.fake.services[next(iter(h.fake.services))].dests) == 50


def test_failed_sync_is_retried_after_backoff():
    h, events, loop = make()
    events.put(Replace(ObjectKind.SERVICE, [], 0))
    events.put(Replace(ObjectKind.ENDPOINT_SLICE, [], 0))
    loop.step()
    real_add = h.fake.add_virtual_server
    calls = []

    def failing_add(vs, bind):
        calls.append(vs)
        if len(calls) == 1:
            raise KernelTransient("busy", "add_virtual_server")
        real_add(vs, bind)

    h.fake.add_virtual_server = failing_add
    events.put(Upsert(ObjectKind.SERVICE, service("web"), 0))
    loop.step()
    assert h.engine.dirty and not h.fake.services
    loop.step()
    assert len(calls) == 1  # not yet due
    h.clock.advance(1)
    loop.step()
    assert not h.engine.dirty and len(h.fake.services) == 1


def _persisting_loop(h: Harness, saved: list[int], locked: list[bool]) -> tuple[queue.Queue, Loop]:
    events: queue.Queue = queue.Queue()
    holder: list[Loop] = []

    def save(entries: list) -> None:
        saved.append(len(entries))
        locked.append(holder[0].lock.locked())

    loop = Loop(
        h.engine,
        events,
        LoopConfig(persist_interval=2.0, drain_check_interval=1.0),
        clock=h.clock,
        save_queue=save,
    )
    holder.append(loop)
    return events, loop


def test_a_new_drain_is_written_at_once_other_changes_at_most_every_persist_interval():
    # Regression: a drain started just before a SIGKILL lost its 600 s deadline because its
    # first write waited for the coalescing interval.
    h = Harness()
    saved: list[int] = []
    locked: list[bool] = []
    events, loop = _persisting_loop(h, saved, locked)
    svc = service("web")
    eps = [endpoint(f"10.0.0.{i}") for i in range(1, 6)]
    events.put(Replace(ObjectKind.SERVICE, [svc], 0))
    events.put(Replace(ObjectKind.ENDPOINT_SLICE, [endpoint_slice("web", eps)], 0))
    loop.step()
    key = next(iter(h.fake.services))
    for rs in list(h.fake.services[key].dests):
        h.fake.set_connections(key, rs, 1)
    for n in range(4, 0, -1):  # four drains in quick succession: each new entry at once
        events.put(Upsert(ObjectKind.ENDPOINT_SLICE, endpoint_slice("web", eps[:n]), 0))
        loop.step()
    assert saved == [1, 2, 3, 4]
    assert locked == [False] * 4  # the fsyncs are not under the loop's lock
    for rs in list(h.fake.services[key].dests):  # two drains end: removals are coalesced
        if rs.address in ("10.0.0.5", "10.0.0.4"):
            h.fake.set_connections(key, rs, 0)
    h.clock.advance(1.0)
    assert loop.drain_runner.step()  # the drain check (its own thread in the daemon)
    loop.step()
    assert len(h.engine.drains.queue) == 2 and saved == [1, 2, 3, 4]
    assert loop._timeout() <= 1.0
    h.clock.advance(1.0)
    loop.step()
    assert saved == [1, 2, 3, 4, 2]


class _Raw(dict):
    """A raw API object that can be watched for being freed."""


class WatchingKernel(FakeKernel):
    """Records, at the first kernel write of the sync, which raw objects are still alive."""

    def __init__(self, watched: list) -> None:
        super().__init__()
        self.watched = watched
        self.alive_at_sync: list[bool] | None = None

    def add_virtual_server(self, *args, **kwargs):
        if self.alive_at_sync is None:
            self.alive_at_sync = [ref() is not None for ref in self.watched]
        return super().add_virtual_server(*args, **kwargs)


def test_the_raw_objects_of_a_batch_are_freed_before_the_sync():
    """The first list of a big cluster is ~60 MB of dicts; holding it while the sync builds
    the desired state raised the daemon's peak memory past the 250 MB target."""
    import weakref

    watched: list = []
    kernel = WatchingKernel(watched)
    h, events, loop = make(kernel)
    svc, sl = _Raw(service("web")), _Raw(endpoint_slice("web", [endpoint("10.0.0.1")]))
    watched += [weakref.ref(svc), weakref.ref(sl)]
    events.put(Replace(ObjectKind.SERVICE, [svc], 0))
    events.put(Replace(ObjectKind.ENDPOINT_SLICE, [sl], 0))
    del svc, sl
    loop.step()
    assert h.engine.started and len(h.fake.services) == 1
    assert kernel.alive_at_sync == [False, False]


def test_a_failing_state_write_is_retried_per_interval_not_per_step():
    h = Harness()
    events: queue.Queue = queue.Queue()
    calls: list[int] = []

    def save(entries: list) -> None:
        calls.append(len(entries))
        raise OSError(28, "No space left on device")

    loop = Loop(h.engine, events, LoopConfig(persist_interval=2.0), clock=h.clock, save_queue=save)
    eps = [endpoint(f"10.0.0.{i}") for i in range(1, 6)]
    events.put(Replace(ObjectKind.SERVICE, [service("web")], 0))
    events.put(Replace(ObjectKind.ENDPOINT_SLICE, [endpoint_slice("web", eps)], 0))
    loop.step()
    key = next(iter(h.fake.services))
    for rs in list(h.fake.services[key].dests):
        h.fake.set_connections(key, rs, 1)
    for n in range(4, 0, -1):
        events.put(Upsert(ObjectKind.ENDPOINT_SLICE, endpoint_slice("web", eps[:n]), 0))
        loop.step()
    assert calls == [1]  # the first new drain tried at once; the failure holds the rest
    assert h.metrics.value("ipvsctl_state_write_errors_total") == 1
    h.clock.advance(2.0)
    loop.step()
    assert calls == [1, 4]


def test_a_sync_that_meets_an_unknown_kernel_entry_is_not_a_failure(caplog):
    # Regression: such a sync used to count its Service as failed: "sync incomplete,
    # retrying" and a doubled backoff, for a sync where nothing failed.
    from devkit.harness import rs, vs
    from ipvsctl.model import VirtualServer

    h, events, loop = make()
    events.put(Replace(ObjectKind.SERVICE, [], 0))
    events.put(Replace(ObjectKind.ENDPOINT_SLICE, [], 0))
    loop.step()
    # Another tool programs the Service's address before the Service arrives.
    h.fake.add_virtual_server(VirtualServer(vs()), True)
    h.fake.add_real_server(vs(), rs("10.9.9.9"), 1)
    events.put(Upsert(ObjectKind.SERVICE, service("web"), 0))
    events.put(Upsert(ObjectKind.ENDPOINT_SLICE, endpoint_slice("web", [endpoint("10.0.0.1")]), 0))
    caplog.set_level("DEBUG", logger="ipvsctl")
    loop.step()
    assert "sync incomplete, retrying" not in caplog.text
    assert loop._retry_delay == loop.config.retry_min
    # The same sync took the entry over and put it right (the stale real server drained),
    # and the next drain check deleted it (no connections).
    assert loop.drain_runner.step()
    assert not h.engine.dirty
    dests = h.fake.services[vs()].dests
    assert {k.address: d.weight for k, d in dests.items()} == {"10.0.0.1": 1}
    assert h.metrics.value("ipvsctl_last_sync_timestamp_seconds") == h.clock.wall()


def test_the_gc_is_off_from_the_start_until_the_first_sync_then_frozen():
    import gc

    h, events, loop = make()
    assert gc.isenabled()
    try:
        loop.pause_gc_until_started()
        assert not gc.isenabled()
        loop.step()  # nothing listed yet: still off
        assert not gc.isenabled()
        events.put(Replace(ObjectKind.SERVICE, [service("web")], 0))
        events.put(
            Replace(ObjectKind.ENDPOINT_SLICE, [endpoint_slice("web", [endpoint("10.0.0.1")])], 0)
        )
        loop.step()
        assert h.engine.started and gc.isenabled() and gc.get_freeze_count() > 0
    finally:
        gc.enable()
        gc.unfreeze()


def test_the_gc_comes_back_after_the_grace_without_a_first_sync():
    import gc

    from ipvsctl.reconcile.loop import STARTUP_GC_GRACE

    h, _, loop = make()
    try:
        loop.pause_gc_until_started()
        h.clock.advance(STARTUP_GC_GRACE - 1)
        loop.step()
        assert not gc.isenabled()
        h.clock.advance(1)
        loop.step()
        assert gc.isenabled() and not h.engine.started
    finally:
        gc.enable()


def test_a_list_ending_meanwhile_leaves_the_start_up_pause_in_force():
    """The API source pauses the GC while it decodes a list; the loop, until its first sync.
    Whichever began first, the GC comes back only when both are done."""
    import gc

    from ipvsctl.obs import gcpause

    h, events, loop = make()
    try:
        with gcpause.paused():  # a list being decoded when the daemon starts
            loop.pause_gc_until_started()
        assert not gc.isenabled()  # the list is done, the first sync is not
        events.put(Replace(ObjectKind.SERVICE, [service("web")], 0))
        events.put(Replace(ObjectKind.ENDPOINT_SLICE, [], 0))
        with gcpause.paused():  # a relist under way as the first sync ends
            loop.step()
            assert h.engine.started and not gc.isenabled()
        assert gc.isenabled()
    finally:
        gc.enable()
        gc.unfreeze()


class Raw(dict):
    """A raw object that can be watched for its release (a plain dict cannot)."""

    __slots__ = ("__weakref__",)


def test_each_raw_object_of_a_batch_is_released_once_handled():
    import weakref

    h, events, loop = make()
    h.start([service("web")], [endpoint_slice("web", [endpoint("10.0.0.1")])])
    refs = []
    for i in range(3):
        obj = Raw(endpoint_slice("web", [endpoint(f"10.0.0.{i + 2}")]))
        refs.append(weakref.ref(obj))
        events.put(Upsert(ObjectKind.ENDPOINT_SLICE, obj, 0))
    del obj
    alive_at_handle = []
    handle = h.engine.handle

    def watching(event):
        alive_at_handle.append([r() is not None for r in refs])
        handle(event)

    h.engine.handle = watching
    loop.step()
    # a batch of 5,000 updates behind a slow apply held every one of them to the end
    assert alive_at_handle == [[True, True, True], [False, True, True], [False, False, True]]
    assert "10.0.0.4" in str(h.fake.services)

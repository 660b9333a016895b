"""The table guard (CONTRACT.md "Beside another proxy"): a table another program removed
(kube-proxy's IPVS cleanup: `ipvsadm -C`, then kube-ipvs0 deleted) is put back from what
the daemon applied, draining real servers at weight 0 with their deadlines, on the
in-memory kernel. The real kernel's part is tests/lab/test_flush_lab.py."""

from __future__ import annotations

from devkit.builders import endpoint, endpoint_slice, service
from devkit.harness import Harness, rs, vs
from ipvsctl.kernel.port import KernelError
from ipvsctl.reconcile.feed import Subscriptions
from ipvsctl.reconcile.paced import run_once
from ipvsctl.reconcile.table_guard import TableGuard

A, B = "10.244.1.5", "10.244.1.6"


class Interface:
    """The dummy interface as the guard sees it: there or not, and its addresses."""

    def __init__(self) -> None:
        self.present = True
        self.addresses: set[str] = set()
        self.fail = False

    def interface_present(self) -> bool:
        return self.present

    def bind_address(self, address: str) -> None:
        if self.fail:
            raise KernelError("no", "bind_address")
        self.present = True
        self.addresses.add(address)


def flush(h: Harness) -> None:
    """`ipvsadm -C`: every virtual server gone, with its real servers."""
    for v in h.fake.list_virtual_servers():
        h.fake.delete_virtual_server(v.key, False)
    h.ops()


def started(**kw):
    h = Harness(**kw)
    web = service("web")
    h.start([web], [endpoint_slice("web", [endpoint(A), endpoint(B)])])
    h.fake.set_connections(vs(), rs(A), active=2, inactive=0)
    h.upsert(endpoint_slice("web", [endpoint(B)]))  # A drains, at weight 0
    h.ops()
    restores: list = []
    recurring: list[bool] = []
    iface = Interface()
    guard = TableGuard(
        h.kernel,
        h.engine.state,
        interface=iface,
        ready=lambda: h.engine.started,
        on_restore=restores.append,
        on_recurring=recurring.append,
        clock=h.clock.monotonic,
    )
    return h, guard, iface, restores, recurring


def test_a_whole_table_is_left_alone():
    h, guard, iface, restores, _ = started()
    for _ in range(3):
        assert run_once(guard) is None
    assert h.ops() == [] and restores == [] and iface.addresses == set()


def test_a_flushed_table_comes_back_as_applied_draining_real_servers_at_weight_0():
    h, guard, _iface, restores, _ = started()
    before = h.fake.list_virtual_servers()
    entry = h.engine.drains.queue.get(vs(), rs(A))
    flush(h)
    done = run_once(guard)
    assert done is not None and done.what == ["ipvs"]
    assert (done.virtual_servers, done.real_servers, done.failed) == (1, 2, 0)
    # (the in-memory kernel forgets the connections; the real one keeps them in its trash)
    assert h.fake.list_virtual_servers() == before
    assert h.fake.weight(vs(), rs(A)) == 0 and h.fake.weight(vs(), rs(B)) == 1
    # the drain goes on with its deadline: the queue never left the engine
    assert h.engine.drains.queue.get(vs(), rs(A)) == entry
    assert len(restores) == 1
    assert run_once(guard) is None  # whole again: nothing more


def test_the_interface_deleted_comes_back_with_every_address_a_virtual_server_binds():
    h, guard, iface, _restores, _ = started()
    iface.present = False
    flush(h)
    done = run_once(guard)
    assert done is not None and done.what == ["ipvs", "interface"]
    # the address came back with its virtual server (the in-memory kernel binds none)
    assert iface.addresses == set()


def test_a_reading_taken_while_the_engine_changed_the_table_is_dropped():
    h, guard, _iface, _restores, _ = started()
    plan = guard.snapshot()
    assert plan is not None
    flush(h)
    reading = guard.read(plan)
    assert reading.ipvs_gone
    h.upsert(service("api", cluster_ip="10.96.0.11"))  # the engine applies, elsewhere
    h.ops()
    assert guard.apply(reading) is None  # the next pass looks again
    assert run_once(guard) is not None


def test_a_restore_that_fails_is_tried_again_at_the_next_pass():
    _h, guard, iface, _restores, _ = started()
    iface.present = False
    iface.fail = True
    done = run_once(guard)
    assert done is not None and done.failed == 1 and done.what == []
    iface.fail = False
    done = run_once(guard)
    assert done is not None and done.what == ["interface"]


def test_restores_that_keep_happening_are_reported_until_quiet():
    h, guard, _iface, _restores, recurring = started()
    for _ in range(3):
        flush(h)
        run_once(guard)
        h.clock.advance(60)
    assert recurring == [True] and guard.recurring
    h.clock.advance(600)
    run_once(guard)
    assert recurring == [True, False]


def test_nothing_is_guarded_before_the_first_sync():
    h = Harness()
    guard = TableGuard(h.kernel, h.engine.state, ready=lambda: h.engine.started)
    assert guard.snapshot() is None


def test_a_flush_the_audit_sees_first_comes_back_as_the_guards_restore():
    """The audit's dump can see `ipvsadm -C` before the guard's next pass: the missing
    virtual servers are put back as applied (the draining real server at 0, its drain
    kept), heard on the feed as a restore, not forgotten and re-added with only the wanted
    real servers."""
    h, _guard, _iface, _restores, _ = started()
    heard: list = []
    h.engine.feed.subscribe(Subscriptions(table_restored=heard.append))
    before = h.fake.list_virtual_servers()
    entry = h.engine.drains.queue.get(vs(), rs(A))
    flush(h)
    assert h.audit() == 1  # one virtual server missing, counted as the audit's finding
    assert h.fake.list_virtual_servers() == before
    assert h.fake.weight(vs(), rs(A)) == 0 and h.fake.weight(vs(), rs(B)) == 1
    assert h.engine.drains.queue.get(vs(), rs(A)) == entry
    assert [(d.what, d.virtual_servers, d.real_servers) for d in heard] == [(["ipvs"], 1, 2)]
    h.ops()  # the put-back's own adds
    h.engine.sync()
    assert h.ops() == []  # the Service's next sync finds it as applied
    assert run_once(h.engine.guard) is None  # whole again: the guard has nothing to do


C = "10.244.1.7"


def _the_engine_meets_the_flush_first(change) -> None:
    """An event for the flushed Service synced before the guard's next pass: the engine
    finds its virtual server gone and puts the table back as applied (the draining real
    server at 0, its drain kept; the other Service's too, or the guard, finding its
    sentinel back, might never look), counted as one restore, then applies the change."""
    h, _guard, _iface, _restores, _ = started()
    h.upsert(service("api", cluster_ip="10.96.0.11"))
    h.upsert(endpoint_slice("api", [endpoint(C)]))
    heard: list = []
    h.engine.feed.subscribe(Subscriptions(table_restored=heard.append))
    entry = h.engine.drains.queue.get(vs(), rs(A))
    flush(h)
    change(h)
    assert h.fake.weight(vs(), rs(A)) == 0  # still draining, not forgotten
    assert h.engine.drains.queue.get(vs(), rs(A)) == entry
    assert h.fake.weight(vs("10.96.0.11"), rs(C)) == 1
    assert [(d.what, d.virtual_servers) for d in heard] == [(["ipvs"], 2)]
    h.ops()
    h.engine.sync()
    assert h.ops() == []
    assert run_once(h.engine.guard) is None  # whole again: the guard has nothing to do


def test_a_flush_an_endpoint_change_meets_first_keeps_the_drains():
    def change(h: Harness) -> None:  # B terminates, C comes
        h.upsert(endpoint_slice("web", [endpoint(C)]))
        assert h.fake.weight(vs(), rs(B)) == 0 and h.fake.weight(vs(), rs(C)) == 1
        assert h.engine.drains.queue.get(vs(), rs(B)) is not None

    _the_engine_meets_the_flush_first(change)


def test_a_flush_an_added_endpoint_meets_first_keeps_the_drains():
    def change(h: Harness) -> None:
        h.upsert(endpoint_slice("web", [endpoint(B), endpoint(C)]))
        assert h.fake.weight(vs(), rs(B)) == 1 and h.fake.weight(vs(), rs(C)) == 1

    _the_engine_meets_the_flush_first(change)


def test_a_flush_endpoints_added_together_meet_first_keeps_the_drains():
    D = "10.244.1.8"

    def change(h: Harness) -> None:  # one batch of adds
        h.upsert(endpoint_slice("web", [endpoint(B), endpoint(C), endpoint(D)]))
        assert [h.fake.weight(vs(), rs(x)) for x in (B, C, D)] == [1, 1, 1]

    _the_engine_meets_the_flush_first(change)


def test_a_flush_an_endpoint_back_meets_first_is_restored_at_weight_1():
    h, _guard, _iface, _restores, _ = started()
    heard: list = []
    h.engine.feed.subscribe(Subscriptions(table_restored=heard.append))
    flush(h)
    h.upsert(endpoint_slice("web", [endpoint(A), endpoint(B)]))  # A back: its drain ends
    assert h.fake.weight(vs(), rs(A)) == 1 and h.fake.weight(vs(), rs(B)) == 1
    assert h.engine.drains.queue.get(vs(), rs(A)) is None
    assert len(heard) == 1
    h.ops()
    h.engine.sync()
    assert h.ops() == []


def test_a_flush_a_service_change_meets_first_keeps_the_drains():
    def change(h: Harness) -> None:
        h.upsert(service("web", sessionAffinity="ClientIP"))
        (v,) = [v for v in h.fake.list_virtual_servers() if v.key == vs()]
        assert v.persistent_timeout  # the change applied on the put-back virtual server
        assert h.fake.weight(vs(), rs(B)) == 1

    _the_engine_meets_the_flush_first(change)

"""The engine's parts: every op has its function, and an unknown kernel entry is no failure."""

from __future__ import annotations

import typing

from devkit.builders import endpoint, endpoint_slice, service
from devkit.harness import Harness, rs, vs
from ipvsctl.kernel.fake import FakeKernel
from ipvsctl.model import (
    DeadlineSource,
    DrainEntry,
    DrainReason,
    ServiceRef,
    VirtualServer,
    VirtualServerKind,
)
from ipvsctl.plan.ops import (
    AddRealServer,
    AddVirtualServer,
    DeleteRealServer,
    DeleteVirtualServer,
    DeletionReason,
    DrainRealServer,
    DrainVirtualServer,
    ForgetDrain,
    Op,
    RestoreRealServer,
    RetimeDrain,
    UpdateVirtualServer,
)


def test_every_op_type_is_applied():
    """apply.py's `match` is exhaustive for mypy (assert_never); here every kind of op, at
    run time, reaches its function and the kernel."""
    h = Harness()
    h.start([], [])
    ref, key = ServiceRef("default", "web"), vs("10.96.0.99")
    a, b = rs("10.244.1.5"), rs("10.244.1.6")

    def entry(r, deadline=30.0):
        return DrainEntry(key, r, ref, DrainReason.REMOVED, 0.0, deadline, DeadlineSource.DEFAULT)

    ops = [
        AddVirtualServer(VirtualServer(key), VirtualServerKind.CLUSTER_IP, ref),
        AddRealServer(key, a),
        AddRealServer(key, b),
        UpdateVirtualServer(VirtualServer(key, "wrr")),
        DrainRealServer(entry(a)),
        RestoreRealServer(key, a),
        DrainRealServer(entry(b)),
        RetimeDrain(entry(b, 60.0)),
        ForgetDrain(key, b),
        DeleteRealServer(key, a, DeletionReason.DRAINED),
        DrainVirtualServer(key, ref),
        DeleteVirtualServer(key, True, 1),
    ]
    assert {type(op) for op in ops} == set(typing.get_args(Op))
    applied = h.engine.applier.apply(ref, ops)
    assert applied.ops == len(ops) and not applied.failed
    assert not h.engine.drains.draining_virtual_servers  # gone with its virtual server
    assert h.ops() == [
        f"add-vs {key} rr",
        f"add-rs {key} -> {a} weight 1",
        f"add-rs {key} -> {b} weight 1",
        f"set-vs {key} wrr",
        f"set-rs {key} -> {a} weight 0",
        f"set-rs {key} -> {a} weight 1",
        f"set-rs {key} -> {b} weight 0",
        f"del-rs {key} -> {a}",
        f"del-vs {key}",
    ]
    # kernel_ops counts the kernel's operations: the queue-only ops are none of them
    counted = {
        name: h.metrics.value("ipvsctl_kernel_ops_total", {"operation": name, "result": "ok"})
        for name in (t.__name__ for t in typing.get_args(Op))
    }
    assert counted["RetimeDrain"] == counted["ForgetDrain"] == 0
    assert counted["AddRealServer"] == 2 and counted["DrainRealServer"] == 2
    assert sum(counted.values()) == len(ops) - 2


def test_a_sync_meeting_an_unknown_kernel_entry_finishes_it_and_fails_nothing():
    h = Harness()
    h.start([], [])
    h.fake.add_virtual_server(VirtualServer(vs()), True)  # another tool was there first
    h.fake.add_real_server(vs(), rs("10.9.9.9"), 1)
    h.upsert(endpoint_slice("web", [endpoint("10.0.0.1")]), sync=False)
    h.upsert(service("web"), sync=False)
    result = h.engine.sync()
    assert result.failed == set() and result.resync == set() and not h.engine.dirty
    # Taken over in place: the stranger's real server drains like any removed endpoint.
    dests = h.fake.services[vs()].dests
    assert {k.address: d.weight for k, d in dests.items()} == {"10.0.0.1": 1, "10.9.9.9": 0}
    assert (vs(), rs("10.9.9.9")) in h.engine.drains.queue


class LateKernel(FakeKernel):
    """Another tool adds the Service's virtual server between the start-up dump and the
    first diff: the dump does not show it."""

    def list_virtual_servers(self):
        shown = super().list_virtual_servers()
        if not getattr(self, "added", False):
            self.added = True
            self.add_virtual_server(VirtualServer(vs()), True)
            self.add_real_server(vs(), rs("10.9.9.9"), 1)
        return shown


def test_the_first_sync_too_finishes_what_an_unknown_kernel_entry_left():
    h = Harness(kernel=LateKernel())
    result = _start(h)
    assert result.failed == set() and result.resync == set() and not h.engine.dirty
    dests = h.fake.services[vs()].dests
    assert {k.address: d.weight for k, d in dests.items()} == {"10.0.0.1": 1, "10.9.9.9": 0}


def _start(h: Harness):
    from ipvsctl.source.events import ObjectKind, Replace

    h.engine.handle(Replace(ObjectKind.SERVICE, [service("web")], 0))
    h.engine.handle(
        Replace(ObjectKind.ENDPOINT_SLICE, [endpoint_slice("web", [endpoint("10.0.0.1")])], 0)
    )
    return h.engine.sync()


class CountingKernel(FakeKernel):
    """Counts batched add calls; fails the adds of `failing` (a transient kernel error)."""

    def __init__(self, failing: frozenset = frozenset()) -> None:
        super().__init__()
        self.failing = failing
        self.batches: list[int] = []

    def add_real_server(self, key, r, weight):
        if r in self.failing:
            from ipvsctl.kernel.port import KernelTransient

            raise KernelTransient("injected", "add_real_server")
        super().add_real_server(key, r, weight)

    def add_real_servers(self, key, real_servers, weight):
        self.batches.append(len(real_servers))
        return super().add_real_servers(key, real_servers, weight)


def test_a_services_new_real_servers_go_to_the_kernel_as_one_batch():
    k = CountingKernel()
    h = Harness(kernel=k)
    h.start([service("web")], [endpoint_slice("web", [endpoint(f"10.0.0.{i}") for i in (1, 2, 3)])])
    assert k.batches == [3]
    assert sorted(h.fake.services[vs()].dests) == [rs(f"10.0.0.{i}") for i in (1, 2, 3)]
    assert (
        h.metrics.value("ipvsctl_kernel_ops_total", {"operation": "AddRealServer", "result": "ok"})
        == 3
    )
    h.upsert(endpoint_slice("web", [endpoint(f"10.0.0.{i}") for i in (1, 2, 3, 4)]))
    assert k.batches == [3]  # one add alone: no batch
    assert rs("10.0.0.4") in h.fake.services[vs()].dests


def test_a_failed_add_in_a_batch_fails_the_service_and_the_others_are_recorded():
    """Every add of a batch is tried: the ones after a failure are in the kernel, so the
    applied state has them too (it says what the kernel holds), the failed one is not, and
    the Service stays dirty for the retry, which adds only the one that failed."""
    bad = rs("10.0.0.2")
    k = CountingKernel(failing=frozenset({bad}))
    h = Harness(kernel=k)
    ref, key = ServiceRef("default", "web"), vs("10.96.0.99")
    ops: list[Op] = [
        AddVirtualServer(VirtualServer(key), VirtualServerKind.CLUSTER_IP, ref),
        AddRealServer(key, rs("10.0.0.1")),
        AddRealServer(key, bad),
        AddRealServer(key, rs("10.0.0.3")),
    ]
    applied = h.engine.applier.apply(ref, ops)
    assert applied.failed and applied.ops == 3
    assert sorted(k.services[key].dests) == [rs("10.0.0.1"), rs("10.0.0.3")]
    state = h.engine.state.get(ref, key)
    assert state is not None and state.weights == {rs("10.0.0.1"): 1, rs("10.0.0.3"): 1}
    labels = {"operation": "AddRealServer", "result": "error"}
    assert h.metrics.value("ipvsctl_kernel_ops_total", labels) == 1
    k.failing = frozenset()
    assert not h.engine.applier.apply(ref, [AddRealServer(key, bad)]).failed
    assert sorted(k.services[key].dests) == [rs(f"10.0.0.{i}") for i in (1, 2, 3)]


def test_an_add_in_a_batch_that_finds_its_real_server_takes_it_over_at_weight_1():
    k = CountingKernel()
    h = Harness(kernel=k)
    ref, key = ServiceRef("default", "web"), vs("10.96.0.99")
    k.add_virtual_server(VirtualServer(key), True)
    k.add_real_server(key, rs("10.0.0.2"), 0)  # left at weight 0 by an earlier run
    h.engine.state.add(ref, VirtualServer(key), True, {})
    applied = h.engine.applier.apply(
        ref, [AddRealServer(key, rs("10.0.0.1")), AddRealServer(key, rs("10.0.0.2"))]
    )
    assert applied.ops == 2 and not applied.failed and k.batches == [2]
    assert {r: d.weight for r, d in k.services[key].dests.items()} == {
        rs("10.0.0.1"): 1,
        rs("10.0.0.2"): 1,
    }


def test_what_a_service_needs_after_its_ops() -> None:
    from ipvsctl.reconcile.apply import Then

    bad = rs("10.0.0.2")
    h = Harness(kernel=CountingKernel(failing=frozenset({bad})))
    h.start([], [])
    ref, key, left = ServiceRef("default", "web"), vs(), vs("10.96.0.11")
    a = h.engine.applier
    add = AddVirtualServer(VirtualServer(key), VirtualServerKind.CLUSTER_IP, ref)
    assert a.apply(ref, [add, AddRealServer(key, rs("10.0.0.1"))]).then is Then.DONE
    h.fake.add_virtual_server(VirtualServer(left), True)  # left by an earlier run
    h.fake.add_real_server(left, rs("10.9.9.9"), 1)
    found = a.apply(ref, [AddVirtualServer(VirtualServer(left), VirtualServerKind.CLUSTER_IP, ref)])
    assert found.then is Then.DIFF_AGAIN and not found.failed  # its real server now known
    failed = a.apply(ref, [AddRealServer(key, bad)])
    assert failed.then is Then.RETRY and failed.failed

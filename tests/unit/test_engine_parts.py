"""The engine's parts (issue 12): every op has its function, and a surprise is no failure."""

from __future__ import annotations

import typing

from devkit.builders import endpoint, endpoint_slice, service
from devkit.harness import Harness, rs, vs
from ipvsctl.kernel.fake import FakeKernel
from ipvsctl.model import VirtualServer
from ipvsctl.plan.ops import Op
from ipvsctl.reconcile.apply import _HANDLERS


def test_every_op_type_has_exactly_one_function():
    assert set(_HANDLERS) == set(typing.get_args(Op))


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
    assert (vs(), rs("10.9.9.9")) in h.engine.queue


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


def test_the_first_sync_too_finishes_what_a_kernel_surprise_left():
    h = Harness(kernel=LateKernel())
    result = _start(h)
    assert result.failed == set() and result.resync == set() and not h.engine.dirty
    dests = h.fake.services[vs()].dests
    assert {k.address: d.weight for k, d in dests.items()} == {"10.0.0.1": 1, "10.9.9.9": 0}


def _start(h: Harness):
    from ipvsctl.source.events import ObjectKind, Replace

    h.engine.handle(Replace(ObjectKind.SERVICE, [service("web")], 0))
    h.engine.handle(Replace(ObjectKind.ENDPOINT_SLICE,
                            [endpoint_slice("web", [endpoint("10.0.0.1")])], 0))
    return h.engine.sync()

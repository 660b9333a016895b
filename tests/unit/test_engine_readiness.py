"""Regression the real-kernel lab (tests/lab) found, pinned down on the host: /readyz said
ready before the first sync had reached the kernel."""

from __future__ import annotations

from typing import Any

from devkit.builders import endpoint, endpoint_slice, service
from devkit.harness import Harness
from ipvsctl.daemon.status_json import quiesced_json
from ipvsctl.kernel.fake import FakeKernel
from ipvsctl.model import VirtualServer


# --- /readyz said ready before the first sync had reached the kernel -------------------------
class ReadinessSpy(FakeKernel):
    """Records, at each virtual server the engine adds, whether it already claims to be
    started (read without the loop's lock, as /readyz does)."""

    def __init__(self) -> None:
        super().__init__()
        self.engine: Any = None
        self.started_when_adding: list[bool] = []

    def add_virtual_server(self, vs: VirtualServer, bind_address: bool) -> None:
        self.started_when_adding.append(self.engine.started)
        super().add_virtual_server(vs, bind_address)


def test_engine_is_started_only_once_the_first_sync_is_in_the_kernel() -> None:
    # The lab's daemon tests waited for `started` and then found no virtual server yet
    # (ENETUNREACH): it was set before the initial sync applied its operations.
    kernel = ReadinessSpy()
    h = Harness(kernel=kernel)
    kernel.engine = h.engine
    h.start(
        [service("web"), service("db", cluster_ip="10.96.0.11")],
        [endpoint_slice("web", [endpoint("10.244.1.5")])],
    )
    assert kernel.started_when_adding == [False, False]
    assert h.engine.started
    assert quiesced_json(h.view, "10.244.1.5")["ready"]

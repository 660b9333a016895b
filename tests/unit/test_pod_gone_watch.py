"""A `pod_gone` grace counts only while the EndpointSlices are watched (CONTRACT.md
"Draining", rule 3): against the fake API server (the real client, a real broken watch), a
slice re-pack whose second half comes after the watch broke and came back never cuts the
endpoint's connections."""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from collections.abc import Iterator

import pytest

from devkit.builders import endpoint, endpoint_slice, service, terminating
from devkit.fakeapi.server import FakeAPIServer
from devkit.harness import rs, vs
from ipvsctl.kernel.fake import FakeKernel
from ipvsctl.kube.client import KubeSource
from ipvsctl.model import DeadlineSource
from ipvsctl.source.events import ObjectKind
from tests.unit.test_daemon import wait_for
from tests.unit.test_daemon_api import start_daemon
from tests.unit.test_kube_source import FAST, WAIT

A, B = "10.244.1.5", "10.244.1.6"
EPS = ObjectKind.ENDPOINT_SLICE
GRACE = 2.0  # the daemon's pod_gone grace here (5 s in the daemon)


@pytest.fixture
def api() -> Iterator[FakeAPIServer]:
    with FakeAPIServer() as server:
        server.add(service("web"))
        server.add(
            endpoint_slice(
                "web", [endpoint(A, pod="web-1", uid="u1"), endpoint(B, pod="web-2")], name="web-a"
            )
        )
        yield server


def test_the_source_says_when_each_watch_is_open_and_when_it_broke(api: FakeAPIServer) -> None:
    told: queue.Queue[tuple[ObjectKind, bool]] = queue.Queue()
    source = KubeSource.from_config(None, api.url, environ={}, settings=FAST)
    source.watch_listeners.append(lambda kind, watching: told.put((kind, watching)))
    stop = threading.Event()
    thread = threading.Thread(target=source.run, args=(lambda e: None, stop), daemon=True)
    thread.start()

    def next_of(kind: ObjectKind) -> bool:
        while True:
            k, watching = told.get(timeout=WAIT)
            if k is kind:
                return watching

    try:
        assert [next_of(EPS), next_of(EPS)] == [False, True]  # not until the first watch
        assert api.wait_for(lambda: api.open_watches("EndpointSlice") == 1, WAIT)
        api.reset_watches("EndpointSlice")  # broken mid-stream: resumed
        assert [next_of(EPS), next_of(EPS)] == [False, True]
        assert api.wait_for(lambda: api.open_watches("EndpointSlice") == 1, WAIT)
        api.expire_watches("EndpointSlice")  # 410: relisted, then watched again
        assert [next_of(EPS), next_of(EPS)] == [False, True]
    finally:
        stop.set()
        thread.join(WAIT)


def _drain_pod_gone(api: FakeAPIServer, tmp_path, kernel: FakeKernel):
    """A daemon whose web-1 (A, with an open connection) is terminating and has just left
    every slice: the first half of a re-pack (or its pod gone)."""
    d = start_daemon(api, tmp_path, kernel)
    with d.loop.lock:
        d.engine.config = dataclasses.replace(d.engine.config, pod_gone_grace=GRACE)
        kernel.set_connections(vs(), rs(A), active=2)
    api.update(
        endpoint_slice(
            "web",
            [terminating(A, pod="web-1", uid="u1"), endpoint(B, pod="web-2")],
            name="web-a",
        )
    )
    wait_for(lambda: kernel.weight(vs(), rs(A)) == 0)
    api.update(endpoint_slice("web", [endpoint(B, pod="web-2")], name="web-a"))

    def pod_gone() -> bool:
        with d.loop.lock:
            e = d.engine.drains.queue.get(vs(), rs(A))
        return e is not None and e.deadline_source is DeadlineSource.POD_GONE

    wait_for(pod_gone)
    return d


def test_a_repack_second_half_after_a_broken_watch_keeps_the_real_server(
    api: FakeAPIServer, tmp_path
) -> None:
    kernel = FakeKernel()
    d = _drain_pod_gone(api, tmp_path, kernel)
    try:
        api.down()  # the watch broken before the second half
        api.add(endpoint_slice("web", [terminating(A, pod="web-1", uid="u1")], name="web-b"))
        # The grace and more with the API away: the drain check runs every 0.05 s.
        time.sleep(1.5 * GRACE)
        assert kernel.weight(vs(), rs(A)) == 0
        api.up()

        def listed_again() -> bool:
            with d.loop.lock:
                e = d.engine.drains.queue.get(vs(), rs(A))
            return e is not None and e.deadline_source is DeadlineSource.POD

        wait_for(listed_again)
        assert kernel.weight(vs(), rs(A)) == 0
        deleted = d.metrics.value("ipvsctl_real_server_deletions_total", {"reason": "pod_gone"})
        assert deleted == 0
    finally:
        d.shutdown()


def test_with_no_second_half_the_real_server_goes_a_grace_after_the_watch_is_back(
    api: FakeAPIServer, tmp_path
) -> None:
    kernel = FakeKernel()
    d = _drain_pod_gone(api, tmp_path, kernel)
    try:
        api.down()
        time.sleep(1.5 * GRACE)
        assert kernel.weight(vs(), rs(A)) == 0
        api.up()
        wait_for(lambda: kernel.weight(vs(), rs(A)) is None)
        deleted = d.metrics.value("ipvsctl_real_server_deletions_total", {"reason": "pod_gone"})
        assert deleted == 1
    finally:
        d.shutdown()

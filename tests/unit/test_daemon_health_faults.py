"""Honest health (issue 16.4): a sync that dies at start-up is never ready, and a dead
thread inside the source shows on /healthz."""

from __future__ import annotations

from pathlib import Path

import pytest

from ipvsctl.kernel.fake import FakeKernel
from tests.unit.test_daemon import folder, get, make, wait_for  # noqa: F401 (fixture)


class CrashingKernel(FakeKernel):
    """A bug below the engine's error handling (as struct.error was): not a KernelError."""

    def add_virtual_server(self, *args, **kwargs):
        raise RuntimeError("unexpected")


@pytest.mark.usefixtures("folder")
def test_an_initial_sync_that_dies_is_not_ready_and_not_healthy(tmp_path: Path) -> None:
    d = make(tmp_path, CrashingKernel())
    try:
        d.start()
        base = f"http://127.0.0.1:{d.http.port}"
        wait_for(lambda: get(base + "/healthz")[0] == 503)
        assert "loop" in get(base + "/healthz")[1]
        assert not d.engine.started
        assert get(base + "/readyz")[0] == 503
    finally:
        d.shutdown()


@pytest.mark.usefixtures("folder")
def test_a_dead_source_thread_is_unhealthy(tmp_path: Path) -> None:
    d = make(tmp_path, FakeKernel())
    dead: list[str] = []
    d.source.dead_threads = lambda: list(dead)  # type: ignore[attr-defined]
    try:
        d.start()
        base = f"http://127.0.0.1:{d.http.port}"
        wait_for(lambda: get(base + "/readyz")[0] == 200)
        assert get(base + "/healthz")[0] == 200
        dead.append("ipvsctl-kube-services")
        status, body = get(base + "/healthz")
        assert status == 503 and "ipvsctl-kube-services" in body
    finally:
        d.shutdown()

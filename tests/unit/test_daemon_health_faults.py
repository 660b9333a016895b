"""Honest health: a sync that dies at start-up is never ready, and a dead
thread inside the source shows on /healthz."""

from __future__ import annotations

import threading
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


@pytest.mark.usefixtures("folder")
def test_a_dead_audit_reader_is_unhealthy(tmp_path: Path) -> None:
    """The audit reader is a thread of its own: /healthz must see it die (it had been left
    out of the daemon's threads)."""
    d = make(tmp_path, FakeKernel())
    try:
        d.start()
        base = f"http://127.0.0.1:{d.http.port}"
        wait_for(lambda: get(base + "/readyz")[0] == 200)
        assert get(base + "/healthz")[0] == 200
        finished = threading.Thread(target=lambda: None, name="audit-reader")
        finished.start()
        finished.join()
        d.threads = [finished if t.name == "audit-reader" else t for t in d.threads]
        status, body = get(base + "/healthz")
        assert status == 503 and "audit-reader" in body
    finally:
        d.shutdown()


@pytest.mark.usefixtures("folder")
def test_manifests_mode_survives_hostile_files(tmp_path: Path) -> None:
    """Regression: ten shapes killed the loop or source thread in --manifests mode."""
    from devkit.builders import endpoint, endpoint_slice, service
    from devkit.harness import rs, vs
    from ipvsctl.manifests import ManifestSource
    from tests.unit.test_daemon import write
    from tests.unit.test_hostile_manifests import HOSTILE

    kernel = FakeKernel()
    d = make(tmp_path, kernel)
    m = tmp_path / "m"
    files = d.metrics.invalid_objects.labels("ManifestFile")
    d.source = ManifestSource(m, interval=0.05, on_file_error=files.inc)
    try:
        d.start()
        base = f"http://127.0.0.1:{d.http.port}"
        wait_for(lambda: get(base + "/readyz")[0] == 200)
        for name, obj in HOSTILE.items():
            write(m, f"bad-{name}.yaml", obj)
        (m / "deep.yaml").write_text("[" * 100_000 + "]" * 100_000)
        (m / "bomb.yaml").write_text(
            "".join(
                f"l{i}: &l{i} [{','.join([f'*l{i - 1}' if i else 'x'] * 9)}]\n" for i in range(10)
            )
        )
        (m / "items.json").write_text('{"kind": "List", "items": 5}')
        # a change after them all still reaches the kernel: both threads are alive
        write(
            m,
            "web2.yaml",
            service("web2", cluster_ip="10.96.0.11"),
            endpoint_slice("web2", [endpoint("10.244.1.7")]),
        )
        wait_for(lambda: kernel.weight(vs("10.96.0.11"), rs("10.244.1.7")) == 1)
        assert get(base + "/healthz")[0] == 200
        assert all(t.is_alive() for t in d.threads)
        assert d.metrics.value("ipvsctl_invalid_objects_total", {"kind": "Service"}) >= 1
        assert d.metrics.value("ipvsctl_invalid_objects_total", {"kind": "ManifestFile"}) == 3
    finally:
        d.shutdown()

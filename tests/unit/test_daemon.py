"""The daemon in-process: manifests folder as the source, the in-memory kernel, real HTTP."""

from __future__ import annotations

import contextlib
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from devkit.builders import endpoint, endpoint_slice, service
from devkit.harness import rs, vs
from ipvsctl.daemon.adapters import StartupError
from ipvsctl.daemon.options import DaemonOptions, DrainOptions, HTTPOptions, SourceOptions
from ipvsctl.daemon.wiring import Daemon
from ipvsctl.kernel.fake import FakeKernel
from ipvsctl.manifests import ManifestSource
from ipvsctl.model import DrainEntry, NodeContext
from ipvsctl.persist.drain_state import FILE_NAME
from ipvsctl.reconcile.loop import LoopConfig
from ipvsctl.reconcile.paced import run_once
from ipvsctl.source.events import ObjectKind, Upsert

A, B = "10.244.1.5", "10.244.1.6"


def wait_for(pred: Callable[[], object], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def write(folder: Path, name: str, *objs: dict) -> None:
    tmp = folder / f".{name}.tmp"
    tmp.write_text(yaml.safe_dump_all(objs))
    tmp.rename(folder / name)  # atomic: the poller never reads half a file


def make(tmp_path: Path, kernel: FakeKernel, drain_timeout: float = 30.0) -> Daemon:
    opts = DaemonOptions(
        node=NodeContext("node-a", ("192.0.2.10",)),
        source=SourceOptions(manifests=str(tmp_path / "m")),
        drain=DrainOptions(
            state_dir=str(tmp_path / "state"), timeout=drain_timeout, check_interval=0.05
        ),
        http=HTTPOptions(listen="127.0.0.1:0"),
    )
    d = Daemon(
        opts,
        kernel,
        ManifestSource(tmp_path / "m", interval=0.05),
        loop_config=LoopConfig(drain_check_interval=0.05, idle_wakeup=0.05),
    )
    return d


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "m").mkdir()
    write(
        tmp_path / "m",
        "web.yaml",
        service("web"),
        endpoint_slice("web", [endpoint(A, pod="web-1"), endpoint(B, pod="web-2")]),
    )
    return tmp_path / "m"


def test_daemon_programs_follows_drains_and_leaves_the_table_on_exit(tmp_path, folder):
    kernel = FakeKernel()
    d = make(tmp_path, kernel)
    base = None
    try:
        d.start()
        base = f"http://127.0.0.1:{d.http.port}"
        wait_for(lambda: get(base + "/readyz")[0] == 200)
        assert get(base + "/healthz")[0] == 200
        assert kernel.weight(vs(), rs(A)) == 1 and kernel.weight(vs(), rs(B)) == 1

        with d.loop.lock:
            kernel.set_connections(vs(), rs(A), active=1)
        write(folder, "web.yaml", service("web"), endpoint_slice("web", [endpoint(B)]))
        wait_for(lambda: kernel.weight(vs(), rs(A)) == 0)

        status = json.loads(get(base + "/status")[1])
        (q,) = status["drain_queue"]
        assert (q["address"], q["reason"], q["pod"]) == (A, "removed", "default/web-1")
        metrics = get(base + "/metrics")[1]
        assert "ipvsctl_drain_queue_length 1.0" in metrics
        assert 'ipvsctl_real_servers{state="draining"} 1.0' in metrics
        assert "ipvsctl_event_to_kernel_seconds_count" in metrics

        with d.loop.lock:
            kernel.set_connections(vs(), rs(A), active=0)
        wait_for(lambda: kernel.weight(vs(), rs(A)) is None)
        assert (
            'ipvsctl_real_server_deletions_total{reason="drained"} 1.0' in get(base + "/metrics")[1]
        )
    finally:
        before = kernel.dump()
        d.shutdown()
    assert kernel.dump() == before != ""  # never flushed on exit


def drained_then_stopped(
    tmp_path: Path, folder: Path, kernel: FakeKernel, drain_timeout: float = 30.0
) -> DrainEntry:
    """A daemon that drains A (with a connection open) and is stopped mid-drain."""
    d = make(tmp_path, kernel, drain_timeout=drain_timeout)
    d.start()
    wait_for(lambda: d.engine.started)
    with d.loop.lock:
        kernel.set_connections(vs(), rs(A), active=1)
    write(folder, "web.yaml", service("web"), endpoint_slice("web", [endpoint(B)]))
    wait_for(lambda: len(d.engine.drains.queue) == 1)
    (entry,) = list(d.engine.drains.queue)
    d.shutdown()
    return entry


def test_restart_mid_drain_keeps_weight_0_and_the_deadline(tmp_path, folder):
    kernel = FakeKernel()
    entry = drained_then_stopped(tmp_path, folder, kernel, drain_timeout=600)
    saved = json.loads((tmp_path / "state" / FILE_NAME).read_text())
    assert saved["entries"][0]["deadline"] == entry.deadline

    kernel.take_ops()
    d2 = make(tmp_path, kernel, drain_timeout=5)  # a shorter default must not apply
    try:
        d2.start()
        wait_for(lambda: d2.engine.started)
        assert list(d2.engine.drains.queue) == [entry]
        assert kernel.weight(vs(), rs(A)) == 0
        assert not [op for op in kernel.take_ops() if "10.244.1.5" in op]
    finally:
        d2.shutdown()


def test_corrupt_state_file_is_set_aside_and_the_queue_rebuilt(tmp_path, folder):
    kernel = FakeKernel()
    drained_then_stopped(tmp_path, folder, kernel)
    (tmp_path / "state" / FILE_NAME).write_text("{not json")
    d2 = make(tmp_path, kernel)
    try:
        d2.start()
        wait_for(lambda: d2.engine.started)
        (e,) = list(d2.engine.drains.queue)
        assert (e.rs, e.reason.value) == (rs(A), "adopted")
        assert list((tmp_path / "state").glob(f"{FILE_NAME}.corrupt-*"))
        assert d2.metrics.value("ipvsctl_state_load_errors_total") == 1
    finally:
        d2.shutdown()


def test_an_unreadable_state_entry_is_set_aside_alone_and_counted(tmp_path, folder):
    kernel = FakeKernel()
    entry = drained_then_stopped(tmp_path, folder, kernel, drain_timeout=600)
    path = tmp_path / "state" / FILE_NAME
    doc = json.loads(path.read_text())
    doc["entries"].append({**doc["entries"][0], "address": "not an address"})
    path.write_text(json.dumps(doc))
    d2 = make(tmp_path, kernel)
    try:
        d2.start()
        wait_for(lambda: d2.engine.started)
        assert list(d2.engine.drains.queue) == [entry]  # the good one kept its deadline
        assert d2.metrics.value("ipvsctl_state_entries_set_aside_total") == 1
        assert d2.metrics.value("ipvsctl_state_load_errors_total") == 0
    finally:
        d2.shutdown()


@contextlib.contextmanager
def running(tmp_path: Path) -> Iterator[tuple[Daemon, FakeKernel]]:
    """A daemon over the in-memory kernel, its first sync done; shut down after."""
    kernel = FakeKernel()
    d = make(tmp_path, kernel)
    try:
        d.start()
        wait_for(lambda: d.engine.started)
        yield d, kernel
    finally:
        d.shutdown()


def weights(kernel: FakeKernel) -> dict:
    return {r.key: r.weight for r in kernel.list_real_servers(vs())}


def flush(kernel: FakeKernel) -> None:
    """`ipvsadm -C`."""
    for v in kernel.list_virtual_servers():
        kernel.delete_virtual_server(v.key, False)


def test_a_table_flushed_under_the_daemon_comes_back_and_is_counted(tmp_path, folder):
    with running(tmp_path) as (d, kernel):
        before, weighted = kernel.list_virtual_servers(), weights(kernel)
        flush(kernel)
        wait_for(lambda: d.metrics.value("ipvsctl_table_restores_total", {"what": "ipvs"}) == 1)
        assert kernel.list_virtual_servers() == before
        assert weights(kernel) == weighted


def test_a_flush_the_audit_finds_first_is_restored_and_counted_as_the_guards(tmp_path, folder):
    with running(tmp_path) as (d, kernel):
        before, weighted = kernel.list_virtual_servers(), weights(kernel)
        with d.loop.lock:  # neither the guard's thread nor the audit's runs meanwhile
            flush(kernel)
            found = 0
            for _ in range(10):  # to the audit's next round start (its dump)
                findings = run_once(d.engine.audit)
                found = findings.found if findings is not None else 0
                if found:
                    break
            assert found == len(before)
            assert d.metrics.value("ipvsctl_table_restores_total", {"what": "ipvs"}) == 1
            assert kernel.list_virtual_servers() == before
            assert weights(kernel) == weighted
        assert run_once(d.engine.guard, d.loop.lock) is None  # nothing left to put back


def test_a_flush_a_change_meets_first_is_restored_and_counted_as_the_guards(tmp_path, folder):
    with running(tmp_path) as (d, kernel):
        with d.loop.lock:  # neither the guard's thread nor the audit's runs meanwhile
            flush(kernel)
            # B terminates: the drain meets the flushed virtual server first
            d.engine.handle(
                Upsert(
                    ObjectKind.ENDPOINT_SLICE,
                    endpoint_slice("web", [endpoint(A, pod="web-1")]),
                    time.monotonic(),
                )
            )
            d.engine.sync()
            assert d.metrics.value("ipvsctl_table_restores_total", {"what": "ipvs"}) == 1
            assert weights(kernel) == {rs(A): 1, rs(B): 0}
            assert d.engine.drains.queue.get(vs(), rs(B)) is not None
        assert run_once(d.engine.guard, d.loop.lock) is None  # nothing left to put back


def test_readyz_waits_for_the_first_full_list(tmp_path):
    (tmp_path / "m").mkdir()

    class Silent(ManifestSource):
        def run(self, sink, stop):  # never lists
            stop.wait()

    opts = DaemonOptions(
        node=NodeContext("n"),
        source=SourceOptions(manifests=str(tmp_path / "m")),
        drain=DrainOptions(state_dir=str(tmp_path / "s")),
        http=HTTPOptions(listen="127.0.0.1:0"),
    )
    d = Daemon(opts, FakeKernel(), Silent(tmp_path / "m"))
    try:
        d.start()
        base = f"http://127.0.0.1:{d.http.port}"
        assert get(base + "/readyz")[0] == 503
        assert get(base + "/healthz")[0] == 200
        # the alert's gauge says what /readyz says (IpvsctlNotReady)
        assert "\nipvsctl_ready 0.0\n" in get(base + "/metrics")[1]
    finally:
        d.shutdown()


def test_the_ready_gauge_follows_readyz(tmp_path, folder):
    d = make(tmp_path, FakeKernel())
    try:
        d.start()
        base = f"http://127.0.0.1:{d.http.port}"
        wait_for(lambda: get(base + "/readyz")[0] == 200)
        assert "\nipvsctl_ready 1.0\n" in get(base + "/metrics")[1]
    finally:
        d.shutdown()


def test_unwritable_state_dir_is_a_startup_error(tmp_path):
    (tmp_path / "file").write_text("")
    opts = DaemonOptions(
        node=NodeContext("n"),
        drain=DrainOptions(state_dir=str(tmp_path / "file" / "sub")),
        http=HTTPOptions(listen="127.0.0.1:0"),
    )
    (tmp_path / "m").mkdir()
    with pytest.raises(StartupError, match="--state-dir"):
        Daemon(opts, FakeKernel(), ManifestSource(tmp_path / "m"))


def test_the_daemon_takes_its_loop_configuration(tmp_path):
    # Tests used to rewrite d.loop.config after construction, too late for what
    # the loop derives from it when built (its first audit time, its retry delay).
    opts = DaemonOptions(
        node=NodeContext("node-a", ("192.0.2.10",)),
        source=SourceOptions(manifests=str(tmp_path / "m")),
        drain=DrainOptions(state_dir=str(tmp_path / "state"), check_interval=0.25),
        http=HTTPOptions(listen="127.0.0.1:0"),
    )
    (tmp_path / "m").mkdir()
    source = ManifestSource(tmp_path / "m", interval=0.05)
    cfg = LoopConfig(audit_interval=7.0, retry_min=0.125)
    d = Daemon(opts, FakeKernel(), source, loop_config=cfg)
    try:
        assert d.loop.config is cfg
        assert d.loop._retry_delay == 0.125
        assert d.loop.audit_runner.not_before - d.loop.heartbeat == pytest.approx(7.0, abs=0.5)
    finally:
        d.http.stop()
    d = Daemon(opts, FakeKernel(), source)  # without: the defaults, the options' interval
    try:
        assert d.loop.config == LoopConfig(drain_check_interval=0.25)
    finally:
        d.http.stop()


def test_the_stop_line_counts_in_integers(tmp_path, folder, caplog):
    import logging

    from ipvsctl.obs.logging import JSONFormatter

    d = make(tmp_path, FakeKernel())
    d.start()
    wait_for(lambda: d.view.started)
    with caplog.at_level(logging.INFO, logger="ipvsctl"):
        d.shutdown()
    (rec,) = [r for r in caplog.records if r.getMessage().startswith("stopped;")]
    doc = json.loads(JSONFormatter().format(rec))
    assert doc["virtual_servers"] == 1 and isinstance(doc["virtual_servers"], int)
    assert '"virtual_servers": 1,' in JSONFormatter().format(rec)

"""The shutdown-manager records its barrier's outcome as one Event on its pod (CONTRACT.md,
the shutdown-manager's last paragraph), against the fake API server with the real client:
`Quiesced` (nodes asked, how long), `QuiesceTimeout` (which nodes still sent, established
connections at the end), and a 403 said once in its log."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from devkit.fakeapi import FakeAPIServer
from ipvsctl.cli.shutdown_manager import ManagerOptions, ShutdownManager
from ipvsctl.daemon.shutdown_manager import open_events
from ipvsctl.kube.config import load_configuration, new_api_client
from ipvsctl.kube.events import EventWriter
from ipvsctl.model import PodRef
from ipvsctl.shutdown.barrier import BarrierConfig

from .test_shutdown_manager_e2e import POD, Caller, FakeDaemon, write_proc

ME = PodRef("shop", "web-7c9d-x2k4p", "6f1c2a9e-0000-4000-8000-000000000001")


@pytest.fixture
def api() -> Iterator[FakeAPIServer]:
    with FakeAPIServer() as server:
        yield server
    assert {(r.verb, r.resource) for r in server.requests} <= {
        ("create", "events"),
        ("patch", "events"),
    }


@pytest.fixture
def daemons() -> Iterator[list[FakeDaemon]]:
    ds = [FakeDaemon("node-a"), FakeDaemon("node-b")]
    yield ds
    for d in ds:
        d.http.stop()


def run_barrier(
    tmp_path: Path,
    api: FakeAPIServer,
    daemons: list[FakeDaemon],
    writer: object = None,
    **barrier: object,
) -> tuple[int, dict]:
    write_proc(tmp_path, connections=2)
    cfg = {"check_interval": 0.02, "timeout": 30.0, **barrier}
    writer = writer or EventWriter(
        new_api_client(load_configuration(None, api.url, environ={})),
        instance=f"shutdown-manager-{ME.name}",
    )
    m = ShutdownManager(
        ManagerOptions(
            pod_ips=(POD,),
            listen="127.0.0.1:0",
            daemons=tuple(d.url for d in daemons),
            proc_net=str(tmp_path),
            barrier=BarrierConfig(**cfg),  # type: ignore[arg-type]
            pod=ME,
        ),
        events=writer,  # type: ignore[arg-type]
    )
    m.start()
    try:
        caller = Caller(f"http://127.0.0.1:{m.port}")
        caller.start()
        caller.join(30)
        assert caller.answer is not None
    finally:
        m.finish()  # SIGTERM: the Event is written before the process ends
    return caller.answer


def test_quiesced_is_one_event_on_the_pod(tmp_path, api, daemons) -> None:
    for d in daemons:
        d.set(quiesced=True)
    code, doc = run_barrier(tmp_path, api, daemons, wait_connections=False)
    assert code == 200 and doc["outcome"] == "quiesced"
    (ev,) = api.objects("Event")
    assert (ev["reason"], ev["type"]) == ("Quiesced", "Normal")
    assert ev["regarding"] == {
        "kind": "Pod",
        "apiVersion": "v1",
        "namespace": "shop",
        "name": ME.name,
        "uid": ME.uid,
    }
    assert ev["note"].startswith("2 nodes quiesced in ")
    assert ev["reportingInstance"] == f"shutdown-manager-{ME.name}"


class SlowRecorder:
    """An Event writer whose `record` takes a while (a busy process): nothing is pending
    until it returns."""

    def __init__(self) -> None:
        self.items: list[object] = []

    def record(self, item: object) -> bool:
        time.sleep(0.3)
        self.items.append(item)
        return True

    def flush(self, timeout: float) -> bool:
        return True  # nothing pending once record() returned

    def run(self, stop: threading.Event) -> None:
        stop.wait()


def test_the_outcome_is_queued_before_any_caller_is_answered(tmp_path, api, daemons) -> None:
    """Regression (merge-run flake): the barrier woke its parked callers before it queued
    the outcome's Event, so a SIGTERM right after the preStop's answer found nothing
    pending and the Event was lost."""
    for d in daemons:
        d.set(quiesced=True)
    slow = SlowRecorder()
    code, doc = run_barrier(tmp_path, api, daemons, writer=slow, wait_connections=False)
    assert code == 200 and doc["outcome"] == "quiesced"
    assert len(slow.items) == 1  # queued before the answer, so before finish()


def test_timeout_says_which_nodes_still_send(tmp_path, api, daemons) -> None:
    daemons[0].set(quiesced=True)
    code, doc = run_barrier(tmp_path, api, daemons, timeout=0.5)
    assert code == 200 and doc["outcome"] == "timeout"
    (ev,) = api.objects("Event")
    assert (ev["reason"], ev["type"]) == ("QuiesceTimeout", "Warning")
    assert "2 nodes asked, still sending: 127.0.0.1" in ev["note"]


def test_forbidden_is_said_once_and_the_barrier_unchanged(
    tmp_path, api, daemons, caplog: pytest.LogCaptureFixture
) -> None:
    for d in daemons:
        d.set(quiesced=True)
    api.fail_next("create", "Event", status=403, times=5)
    with caplog.at_level(logging.WARNING):
        code, doc = run_barrier(tmp_path, api, daemons, wait_connections=False)
    assert code == 200 and doc["outcome"] == "quiesced"
    assert api.objects("Event") == []
    said = [r for r in caplog.records if "may not create Events" in r.getMessage()]
    assert len(said) == 1


def test_without_the_pod_or_credentials_no_writer() -> None:
    base = ManagerOptions(pod_ips=(POD,))
    assert open_events(base, environ={}) is None
    with_pod = ManagerOptions(pod_ips=(POD,), pod=ME)
    assert open_events(with_pod, environ={}) is None  # no kubeconfig, not in a pod

"""The daemon end to end against the fake API server (real wire protocol, the real
`kubernetes` client), on the in-memory kernel. The lab runs the same on a real kernel."""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterator

import pytest

from devkit.builders import endpoint, endpoint_slice, pod, service, terminating
from devkit.fakeapi.server import FakeAPIServer
from devkit.harness import rs, vs
from ipvsctl.daemon.options import DaemonOptions, DrainOptions, HTTPOptions, SourceOptions
from ipvsctl.daemon.wiring import Daemon
from ipvsctl.kernel.fake import FakeKernel
from ipvsctl.kube.client import KubeSource
from ipvsctl.kube.settings import KubeSettings
from ipvsctl.model import DeadlineSource, NodeContext, PodRef
from ipvsctl.obs.metrics import Metrics
from ipvsctl.reconcile.loop import LoopConfig
from ipvsctl.reconcile.paced import run_once
from tests.unit.test_daemon import get, wait_for

A, B = "10.244.1.5", "10.244.1.6"


@pytest.fixture
def api() -> Iterator[FakeAPIServer]:
    with FakeAPIServer() as server:
        server.add(service("web"))
        server.add(endpoint_slice("web", [endpoint(A, pod="web-1"), endpoint(B, pod="web-2")]))
        yield server


def start_daemon(api: FakeAPIServer, tmp_path, kernel: FakeKernel) -> Daemon:
    settings = KubeSettings(backoff_initial=0.05, backoff_max=0.2, healthy_watch_seconds=0.05)
    opts = DaemonOptions(
        node=NodeContext("node-a"),
        source=SourceOptions(apiserver=api.url),
        drain=DrainOptions(state_dir=str(tmp_path / "state"), timeout=300, check_interval=0.05),
        http=HTTPOptions(listen="127.0.0.1:0"),
    )
    metrics = Metrics()
    source = KubeSource.from_config(
        apiserver=api.url,
        settings=settings,
        on_watch_restart=lambda r, why: metrics.watch_restarts.labels(r, why).inc(),
    )
    d = Daemon(
        opts,
        kernel,
        source,
        metrics=metrics,
        loop_config=LoopConfig(drain_check_interval=0.05, idle_wakeup=0.05),
    )
    d.start()
    wait_for(lambda: d.engine.started)
    return d


def _stamp(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_terminating_endpoint_drains_until_its_pod_goes_with_no_pod_read(api, tmp_path):
    kernel = FakeKernel()
    d = start_daemon(api, tmp_path, kernel)
    try:
        with d.loop.lock:
            kernel.set_connections(vs(), rs(A), active=1)
        # The pod is there to be read, with a deletionTimestamp long past: nothing reads it.
        api.add(pod("web-1", deletion_timestamp=_stamp(time.time() - 300), uid="u-web-1"))
        api.update(
            endpoint_slice(
                "web", [terminating(A, pod="web-1", uid="u-web-1"), endpoint(B, pod="web-2")]
            )
        )
        wait_for(lambda: d.engine.drains.queue.get(vs(), rs(A)) is not None)
        with d.loop.lock:
            run_once(d.engine.drain_check)
            entry = d.engine.drains.queue.get(vs(), rs(A))
        assert entry is not None and not entry.has_deadline
        assert entry.deadline_source is DeadlineSource.POD
        assert kernel.weight(vs(), rs(A)) == 0 and kernel.weight(vs(), rs(B)) == 1
        assert not [r for r in api.requests if r.resource == "pods"]
        assert d.metrics.value("ipvsctl_event_to_kernel_seconds_count") >= 2
    finally:
        d.shutdown()


def test_statefulset_name_reuse_never_takes_the_former_pods_deadline(api, tmp_path):
    """Regression: `web-0` terminated twice within an hour took its first incarnation's
    deletionTimestamp (kept by namespace/name) and was cut at the first drain check with
    its connections open. The endpoint (name and uid) bounds the drain, not a pod read."""
    kernel = FakeKernel()
    d = start_daemon(api, tmp_path, kernel)
    try:
        # First incarnation: terminating with a connection, overdue, then gone.
        api.add(pod("web-0", deletion_timestamp=_stamp(time.time() - 300), uid="uid-1"))
        api.update(
            endpoint_slice("web", [endpoint(A, pod="web-0", uid="uid-1"), endpoint(B, pod="web-2")])
        )
        wait_for(lambda: kernel.weight(vs(), rs(A)) == 1)
        with d.loop.lock:
            kernel.set_connections(vs(), rs(A), active=1)
        api.update(
            endpoint_slice(
                "web", [terminating(A, pod="web-0", uid="uid-1"), endpoint(B, pod="web-2")]
            )
        )
        wait_for(lambda: kernel.weight(vs(), rs(A)) == 0)
        api.update(endpoint_slice("web", [endpoint(B, pod="web-2")]))
        wait_for(lambda: kernel.weight(vs(), rs(A)) is None, timeout=20)
        # Second incarnation: same name, new uid and address, terminating with connections
        # (the StatefulSet controller made the new pod as soon as the old one was gone).
        api.upsert(pod("web-0", deletion_timestamp=_stamp(time.time() + 30), uid="uid-2"))
        C = "10.244.1.7"
        api.update(
            endpoint_slice("web", [endpoint(C, pod="web-0", uid="uid-2"), endpoint(B, pod="web-2")])
        )
        wait_for(lambda: kernel.weight(vs(), rs(C)) == 1)
        with d.loop.lock:
            kernel.set_connections(vs(), rs(C), active=5)
        api.update(
            endpoint_slice(
                "web", [terminating(C, pod="web-0", uid="uid-2"), endpoint(B, pod="web-2")]
            )
        )
        wait_for(lambda: kernel.weight(vs(), rs(C)) != 1)  # drained (0) or cut (None)
        with d.loop.lock:
            for _ in range(3):
                run_once(d.engine.drain_check)
            entry = d.engine.drains.queue.get(vs(), rs(C))
        assert kernel.weight(vs(), rs(C)) == 0  # still there, draining
        assert entry is not None and entry.pod == PodRef("default", "web-0", "uid-2")
        assert not entry.has_deadline
        assert d.metrics.value("ipvsctl_real_server_deletions_total", {"reason": "deadline"}) == 0
        assert (
            d.metrics.value("ipvsctl_real_server_deletions_total", {"reason": "pod_gone"}) == 1
        )  # the first incarnation
    finally:
        d.shutdown()


def test_relist_after_410_causes_no_kernel_changes(api, tmp_path):
    kernel = FakeKernel()
    d = start_daemon(api, tmp_path, kernel)
    try:
        with d.loop.lock:
            kernel.set_connections(vs(), rs(A), active=1)
            kernel.take_ops()
        # The engine starts after the list, so its watch may not be open yet: a 410 sent
        # before it opens reaches nobody.
        assert api.wait_for(lambda: api.open_watches("EndpointSlice") == 1)
        lists = api.count("list", "EndpointSlice")
        api.expire_watches("EndpointSlice")
        wait_for(lambda: api.count("list", "EndpointSlice") > lists)
        api.update(endpoint_slice("web", [endpoint(B, pod="web-2")]))  # a marker change
        wait_for(lambda: kernel.weight(vs(), rs(A)) in (0, None))
        assert kernel.take_ops() == ["set-rs 10.96.0.10:80/TCP -> 10.244.1.5:8080 weight 0"]
        assert (
            d.metrics.value(
                "ipvsctl_watch_restarts_total", {"resource": "endpointslices", "reason": "expired"}
            )
            >= 1
        )
    finally:
        d.shutdown()


def test_api_outage_leaves_the_table_and_catches_up(api, tmp_path):
    kernel = FakeKernel()
    d = start_daemon(api, tmp_path, kernel)
    base = f"http://127.0.0.1:{d.http.port}"
    try:
        before = kernel.dump()
        kernel.take_ops()
        api.down()
        api.reset_watches()

        def failed_reconnects() -> float:
            return sum(
                d.metrics.value("ipvsctl_watch_restarts_total", {"resource": r, "reason": "error"})
                for r in ("services", "endpointslices")
            )

        wait_for(lambda: failed_reconnects() >= 4, timeout=20)  # retried through the outage
        assert kernel.dump() == before and kernel.take_ops() == []
        assert get(base + "/healthz")[0] == 200 and get(base + "/readyz")[0] == 200
        api.update(endpoint_slice("web", [endpoint(A, pod="web-1")]))  # changed while down
        api.up()
        wait_for(lambda: kernel.weight(vs(), rs(B)) in (0, None), timeout=20)
        assert kernel.weight(vs(), rs(A)) == 1
    finally:
        d.shutdown()


def test_status_command_against_the_daemon(api, tmp_path):
    import json
    import subprocess
    import sys

    kernel = FakeKernel()
    d = start_daemon(api, tmp_path, kernel)
    try:
        url = f"http://127.0.0.1:{d.http.port}"
        r = subprocess.run(
            [sys.executable, "-m", "ipvsctl", "status", "--json", "--endpoint", url],
            capture_output=True,
            text=True,
            timeout=60,
        )
        doc = json.loads(r.stdout)
        assert doc["daemon"]["reachable"] is True
        # No IPVS on the test host: the daemon's view is shown, and the kernel's absence said.
        if not doc["kernel"]["readable"]:
            (v,) = doc["virtual_servers"]
            assert v["service"] == "default/web"
        r = subprocess.run(
            [sys.executable, "-m", "ipvsctl", "status", "--endpoint", url],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert "default/web:http" in r.stdout
    finally:
        d.shutdown()

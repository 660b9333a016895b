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
from ipvsctl.kernel.fake import FakeKernel
from ipvsctl.kube.client import KubeSource
from ipvsctl.kube.settings import KubeSettings
from ipvsctl.model import NodeContext
from ipvsctl.obs.metrics import Metrics
from ipvsctl.reconcile.loop import LoopConfig
from ipvsctl.shell.daemon import Daemon, DaemonOptions
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
    opts = DaemonOptions(node=NodeContext("node-a"), apiserver=api.url,
                         state_dir=str(tmp_path / "state"), listen="127.0.0.1:0",
                         drain_timeout=300, drain_check_interval=0.05)
    metrics = Metrics()
    source = KubeSource.from_config(
        apiserver=api.url, settings=settings,
        on_watch_restart=lambda r, why: metrics.watch_restarts.labels(r, why).inc())
    d = Daemon(opts, kernel, source, metrics=metrics,
               loop_config=LoopConfig(drain_check_interval=0.05, idle_wakeup=0.05))
    d.start()
    wait_for(lambda: d.engine.started)
    return d


def test_terminating_endpoint_drains_until_its_pods_deletion_deadline(api, tmp_path):
    kernel = FakeKernel()
    d = start_daemon(api, tmp_path, kernel)
    try:
        with d.loop.lock:
            kernel.set_connections(vs(), rs(A), active=1)
        deadline = int(time.time()) + 3600
        stamp = datetime.datetime.fromtimestamp(deadline, datetime.UTC).strftime(
            "%Y-%m-%dT%H:%M:%SZ")
        api.add(pod("web-1", deletion_timestamp=stamp))
        api.update(endpoint_slice("web", [terminating(A, pod="web-1"), endpoint(B)]))
        wait_for(lambda: d.engine.queue.get(vs(), rs(A)) is not None
                 and d.engine.queue.get(vs(), rs(A)).deadline == deadline)
        assert kernel.weight(vs(), rs(A)) == 0 and kernel.weight(vs(), rs(B)) == 1
        assert api.count("get", "Pod") >= 1 and api.count("list", "Pod") == 0
        assert d.metrics.value("ipvsctl_event_to_kernel_seconds_count") >= 2
    finally:
        d.shutdown()


def test_relist_after_410_causes_no_kernel_changes(api, tmp_path):
    kernel = FakeKernel()
    d = start_daemon(api, tmp_path, kernel)
    try:
        with d.loop.lock:
            kernel.set_connections(vs(), rs(A), active=1)
            kernel.take_ops()
        lists = api.count("list", "EndpointSlice")
        api.expire_watches()
        wait_for(lambda: api.count("list", "EndpointSlice") > lists)
        api.update(endpoint_slice("web", [endpoint(B, pod="web-2")]))  # a marker change
        wait_for(lambda: kernel.weight(vs(), rs(A)) in (0, None))
        assert kernel.take_ops() == ["set-rs 10.96.0.10:80/TCP -> 10.244.1.5:8080 weight 0"]
        assert d.metrics.value("ipvsctl_watch_restarts_total",
                               {"resource": "endpointslices", "reason": "expired"}) >= 1
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
            return sum(d.metrics.value("ipvsctl_watch_restarts_total",
                                       {"resource": r, "reason": "error"})
                       for r in ("services", "endpointslices"))

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
        r = subprocess.run([sys.executable, "-m", "ipvsctl", "status", "--json",
                            "--endpoint", url], capture_output=True, text=True, timeout=60)
        doc = json.loads(r.stdout)
        assert doc["daemon"]["reachable"] is True
        # No IPVS on the test host: the daemon's view is shown, and the kernel's absence said.
        if not doc["kernel"]["readable"]:
            (v,) = doc["virtual_servers"]
            assert v["service"] == "default/web"
        r = subprocess.run([sys.executable, "-m", "ipvsctl", "status", "--endpoint", url],
                           capture_output=True, text=True, timeout=60)
        assert "default/web:http" in r.stdout
    finally:
        d.shutdown()

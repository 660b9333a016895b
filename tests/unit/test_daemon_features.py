"""A feature plugs into the daemon as a record: a feature the test alone defines, added to
the daemon's list, hears the engine's changes, runs its background read and its thread,
serves its route (local-only), adds its collector to /metrics, starts and stops with the
daemon; one that cannot start is left out whole. Nothing of the wiring is edited."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from ipvsctl.daemon.feature import Feature, Parts
from ipvsctl.daemon.options import DaemonOptions, DrainOptions, HTTPOptions, SourceOptions
from ipvsctl.daemon.wiring import FEATURES, Daemon
from ipvsctl.httpd import text
from ipvsctl.kernel.fake import FakeKernel
from ipvsctl.manifests import ManifestSource
from ipvsctl.model import NodeContext, ServiceRef
from ipvsctl.reconcile.feed import Subscriptions
from ipvsctl.reconcile.loop import LoopConfig
from ipvsctl.reconcile.paced import Pace, PacedRunner
from tests.unit.test_daemon import folder, get, wait_for  # noqa: F401

WEB = ServiceRef("default", "web")


class Probe:
    """A feature of the test's own, declaring one of everything a record can."""

    def __init__(self, name: str = "probe", starts: bool = True) -> None:
        self.name = name
        self.starts = starts
        self.heard: list[ServiceRef] = []
        self.reads = 0
        self.ran = threading.Event()
        self.stopped = threading.Event()
        self.parts: Parts | None = None

    # a background read: snapshot under the loop's lock, read off it, apply under it
    def snapshot(self) -> int | None:
        return 1 if self.parts is not None and self.parts.view.started else None

    def read(self, plan: int) -> int:
        return plan

    def apply(self, reading: int) -> None:
        self.reads += reading

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(f"ipvsctl_test_{self.name}_reads", "Reads.", value=self.reads)

    def run(self, stop: threading.Event) -> None:
        self.ran.set()
        stop.wait()

    def feature(self, p: Parts) -> Feature:
        self.parts = p
        return Feature(
            self.name,
            part=self,
            hears=Subscriptions(service=lambda ref, old, new: self.heard.append(ref)),
            readers=(PacedRunner(f"{self.name}-reader", self, p.loop.lock, Pace(every=0.05)),),
            threads=((self.name, self.run),),
            routes={f"/v1/{self.name}": lambda q: text(200, f"{self.name}\n")},
            local_only=frozenset({f"/v1/{self.name}"}),
            collectors=(self,),
            start=lambda: self.starts,
            stop=self.stopped.set,
        )


def daemon_with(tmp_path: Path, probe: Probe) -> Daemon:
    """The daemon of test_daemon.py's folder, its features and the test's own one."""
    opts = DaemonOptions(
        node=NodeContext("node-a", ("192.0.2.10",)),
        source=SourceOptions(manifests=str(tmp_path / "m")),
        drain=DrainOptions(state_dir=str(tmp_path / "state"), check_interval=0.05),
        http=HTTPOptions(listen="127.0.0.1:0"),
    )
    return Daemon(
        opts,
        FakeKernel(),
        ManifestSource(tmp_path / "m", interval=0.05),
        loop_config=LoopConfig(drain_check_interval=0.05, idle_wakeup=0.05),
        features=(*FEATURES, probe.feature),
    )


@pytest.mark.usefixtures("folder")
def test_a_feature_is_its_record_and_one_line(tmp_path: Path) -> None:
    probe = Probe()
    d = daemon_with(tmp_path, probe)
    d.start()
    try:
        wait_for(lambda: d.view.started and probe.reads > 0)
        assert d.part(Probe) is probe
        assert WEB in probe.heard  # the Service's changes reached it once in the kernel
        names = {t.name for t in d.threads if t.is_alive()}
        assert {"probe", "probe-reader"} <= names and probe.ran.is_set()
        url = f"http://127.0.0.1:{d.http.port}"
        assert get(f"{url}/v1/probe") == (200, "probe\n")
        assert "ipvsctl_test_probe_reads" in get(f"{url}/metrics")[1]
        d.http.is_local = lambda peer: False  # a client from elsewhere
        assert get(f"{url}/v1/probe")[0] == 403
        assert get(f"{url}/healthz")[0] == 200  # the daemon's own routes are not its
    finally:
        d.shutdown()
    assert probe.stopped.is_set()
    assert not [t for t in d.threads if t.is_alive()]


@pytest.mark.usefixtures("folder")
def test_a_feature_that_cannot_start_is_left_out(tmp_path: Path) -> None:
    late = Probe("late", starts=False)
    d = daemon_with(tmp_path, late)
    d.start()
    try:
        wait_for(lambda: d.view.started)
        assert d.part(Probe) is None
        assert late.heard == [] and not late.ran.is_set()
        assert not {"late", "late-reader"} & {t.name for t in d.threads}
        url = f"http://127.0.0.1:{d.http.port}"
        assert get(f"{url}/v1/late")[0] == 404
        assert "ipvsctl_test_late_reads" not in get(f"{url}/metrics")[1]
    finally:
        d.shutdown()
    assert not late.stopped.is_set()  # never started: nothing to stop


def test_the_daemon_without_netlink_never_imports_pyroute2() -> None:
    """pyroute2 is 12-22 MB of RSS: a daemon over the in-memory kernel (the memory benchmark
    and its guard) must not load it through a feature's module. The nftables generation
    reader did, at import, and the guard's peak rose by 12 MB."""
    import subprocess
    import sys

    code = (
        "import pkgutil, sys, ipvsctl.daemon.wiring, ipvsctl.daemon.features as f\n"
        "for m in pkgutil.iter_modules(f.__path__): __import__(f'{f.__name__}.{m.name}')\n"
        "print('pyroute2' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out

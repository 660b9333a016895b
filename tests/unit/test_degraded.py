"""Degraded while green: a part of the daemon that keeps failing is named in
/readyz's body and in `ipvsctl_degraded{condition}`, and readiness stays 200 for what still
works. The daemon's real wiring, the in-memory kernel, real HTTP."""

from __future__ import annotations

from pathlib import Path

import pytest

from devkit.builders import endpoint, endpoint_slice, service
from ipvsctl.daemon.options import DaemonOptions, DrainOptions, HTTPOptions, SourceOptions
from ipvsctl.daemon.wiring import Daemon
from ipvsctl.kernel.fake import FakeKernel
from ipvsctl.manifests import ManifestSource
from ipvsctl.model import NodeContext
from ipvsctl.netfilter.sync import NetfilterSync
from ipvsctl.obs.degraded import CONDITIONS
from ipvsctl.obs.metrics import Metrics
from ipvsctl.reconcile.loop import LoopConfig
from tests.unit.test_daemon import A, B, folder, get, make, wait_for, write  # noqa: F401
from tests.unit.test_netfilter_sync import FakeNft


def degraded(d: Daemon, condition: str) -> float:
    return d.metrics.value("ipvsctl_degraded", {"condition": condition})


def readyz(d: Daemon) -> tuple[int, str]:
    return get(f"http://127.0.0.1:{d.http.port}/readyz")


def test_every_condition_is_a_series_at_0_from_the_start() -> None:
    m = Metrics()
    for name in CONDITIONS:
        assert m.value("ipvsctl_degraded", {"condition": name}) == 0
    assert 'ipvsctl_degraded{condition="audit"} 0.0' in m.render().decode()


@pytest.mark.usefixtures("folder")
def test_failing_state_writes_are_degraded_not_unready(tmp_path: Path) -> None:
    d = make(tmp_path, FakeKernel())
    try:
        d.start()
        wait_for(lambda: readyz(d)[0] == 200)
        assert readyz(d)[1] == "ready\n"

        def full_disk(entries: object) -> None:
            raise OSError(28, "No space left on device")

        d.writer.save = full_disk
        write(tmp_path / "m", "web.yaml", service("web"), endpoint_slice("web", [endpoint(B)]))
        wait_for(lambda: degraded(d, "state_write") == 1)
        status, body = readyz(d)
        assert status == 200
        assert body.startswith("ready\n") and "degraded: state_write: " in body
        assert "No space left on device" in body
        d.writer.save = d.state.save  # the disk has room again: the retry clears it
        wait_for(lambda: degraded(d, "state_write") == 0)
        assert readyz(d) == (200, "ready\n")
    finally:
        d.shutdown()


class AuditCrashingKernel(FakeKernel):
    crash = False

    def list_virtual_servers(self):  # the audit's round start
        if self.crash:
            raise RuntimeError("a bug below the kernel port")
        return super().list_virtual_servers()


@pytest.mark.usefixtures("folder")
def test_an_audit_that_keeps_raising_is_degraded_not_unready(tmp_path: Path) -> None:
    kernel = AuditCrashingKernel()
    d = make(tmp_path, kernel)
    try:
        d.start()
        wait_for(lambda: readyz(d)[0] == 200)
        kernel.crash = True
        wait_for(lambda: degraded(d, "audit") == 1)
        status, body = readyz(d)
        assert status == 200 and "degraded: audit: a bug below the kernel port" in body
        assert get(f"http://127.0.0.1:{d.http.port}/healthz")[0] == 200  # the thread lives
        kernel.crash = False
        wait_for(lambda: degraded(d, "audit") == 0)
    finally:
        d.shutdown()


@pytest.mark.usefixtures("folder")
def test_failing_nft_pushes_are_degraded_not_unready(tmp_path: Path) -> None:
    nft = FakeNft()
    opts = DaemonOptions(
        node=NodeContext("node-a", ("192.0.2.10",)),
        source=SourceOptions(manifests=str(tmp_path / "m")),
        drain=DrainOptions(state_dir=str(tmp_path / "state"), check_interval=0.05),
        http=HTTPOptions(listen="127.0.0.1:0"),
    )
    d = Daemon(
        opts,
        FakeKernel(),
        ManifestSource(tmp_path / "m", interval=0.05),
        nft=nft,
        loop_config=LoopConfig(drain_check_interval=0.05, idle_wakeup=0.05),
    )
    try:
        d.start()
        wait_for(lambda: readyz(d)[0] == 200 and d.part(NetfilterSync) is not None)
        assert d.part(NetfilterSync) is not None
        wait_for(lambda: not d.part(NetfilterSync).pending())
        nft.fail = 10**9  # every push fails from now on
        write(tmp_path / "m", "two.yaml", service("two", cluster_ip="10.96.0.11"))
        wait_for(lambda: degraded(d, "nftables") == 1)
        status, body = readyz(d)
        assert status == 200 and "degraded: nftables: nft " in body
        assert "10.96.0.11:80/TCP" in d.kernel.dump()  # IPVS is still programmed
        nft.fail = 0
        assert d.part(NetfilterSync).flush()  # the next push works: the condition ends
        assert degraded(d, "nftables") == 0 and readyz(d) == (200, "ready\n")
    finally:
        d.shutdown()


def test_an_api_source_that_keeps_failing_is_degraded_not_unready(tmp_path: Path) -> None:
    """The daemon's own source wiring against the fake API server: an object it cannot read
    is counted and skipped (the rest is programmed); an API server gone for good is said in
    /readyz's body and the gauge while the node stays ready with the table it has."""
    from devkit.fakeapi import FakeAPIServer
    from ipvsctl.daemon.adapters import open_source
    from ipvsctl.kube.settings import KubeSettings

    settings = KubeSettings(
        backoff_initial=0.01, backoff_max=0.05, healthy_watch_seconds=0.2, degraded_after=3
    )
    with FakeAPIServer() as api:
        api.add(service("web"))
        api.add(endpoint_slice("web", [endpoint(B)]))
        api.put_raw("Service", "default", "bad-metadata", b'{"kind":"Service","metadata":"x"}')
        api.put_raw("Service", "default", "not-an-object", b"7")
        opts = DaemonOptions(
            node=NodeContext("node-a"),
            source=SourceOptions(apiserver=api.url),
            drain=DrainOptions(state_dir=str(tmp_path / "state"), check_interval=0.05),
            http=HTTPOptions(listen="127.0.0.1:0"),
        )
        metrics = Metrics()
        kernel = FakeKernel()
        d = Daemon(
            opts,
            kernel,
            open_source(opts, metrics, settings),
            metrics=metrics,
            loop_config=LoopConfig(drain_check_interval=0.05, idle_wakeup=0.05),
        )
        try:
            d.start()
            wait_for(lambda: readyz(d)[0] == 200)
            assert readyz(d) == (200, "ready\n")
            table = kernel.dump()
            assert f"-> {B}:" in table  # the Services around the unreadable ones are in
            # One skipped by the store (its metadata), one by the source (not an object).
            assert metrics.value("ipvsctl_invalid_objects_total", {"kind": "Service"}) == 2
            api.down()
            wait_for(lambda: degraded(d, "source") == 1)
            status, body = readyz(d)
            assert status == 200 and body.startswith("ready\n")
            assert "degraded: source: " in body and "attempts failed in a row" in body
            assert kernel.dump() == table  # kept, not flushed
            api.up()
            wait_for(lambda: degraded(d, "source") == 0)
            assert readyz(d) == (200, "ready\n")
        finally:
            d.shutdown()

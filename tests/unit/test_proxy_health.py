"""kube-proxy's health server on --healthz-bind-address (KEP-3836): the JSON and codes of
/healthz and /livez, this node's Node (tainted, being deleted) read from manifests by a real
daemon, a stuck loop, and a port already taken (kube-proxy still running)."""

from __future__ import annotations

import json
import logging
import socket
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from devkit.builders import endpoint, endpoint_slice, service
from ipvsctl.daemon.options import DaemonOptions, DrainOptions, HTTPOptions, SourceOptions
from ipvsctl.daemon.wiring import Daemon
from ipvsctl.healthcheck.proxy import ZERO_TIME, ProxyState, answer, go_time
from ipvsctl.healthcheck.proxy_server import ProxyHealthServer
from ipvsctl.kernel.fake import FakeKernel
from ipvsctl.manifests import ManifestSource
from ipvsctl.model import NodeContext
from ipvsctl.reconcile.loop import LoopConfig
from tests.unit.test_daemon import get, wait_for, write

NOW = 1_700_000_000.0


def state(**kw: Any) -> ProxyState:
    base = dict(
        now=NOW,
        monotonic=100.0,
        heartbeat=99.5,
        pending_since=None,
        last_updated=NOW - 300,
        node_eligible=True,
        timeout=60.0,
    )
    base.update(kw)
    return ProxyState(**base)


def parse(t: str) -> float:
    return datetime.fromisoformat(t.replace("Z", "+00:00")).timestamp()


@pytest.mark.parametrize(
    ("name", "kw", "healthz", "livez"),
    [
        ("synced", {}, 200, 200),
        ("never synced yet, nothing queued", {"last_updated": None}, 200, 200),
        ("update queued, not late", {"pending_since": 50.0}, 200, 200),
        ("update queued too long", {"pending_since": 39.0}, 503, 503),
        ("loop stuck", {"heartbeat": 30.0}, 503, 503),
        ("node not eligible", {"node_eligible": False}, 503, 200),
        ("stale and not eligible", {"pending_since": 0.0, "node_eligible": False}, 503, 503),
    ],
)
def test_codes(name: str, kw: dict, healthz: int, livez: int) -> None:
    assert answer("/healthz", state(**kw))[0] == healthz
    assert answer("/livez", state(**kw))[0] == livez


def test_json_as_kube_proxy() -> None:
    code, body = answer("/healthz", state())
    assert code == 200
    assert set(body) == {"lastUpdated", "currentTime", "nodeEligible", "healthy"}
    # 200: lastUpdated is "now" (kube-proxy's backward-compatible meaning)
    assert parse(body["lastUpdated"]) == parse(body["currentTime"]) == NOW
    assert body["currentTime"].endswith("Z") and body["nodeEligible"] is True
    code, body = answer("/healthz", state(node_eligible=False))
    assert (code, body["nodeEligible"], body["healthy"]) == (503, False, True)
    assert parse(body["lastUpdated"]) == NOW - 300  # 503: the real last sync
    code, body = answer("/livez", state(pending_since=0.0, last_updated=None))
    assert "nodeEligible" not in body and body["healthy"] is False
    assert body["lastUpdated"] == ZERO_TIME
    assert go_time(0.5) == "1970-01-01T00:00:00.500000Z"


# --- a real daemon ------------------------------------------------------------------------


def node(**meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "node-a", "labels": {"topology.kubernetes.io/zone": "z"}, **meta},
    }


def tainted() -> dict[str, Any]:
    n = node()
    n["spec"] = {
        "taints": [
            {"key": "ToBeDeletedByClusterAutoscaler", "value": "1700000000", "effect": "NoSchedule"}
        ]
    }
    return n


def daemon(tmp_path: Path, healthz: str = "127.0.0.1:0", stale_after: float = 60.0) -> Daemon:
    folder = tmp_path / "m"
    opts = DaemonOptions(
        node=NodeContext("node-a", ("192.0.2.10",)),
        source=SourceOptions(manifests=str(folder)),
        drain=DrainOptions(state_dir=str(tmp_path / "state")),
        http=HTTPOptions(
            listen="127.0.0.1:0", stale_after=stale_after, healthz_bind_address=healthz
        ),
    )
    d = Daemon(
        opts,
        FakeKernel(),
        ManifestSource(folder, interval=0.05),
        loop_config=LoopConfig(idle_wakeup=0.05),
    )
    assert d.part(ProxyHealthServer) is not None
    d.part(ProxyHealthServer).retry_interval = 0.05
    return d


def probe(d: Daemon, path: str) -> tuple[int, dict[str, Any]]:
    assert d.part(ProxyHealthServer) is not None and d.part(ProxyHealthServer).port
    code, text = get(f"http://127.0.0.1:{d.part(ProxyHealthServer).port}{path}")
    return code, json.loads(text)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    folder = tmp_path / "m"
    folder.mkdir()
    write(folder, "web.yaml", service("web"), endpoint_slice("web", [endpoint("10.244.1.5")]))
    return folder


def test_daemon_follows_its_node_taint_and_deletion(tmp_path: Path, folder: Path) -> None:
    write(folder, "node.yaml", tainted())
    d = daemon(tmp_path)
    try:
        d.start()
        wait_for(lambda: d.engine.started and d.part(ProxyHealthServer).port)
        code, body = probe(d, "/healthz")
        assert (code, body["nodeEligible"], body["healthy"]) == (503, False, True)
        assert probe(d, "/livez")[0] == 200  # liveness ignores the node

        write(folder, "node.yaml", node())
        wait_for(lambda: probe(d, "/healthz")[0] == 200)
        assert probe(d, "/healthz")[1]["nodeEligible"] is True

        write(folder, "node.yaml", node(deletionTimestamp="2026-11-23T00:00:00Z"))
        wait_for(lambda: probe(d, "/healthz")[0] == 503)
        assert probe(d, "/healthz")[1]["nodeEligible"] is False

        base = f"http://127.0.0.1:{d.http.port}"
        assert get(base + "/healthz")[0] == 200  # the daemon's own liveness is not the node's
        metrics = get(base + "/metrics")[1]
        assert 'ipvsctl_proxy_health_responses_total{code="503",path="/healthz"}' in metrics
        assert "ipvsctl_node_object_known 1.0" in metrics
    finally:
        d.shutdown()


def test_no_node_object_counts_eligible(tmp_path: Path, folder: Path) -> None:
    d = daemon(tmp_path)
    try:
        d.start()
        wait_for(lambda: d.engine.started and d.part(ProxyHealthServer).port)
        code, body = probe(d, "/healthz")
        assert (code, body["nodeEligible"]) == (200, True)
        assert d.metrics.value("ipvsctl_node_object_known") == 0
    finally:
        d.shutdown()


def test_stuck_loop_is_stale(tmp_path: Path, folder: Path) -> None:
    d = daemon(tmp_path, stale_after=0.3)
    try:
        d.start()
        wait_for(lambda: d.engine.started and d.part(ProxyHealthServer).port)
        assert probe(d, "/healthz")[0] == 200
        with d.loop.lock:  # the loop cannot turn: updates are stale
            wait_for(lambda: probe(d, "/livez")[0] == 503)
            code, body = probe(d, "/healthz")
            assert (code, body["healthy"]) == (503, False)
        wait_for(lambda: probe(d, "/livez")[0] == 200)
    finally:
        d.shutdown()


def test_port_taken_is_one_error_line_a_metric_and_a_retry(
    tmp_path: Path, folder: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen(1)
    port = blocker.getsockname()[1]
    d = daemon(tmp_path, healthz=f"127.0.0.1:{port}")
    caplog.set_level(logging.INFO, logger="ipvsctl")
    try:
        d.start()
        wait_for(lambda: d.metrics.value("ipvsctl_proxy_health_errors_total") >= 3)
        wait_for(lambda: d.engine.started)  # the daemon runs on
        assert get(f"http://127.0.0.1:{d.http.port}/readyz")[0] == 200
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert [r.getMessage() for r in errors] == [
            "health server port not opened (kube-proxy still running?), retrying"
        ]
        assert not any(r.exc_info for r in caplog.records)
        blocker.close()  # kube-proxy goes away: the port is taken over
        wait_for(lambda: d.part(ProxyHealthServer).port == port)
        assert probe(d, "/healthz")[0] == 200
    finally:
        blocker.close()
        d.shutdown()


@pytest.mark.parametrize(
    ("value", "want"),
    [
        ("0.0.0.0:10256", "0.0.0.0:10256"),
        ("", ""),
        ("  ", ""),
        ("0.0.0.0", "0.0.0.0:10256"),
        ("::", "[::]:10256"),
        ("[::]:10256", "[::]:10256"),
        ("127.0.0.1:0", "127.0.0.1:0"),
    ],
)
def test_bind_address_as_kube_proxys_flag(value: str, want: str) -> None:
    from ipvsctl.daemon.options import healthz_address

    assert healthz_address(value) == want


@pytest.mark.parametrize("value", ["bogus", "1.2.3.4:99999", ":10256", "1.2.3.4:x"])
def test_bad_bind_address_is_exit_2(value: str) -> None:
    from typer.testing import CliRunner

    from ipvsctl.cli.app import app
    from ipvsctl.daemon.options import OptionsError, healthz_address

    with pytest.raises(OptionsError, match="--healthz-bind-address"):
        healthz_address(value)
    r = CliRunner().invoke(app, ["run", "--healthz-bind-address", value])
    assert r.exit_code == 2 and "--healthz-bind-address" in r.output

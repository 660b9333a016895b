"""The daemon's wiring of the nftables table and the healthCheckNodePorts: in-process,
manifests folder as the source, in-memory IPVS, a fake nft, health checks on loopback."""

from __future__ import annotations

import json
import socket
from pathlib import Path

from typer.testing import CliRunner

from devkit.builders import endpoint, endpoint_slice, service
from ipvsctl.cli.app import app
from ipvsctl.daemon.options import (
    DaemonOptions,
    DrainOptions,
    HTTPOptions,
    NetfilterOptions,
    SourceOptions,
)
from ipvsctl.daemon.wiring import Daemon
from ipvsctl.healthcheck.server import HealthServer
from ipvsctl.kernel.fake import FakeKernel
from ipvsctl.manifests import ManifestSource
from ipvsctl.model import NodeContext
from ipvsctl.netfilter.nft import NftUnavailable
from ipvsctl.netfilter.sync import NetfilterSync
from ipvsctl.reconcile.loop import LoopConfig
from tests.unit.test_daemon import wait_for, write
from tests.unit.test_healthcheck_server import Ports, get
from tests.unit.test_netfilter_sync import FakeNft


def lb(local: bool = True):
    spec = {"externalTrafficPolicy": "Local"} if local else {}
    return service(
        "lb",
        cluster_ip="10.96.0.10",
        type="LoadBalancer",
        healthCheckNodePort=32000,
        ports=[{"name": "http", "port": 80, "nodePort": 30080}],
        **spec,
    )


def make(tmp_path: Path, nft: FakeNft, ports: Ports) -> Daemon:
    opts = DaemonOptions(
        node=NodeContext("node-a", ("192.0.2.10",)),
        source=SourceOptions(manifests=str(tmp_path / "m")),
        drain=DrainOptions(state_dir=str(tmp_path / "state")),
        http=HTTPOptions(listen="127.0.0.1:0"),
        netfilter=NetfilterOptions(cluster_cidrs=("10.244.0.0/16",)),
    )
    d = Daemon(
        opts,
        FakeKernel(),
        ManifestSource(tmp_path / "m", interval=0.05),
        nft=nft,
        health_ports=ports,
        loop_config=LoopConfig(idle_wakeup=0.05),
    )
    return d


def test_daemon_keeps_the_table_and_serves_health_checks(tmp_path):
    nft, ports = FakeNft(), Ports()
    (tmp_path / "m").mkdir()
    write(tmp_path / "m", "lb.yaml", lb(), endpoint_slice("lb", [endpoint("10.244.1.5")]))
    d = make(tmp_path, nft, ports)
    try:
        d.start()
        assert nft.scripts[0][0] == "base"
        assert "ip saddr != { 10.244.0.0/16 }" in nft.scripts[0][1]  # --cluster-cidr
        wait_for(
            lambda: (
                nft.elements()
                == {
                    "10.96.0.10 . tcp . 80": "cluster-ip",
                    "192.0.2.10 . tcp . 30080": "external-local",
                }
            )
        )
        assert [op for op, _ in nft.scripts] == ["base", "replace"]
        wait_for(lambda: 32000 in ports.actual)
        code, _, body = get(ports.actual[32000])
        assert (code, body["localEndpoints"], body["serviceProxyHealthy"]) == (200, 1, True)

        write(
            tmp_path / "m",
            "lb.yaml",
            lb(local=False),
            endpoint_slice("lb", [endpoint("10.244.1.5")]),
        )
        wait_for(lambda: nft.elements().get("192.0.2.10 . tcp . 30080") == "external")
        assert [op for op, _ in nft.scripts][-1] == "elements"
        wait_for(lambda: d.part(HealthServer).ports() == [])
        assert d.metrics.value("ipvsctl_netfilter_elements") == 2
    finally:
        d.shutdown()
    assert not [t for t in d.threads if t.is_alive()]


def test_nft_unavailable_runs_degraded_and_says_so(tmp_path, caplog):
    # IPVS alone still carries pod-to-Service traffic: a node without nft keeps its proxy.
    class NoNft(FakeNft):
        def apply(self, script, operation):
            raise NftUnavailable(
                "nft base: nft not found: install nftables (the `nft` command)", operation
            )

    (tmp_path / "m").mkdir()
    d = make(tmp_path, NoNft(), Ports())
    try:
        d.start()
        wait_for(lambda: d.engine.started)
        assert d.part(NetfilterSync) is None
        assert any("nftables unavailable" in r.getMessage() for r in caplog.records)
    finally:
        d.shutdown()


def test_run_flags():
    runner = CliRunner()
    r = runner.invoke(app, ["run", "--cluster-cidr", "10.244.0.0/33"])
    assert r.exit_code == 2 and "--cluster-cidr 10.244.0.0/33: not a CIDR" in r.output
    help_text = runner.invoke(app, ["run", "--help"]).output
    for flag in ("--cluster-cidr", "--masquerade-all", "--no-nftables"):
        assert flag in help_text


def test_json_body_over_a_plain_socket_matches_kube_proxy(tmp_path):
    nft, ports = FakeNft(), Ports()
    (tmp_path / "m").mkdir()
    write(tmp_path / "m", "lb.yaml", lb(), endpoint_slice("lb", []))
    d = make(tmp_path, nft, ports)
    try:
        d.start()
        wait_for(lambda: 32000 in ports.actual)
        with socket.create_connection(("127.0.0.1", ports.actual[32000]), timeout=5) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\n\r\n")
            data = b""
            while chunk := s.recv(4096):
                data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503 Service Unavailable")
        assert json.loads(body) == {
            "service": {"namespace": "default", "name": "lb"},
            "localEndpoints": 0,
            "serviceProxyHealthy": True,
        }
    finally:
        d.shutdown()

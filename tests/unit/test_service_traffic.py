"""Per-Service traffic metrics (--service-metrics): the opt-in, the cap, counters that never
go backwards, and the read made at scrape time only, off the loop's lock."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from devkit.builders import endpoint, endpoint_slice, service
from devkit.fakenetlink import IPVSModel, model_sockets
from devkit.harness import Harness, vs
from ipvsctl.daemon.options import (
    DaemonOptions,
    DrainOptions,
    HTTPOptions,
    MetricsOptions,
    SourceOptions,
)
from ipvsctl.daemon.wiring import Daemon
from ipvsctl.kernel.fake import FakeKernel
from ipvsctl.kernel.netlink import NetlinkKernel
from ipvsctl.kernel.port import KernelTransient
from ipvsctl.manifests import ManifestSource
from ipvsctl.model import DesiredService, NodeContext, ServiceRef, ServiceStats
from ipvsctl.obs.metrics import Metrics, ServiceTrafficCollector
from ipvsctl.plan.traffic import MonotonicSums, admit
from ipvsctl.reconcile.feed import Subscriptions
from ipvsctl.reconcile.loop import LoopConfig
from ipvsctl.reconcile.service_traffic import ServiceMetricsMode, ServiceTraffic

from .test_daemon import get, wait_for, write

ON = {"ipvsctl.io/metrics": "true"}
TRAFFIC = ServiceStats(conns=3, in_packets=30, out_packets=20, in_bytes=3000, out_bytes=9000)


def web(name: str = "web", ip: str = "10.96.0.10", annotations: dict | None = None, **kw) -> dict:
    return service(name, ip, annotations=annotations, **kw)


def slice_of(name: str = "web") -> dict:
    return endpoint_slice(name, [endpoint("10.244.1.5", pod=f"{name}-1")])


def traffic_harness(mode: ServiceMetricsMode, max_series: int = 10000):
    h = Harness()
    traffic = ServiceTraffic(h.fake, mode, max_series)
    h.feed.subscribe(Subscriptions(service=traffic.on_service))
    return h, traffic


def series(traffic: ServiceTraffic) -> dict[tuple[str, ...], ServiceStats]:
    rows, _ = traffic.read()
    return {tuple(labels): stats for labels, stats in rows}


WEB = ("default", "web", "http", "TCP")


# --- the opt-in -----------------------------------------------------------------------------
def test_an_annotated_service_gets_its_series_and_others_none():
    h, traffic = traffic_harness(ServiceMetricsMode.ANNOTATED)
    h.start(
        [
            web(annotations=ON),
            web("db", "10.96.0.11"),
            web("off", "10.96.0.12", {"ipvsctl.io/metrics": "false"}),
        ],
        [slice_of(), slice_of("db"), slice_of("off")],
    )
    h.fake.add_traffic(vs(), TRAFFIC)
    h.fake.add_traffic(vs("10.96.0.11"), TRAFFIC)
    assert series(traffic) == {WEB: TRAFFIC}


def test_the_annotation_changed_adds_and_removes_the_series():
    h, traffic = traffic_harness(ServiceMetricsMode.ANNOTATED)
    h.start([web()], [slice_of()])
    h.fake.add_traffic(vs(), TRAFFIC)
    assert series(traffic) == {}
    h.upsert(web(annotations=ON))
    assert series(traffic) == {WEB: TRAFFIC}
    h.upsert(web(annotations={"ipvsctl.io/metrics": "false"}))
    assert series(traffic) == {}
    h.upsert(web(annotations=ON))
    h.delete(web())
    assert series(traffic) == {}


def test_all_takes_every_service_whatever_its_annotation():
    h, traffic = traffic_harness(ServiceMetricsMode.ALL)
    h.start(
        [web(), web("db", "10.96.0.11", {"ipvsctl.io/metrics": "false"})],
        [slice_of(), slice_of("db")],
    )
    assert set(series(traffic)) == {WEB, ("default", "db", "http", "TCP")}


def test_a_bad_annotation_value_is_a_warning_and_no_series():
    from ipvsctl.source.convert import parse_service

    parsed = parse_service(web(annotations={"ipvsctl.io/metrics": "yes"}))
    assert not parsed.value.traffic_metrics
    assert any("ipvsctl.io/metrics" in w for w in parsed.warnings)
    assert parse_service(web(annotations={"ipvsctl.io/metrics": "True"})).value.traffic_metrics


def test_a_services_addresses_sum_into_one_series_per_port_without_addresses():
    """Cluster IPs of both families, an external IP and a NodePort: one series per port."""
    h, traffic = traffic_harness(ServiceMetricsMode.ANNOTATED)
    svc = web(
        ip=["10.96.0.10", "fd00::10"],
        annotations=ON,
        externalIPs=["192.0.2.50"],
        type="NodePort",
        ports=[
            {"name": "http", "port": 80, "protocol": "TCP", "nodePort": 30080},
            {"name": "dns", "port": 53, "protocol": "UDP"},
        ],
    )
    h.start([svc], [slice_of()])
    keys = [k for k in h.fake.services if k.protocol.value == "TCP"]
    assert len(keys) == 4  # two cluster IPs, the external IP, the NodePort
    for k in keys:
        h.fake.add_traffic(k, TRAFFIC)
    got = series(traffic)
    assert got[WEB] == TRAFFIC + TRAFFIC + TRAFFIC + TRAFFIC
    assert got[("default", "web", "dns", "UDP")] == ServiceStats()
    assert set(got) == {WEB, ("default", "web", "dns", "UDP")}


# --- the cap --------------------------------------------------------------------------------
def _desired(namespace: str, name: str, ports: int) -> DesiredService:
    from ipvsctl.model import DesiredVirtualServer, Protocol, ServiceKey, VirtualServer
    from ipvsctl.model import VirtualServerKind as Kind

    vss = {}
    for p in range(ports):
        key = ServiceKey(Protocol.TCP, f"10.96.{len(name)}.{p}", 80 + p)
        vss[key] = DesiredVirtualServer(VirtualServer(key), Kind.CLUSTER_IP, f"p{p}")
    return DesiredService(ServiceRef(namespace, name), vss)


def test_the_cap_admits_whole_services_in_name_order_and_counts_the_rest():
    services = [_desired("b", "x", 1), _desired("a", "y", 2), _desired("a", "z", 1)]
    labels, dropped = admit(services, 15)  # 5 series per port: a/y (10), a/z (5) fit
    assert {(lab[0], lab[1]) for lab in labels.values()} == {("a", "y"), ("a", "z")}
    assert dropped == 1
    labels, dropped = admit(services, 14)  # a/y (10), not a/z (15), not b/x (15)
    assert {(lab[0], lab[1]) for lab in labels.values()} == {("a", "y")} and dropped == 2
    assert admit(services, 20) == (admit(services, 10**6)[0], 0)
    assert admit(services, 0) == ({}, 3)


def test_the_daemon_exports_the_dropped_count_and_no_series_past_the_cap():
    h, traffic = traffic_harness(ServiceMetricsMode.ALL, max_series=5)
    h.start([web("a", "10.96.0.10"), web("b", "10.96.0.11")], [slice_of("a"), slice_of("b")])
    rows, dropped = traffic.read()
    assert [tuple(r[0]) for r in rows] == [("default", "a", "http", "TCP")] and dropped == 1
    m = Metrics()
    m.registry.register(ServiceTrafficCollector(traffic.read))  # as the daemon's feature does
    assert m.value("ipvsctl_service_metrics_dropped") == 1
    assert (
        m.value(
            "ipvsctl_service_bytes_total",
            {
                "service": "b",
                "namespace": "default",
                "port": "http",
                "protocol": "TCP",
                "direction": "in",
            },
        )
        == 0
    )
    assert "ipvsctl_service_bytes_total{" in m.render().decode()


# --- counters never go backwards ------------------------------------------------------------
def test_a_virtual_server_recreated_or_gone_never_takes_the_series_backwards():
    h, traffic = traffic_harness(ServiceMetricsMode.ANNOTATED)
    svc = web(ip=["10.96.0.10"], annotations=ON, externalIPs=["192.0.2.50"])
    h.start([svc], [slice_of()])
    h.fake.add_traffic(vs(), TRAFFIC)
    h.fake.add_traffic(vs("192.0.2.50"), TRAFFIC)
    assert series(traffic)[WEB] == TRAFFIC + TRAFFIC
    # the external IP goes away: its counts stay in the series
    h.upsert(web(ip=["10.96.0.10"], annotations=ON))
    assert series(traffic)[WEB] == TRAFFIC + TRAFFIC
    # the cluster IP's virtual server is deleted and made again (counters restart at 0)
    h.fake.delete_virtual_server(vs(), bind_address=False)
    h.audit()
    h.engine.sync()
    assert vs() in h.fake.services
    h.fake.add_traffic(vs(), ServiceStats(conns=1))
    assert series(traffic)[WEB] == TRAFFIC + TRAFFIC + ServiceStats(conns=1)


def test_monotonic_sums_forget_a_label_set_no_longer_exported():
    sums = MonotonicSums()
    lab = ("ns", "a", "http", "TCP")
    k = vs()
    assert sums.update({lab: {k: TRAFFIC}}) == {lab: TRAFFIC}
    assert sums.update({lab: {k: ServiceStats(conns=1)}}) == {lab: TRAFFIC + ServiceStats(conns=1)}
    assert sums.update({}) == {}
    assert sums.update({lab: {k: ServiceStats(conns=2)}}) == {lab: ServiceStats(conns=2)}


# --- where and when the kernel is read ------------------------------------------------------
def test_events_read_nothing_and_a_scrape_reads_one_dump():
    h, traffic = traffic_harness(ServiceMetricsMode.ALL)
    h.start([web(annotations=ON)], [slice_of()])
    for i in range(5):
        h.upsert(web(annotations={**ON, "n": str(i)}))
    assert h.fake.stats_reads == 0
    traffic.read()
    assert h.fake.stats_reads == 1
    h.fake.services.clear()  # nothing opted in is read only when something is opted in
    h2, t2 = traffic_harness(ServiceMetricsMode.ANNOTATED)
    h2.start([web()], [slice_of()])
    assert t2.read() == ([], 0) and h2.fake.stats_reads == 0


def test_a_failed_read_is_a_gap_a_count_and_one_log_line(caplog):
    class Failing(FakeKernel):
        def read_service_stats(self):
            raise KernelTransient("no", "read_service_stats")

    h = Harness(kernel=Failing())
    errors: list[str] = []
    traffic = ServiceTraffic(
        h.fake, ServiceMetricsMode.ALL, on_error=lambda e: errors.append(e.operation)
    )
    h.feed.subscribe(Subscriptions(service=traffic.on_service))
    h.start([web()], [slice_of()])
    assert traffic.read() == ([], 0) and traffic.read() == ([], 0)
    assert errors == ["read_service_stats"] * 2
    assert sum("counters unreadable" in r.message for r in caplog.records) == 1


def test_the_counters_come_through_netlink_in_one_service_dump():
    model = IPVSModel()
    kernel = NetlinkKernel(sockets=model_sockets(model), create_interface=False)
    h = Harness(kernel=kernel)
    traffic = ServiceTraffic(kernel, ServiceMetricsMode.ALL)
    h.feed.subscribe(Subscriptions(service=traffic.on_service))
    h.start([web(), web("db", "10.96.0.11")], [slice_of(), slice_of("db")])
    model.table.add_traffic(vs(), TRAFFIC)
    dumps = model.service_dumps
    assert series(traffic)[WEB] == TRAFFIC
    assert model.service_dumps == dumps + 1


# --- the daemon -----------------------------------------------------------------------------
def _daemon(tmp_path: Path, kernel: FakeKernel, mode: ServiceMetricsMode) -> Daemon:
    (tmp_path / "m").mkdir()
    write(tmp_path / "m", "web.yaml", web(annotations=ON), slice_of())
    opts = DaemonOptions(
        node=NodeContext("node-a", ("192.0.2.10",)),
        source=SourceOptions(manifests=str(tmp_path / "m")),
        drain=DrainOptions(state_dir=str(tmp_path / "state")),
        http=HTTPOptions(listen="127.0.0.1:0"),
        metrics=MetricsOptions(service_metrics=mode),
    )
    return Daemon(
        opts,
        kernel,
        ManifestSource(tmp_path / "m", interval=0.05),
        loop_config=LoopConfig(idle_wakeup=0.05),
    )


def test_a_scrape_shows_the_series_without_taking_the_loops_lock(tmp_path):
    kernel = FakeKernel()
    d = _daemon(tmp_path, kernel, ServiceMetricsMode.ANNOTATED)
    d.start()
    try:
        wait_for(lambda: vs() in kernel.services and d.view.started)
        wait_for(lambda: (t := d.part(ServiceTraffic)) is not None and t.read()[0])
        kernel.add_traffic(vs(), TRAFFIC)
        base = f"http://127.0.0.1:{d.http.port}"
        with d.loop.lock:  # the loop busy: a scrape still answers
            done = threading.Event()
            out: list[str] = []
            threading.Thread(
                target=lambda: (out.append(get(base + "/metrics")[1]), done.set())
            ).start()
            assert done.wait(10)
        text = out[0]
        labels = 'namespace="default",port="http",protocol="TCP",service="web"'
        assert f'ipvsctl_service_bytes_total{{direction="out",{labels}}} 9000.0' in text
        assert f"ipvsctl_service_connections_total{{{labels}}} 3.0" in text
    finally:
        d.shutdown()


def test_none_reads_nothing_and_exports_no_series(tmp_path):
    kernel = FakeKernel()
    d = _daemon(tmp_path, kernel, ServiceMetricsMode.NONE)
    d.start()
    try:
        wait_for(lambda: vs() in kernel.services and d.view.started)
        text = get(f"http://127.0.0.1:{d.http.port}/metrics")[1]
        assert d.part(ServiceTraffic) is None and kernel.stats_reads == 0
        assert "ipvsctl_service_bytes_total{" not in text
        assert "ipvsctl_service_metrics_dropped 0.0" in text
    finally:
        d.shutdown()


@pytest.mark.parametrize(
    ("bad", "said"),
    [
        (["--service-metrics", "some"], "must be none, annotated or all"),
        (["--service-metrics-max-series", "-1"], "must be >= 0"),
    ],
)
def test_bad_flags_exit_2(tmp_path, bad, said):
    from typer.testing import CliRunner

    from ipvsctl.cli.app import app

    r = CliRunner().invoke(app, ["run", "--manifests", str(tmp_path), *bad])
    assert r.exit_code == 2 and said in r.output, r.output

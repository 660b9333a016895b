"""Per-Service traffic metrics on the real kernel: requests through an annotated Service's
ClusterIP make its connection, packet and byte counters grow in a scrape of the daemon's
/metrics, a Service without the annotation has none, and the shipped dashboard's per-Service
queries name series (and group by labels) that this scrape has."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from devkit.builders import endpoint, endpoint_slice, service
from devkit.fakeapi.server import FakeAPIServer
from devkit.labkit import Node, Pod, daemon_get, wait_for
from ipvsctl.kernel.netlink import wire
from ipvsctl.kube.client import KubeSource
from ipvsctl.kube.settings import KubeSettings
from ipvsctl.model import Protocol, ServiceKey, ServiceStats

pytestmark = pytest.mark.lab

DASHBOARD = Path(__file__).resolve().parents[2] / "daemonset/monitoring/grafana-dashboard.json"
WEB_VIP, DB_VIP = "10.96.0.10", "10.96.0.11"
# labels Prometheus adds to every series of the target (not in the exposition itself)
TARGET_LABELS = {"node", "instance", "job"}


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    out = []
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)$", line)
        if m:
            out.append(
                (
                    m.group(1),
                    dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or "")),
                    float(m.group(3)),
                )
            )
    return out


def value(text: str, name: str, **labels: str) -> float:
    return sum(v for n, lab, v in samples(text) if n == name and labels.items() <= lab.items())


@pytest.fixture
def api() -> Iterator[FakeAPIServer]:
    with FakeAPIServer() as server:
        yield server


def test_an_annotated_services_traffic_grows_in_a_scrape_and_feeds_the_dashboard(
    node: Node, client: Pod, api: FakeAPIServer, make_daemon: Callable[..., Any]
) -> None:
    pods = [node.make_pod("10.244.1.1", name="web-1"), node.make_pod("10.244.1.2", name="web-2")]
    eps = [endpoint(p.ip, pod=p.name) for p in pods]
    api.add(service("web", WEB_VIP, annotations={"ipvsctl.io/metrics": "true"}))
    api.add(endpoint_slice("web", eps))
    api.add(service("db", DB_VIP))  # not annotated: no series
    api.add(endpoint_slice("db", eps))
    source = KubeSource.from_config(
        apiserver=api.url,
        settings=KubeSettings(backoff_initial=0.05, backoff_max=0.5, healthy_watch_seconds=0.05),
    )
    d = make_daemon(node, source)
    wait_for(lambda: d.engine.started, timeout=180, what="the daemon's first sync")
    web = {"namespace": "default", "service": "web", "port": "http", "protocol": "TCP"}

    def scrape() -> str:
        code, text = daemon_get(node, d, "/metrics")
        assert code == 200
        return text

    def scraped_with_web() -> str | None:
        text = scrape()
        return text if 'service="web"' in text else None

    before = wait_for(scraped_with_web, what="web's series")
    answered = [client.request(WEB_VIP, 80) for _ in range(6)]
    assert set(answered) == {"web-1", "web-2"}
    client.request(DB_VIP, 80)

    def connections(text: str) -> float:
        return value(text, "ipvsctl_service_connections_total", **web) - value(
            before, "ipvsctl_service_connections_total", **web
        )

    def scraped_after_traffic() -> str | None:
        text = scrape()
        return text if connections(text) >= 6 else None

    # The kernel folds its per-CPU counters into what netlink reports every 2 s (the rate
    # estimator's timer), as ipvsadm --stats shows them: wait for that, not for a time.
    after = wait_for(scraped_after_traffic, timeout=120, what="the counters to catch up")
    assert connections(after) == 6
    for name in ("ipvsctl_service_packets_total", "ipvsctl_service_bytes_total"):
        for direction in ("in", "out"):
            grew = value(after, name, **web, direction=direction) - value(
                before, name, **web, direction=direction
            )
            assert grew > 0, (name, direction)
    # the replies carry the pods' names: bytes out at least that much, in TCP segments
    assert value(after, "ipvsctl_service_bytes_total", **web, direction="out") > 6 * 40
    assert 'service="db"' not in after

    # the parser reads what ipvsadm reads from the same kernel (its own netlink decoding),
    # between two equal ipvsadm reads (the 2 s refresh could fold in a last ACK meanwhile)
    def ipvsadm_row() -> list[int]:
        out = node.run("ipvsadm", "-Ln", "--stats", "--exact", "-t", f"{WEB_VIP}:80")
        return [
            int(x) for x in next(ln.split() for ln in out.splitlines() if ln.startswith("TCP"))[2:7]
        ]

    def read_between_equal_rows() -> tuple[list[int], ServiceStats] | None:
        first = ipvsadm_row()
        stats = node.kernel.read_service_stats()[ServiceKey(Protocol.TCP, WEB_VIP, 80)]
        return (first, stats) if ipvsadm_row() == first else None

    misses = wire._key_of.cache_info().misses
    ipvsadm, stats = wait_for(read_between_equal_rows, what="two equal ipvsadm reads")
    # the real kernel's messages take the parser's fast path: the scrapes cached their keys
    # (misses), this read found them all (no new miss)
    assert misses > 0 and wire._key_of.cache_info().misses == misses
    assert ipvsadm == [
        stats.conns,
        stats.in_packets,
        stats.out_packets,
        stats.in_bytes,
        stats.out_bytes,
    ]
    assert stats.conns == value(after, "ipvsctl_service_connections_total", **web)
    assert value(after, "ipvsctl_service_metrics_dropped") == 0
    assert not any(lab.keys() & {"address", "vip", "service_vip"} for _, lab, _ in samples(after))

    # the dashboard's per-Service row queries what this scrape has
    panels = json.loads(DASHBOARD.read_text())["panels"]
    row = next(i for i, p in enumerate(panels) if p["title"].startswith("Per-Service traffic"))
    end = next((i for i in range(row + 1, len(panels)) if panels[i]["type"] == "row"), len(panels))
    queried = [t["expr"] for p in panels[row + 1 : end] for t in p["targets"]]
    assert len(queried) >= 4
    have = {n: lab for n, lab, _ in samples(after) if n.startswith("ipvsctl_service_")}
    web_names = {n for n, lab, _ in samples(after) if lab.get("service") == "web"}
    for expr in queried:
        names = set(re.findall(r"\b(ipvsctl_service_[a-z_]+)\b", expr))
        assert names and names <= set(have), (expr, names - set(have))
        for by in re.findall(r"by \(([^)]*)\)", expr):
            wanted = {label.strip() for label in by.split(",")} - TARGET_LABELS
            for n in names - {"ipvsctl_service_metrics_dropped"}:
                assert n in web_names, (expr, n)
                assert wanted <= have[n].keys(), (expr, n, wanted - have[n].keys())

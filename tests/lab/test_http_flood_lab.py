"""The kubelet's probes under a scrape flood, on the real kernel: the real `ipvsctl run`, in
a node's network namespace, programs 200 Services that opted in to per-Service metrics;
64 connections scrape /metrics back to back from four addresses of a host off the node
(16 each: within the per-peer bound, none refused or evicted by it), from a process of
their own (devkit/httpflood.py). Meanwhile /healthz and /readyz on --listen and /healthz
on --healthz-bind-address, asked from the node itself as the kubelet asks them, answer 200
all along, far inside the DaemonSet's 5 s probe timeout, and the scrapes share renderings.

Rendered per request on the workers that also answered the probes, the same flood kept
/healthz waiting longer than the probe timeout: the kubelet restarted the daemon in a loop.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from devkit.fakeapi import objects
from devkit.httpflood import probe, summary
from devkit.labkit import Node, http_get, wait_for
from ipvsctl.kernel.netns import run_in_netns
from tests.lab.netkit import NODE_LAN, Outside

pytestmark = pytest.mark.lab

BIN = Path(sys.executable).parent
PORT, HEALTH_PORT = 19796, 10256
SOURCES = ["192.168.50.2", "192.168.50.3", "192.168.50.4", "192.168.50.5"]
PROBE_TIMEOUT = 5.0  # the DaemonSet's livenessProbe and readinessProbe timeoutSeconds


def cluster_manifest(folder: Path, services: int, endpoints: int) -> None:
    items = []
    for obj in objects.cluster(services, endpoints):
        if obj["kind"] == "Service":
            obj["metadata"].setdefault("annotations", {})["ipvsctl.io/metrics"] = "true"
        items.append(obj)
    tmp = folder / ".cluster.tmp"
    tmp.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    tmp.rename(folder / "cluster.json")


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def test_probes_answer_under_a_scrape_flood_from_four_addresses(node: Node, tmp_path: Path) -> None:
    folder = tmp_path / "manifests"
    folder.mkdir()
    cluster_manifest(folder, 200, 2)
    outside = Outside(node)
    outside.netns.ip_batch([f"addr add {a}/24 dev eth0" for a in SOURCES[1:]])
    log = open(tmp_path / "run.log", "w")  # noqa: SIM115 - closed below
    daemon = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            node.name,
            str(BIN / "ipvsctl"),
            "run",
            "--manifests",
            str(folder),
            "--state-dir",
            str(tmp_path / "state"),
            "--listen",
            f"0.0.0.0:{PORT}",
            "--healthz-bind-address",
            f"0.0.0.0:{HEALTH_PORT}",
            "--node-name",
            "node-a",
            "--node-ip",
            NODE_LAN,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    flood: subprocess.Popen[str] | None = None
    url = f"http://127.0.0.1:{PORT}"

    def connect(port: int) -> socket.socket:
        return run_in_netns(
            node.name, lambda: socket.create_connection(("127.0.0.1", port), timeout=30)
        )

    try:

        def ready() -> bool:
            assert daemon.poll() is None, (tmp_path / "run.log").read_text()[-3000:]
            try:
                return http_get(url + "/readyz", node.name, timeout=10)[0] == 200
            except OSError:
                return False

        wait_for(ready, timeout=900, interval=1.0, what="the daemon ready with 200 Services")
        assert len(node.ipvsadm()) == 200
        flood = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                outside.netns.name,
                sys.executable,
                "-m",
                "devkit.httpflood",
                "--host",
                NODE_LAN,
                "--port",
                str(PORT),
                "--sources",
                ",".join(SOURCES),
                "--seconds",
                "90",
            ],
            stdout=subprocess.PIPE,
            text=True,
        )

        def flooding() -> bool:
            out = node.run("ss", "-Htn", "state", "established", f"( sport = :{PORT} )")
            return len(out.splitlines()) >= 48

        wait_for(flooding, timeout=120, interval=0.5, what="the flood's 64 connections")
        renders_before = metric(
            http_get(url + "/metrics", node.name)[1], "ipvsctl_metrics_renders_total"
        )
        times: dict[str, list[float]] = {}
        codes: dict[str, dict[int, int]] = {}
        for _ in range(3):  # the three probes, interleaved over ~30 s
            for name, port, path in (
                ("healthz", PORT, "/healthz"),
                ("readyz", PORT, "/readyz"),
                ("proxy-healthz", HEALTH_PORT, "/healthz"),
            ):
                t, c = probe(lambda p=port: connect(p), path, seconds=3.0, interval=0.2)
                times.setdefault(name, []).extend(t)
                for k, v in c.items():
                    codes.setdefault(name, {}).setdefault(k, 0)
                    codes[name][k] += v
        stats = {name: summary(t) for name, t in times.items()}
        print(f"probes under the flood (ms): {json.dumps(stats)} codes: {codes}")
        for name, c in codes.items():
            assert set(c) == {200}, (name, c)
        for name, t in times.items():
            assert len(t) >= 10, (name, stats[name])
            assert max(t) < PROBE_TIMEOUT / 2, (name, stats[name])
        assert flood.poll() is None, "the flood ended before the probes"
        text = http_get(url + "/metrics", node.name)[1]
        renders = metric(text, "ipvsctl_metrics_renders_total") - renders_before
        flood.terminate()
        flood.wait(60)
        flood = None
        refused = [ln for ln in text.splitlines() if ln.startswith("ipvsctl_http_refused_total{")]
        assert not [ln for ln in refused if 'server="daemon"' in ln and not ln.endswith(" 0.0")]
        print(
            f"renderings during the probes: {renders}, last took "
            f"{metric(text, 'ipvsctl_metrics_render_seconds'):.3f}s"
        )
        assert renders >= 1
    finally:
        if flood is not None:
            flood.kill()
            flood.wait()
        daemon.terminate()
        try:
            daemon.wait(120)
        finally:
            log.close()
            outside.close()

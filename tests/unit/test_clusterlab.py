"""The cluster lab's pure parts: what its control plane publishes (slices as the EndpointSlice
controller writes them, read back by ipvsctl's own rules), the load balancer's health rule,
and how a scenario's records are counted. The lab itself runs in tests/lab/test_cluster_lab.py
and `make cluster-lab`."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from clusterlab import kube
from clusterlab.lb import HealthPolicy, next_health
from clusterlab.load import StreamRecord, Streams, UdpRecord
from clusterlab.report import (
    longest_stall,
    markdown_table,
    percentile,
    prestops,
    summarise,
    udp_verdicts,
)
from clusterlab.scenarios import cpu_used
from demo.clients import Record

BIN = Path(sys.executable).parent
WEB = kube.ServiceSpec(
    "web", "web", "10.96.0.10", (kube.PortSpec("http", 80, 8080, node_port=30080),), "NodePort"
)


def ep(pod: str, zone: str, *, ready: bool = True, serving: bool = True, term: bool = False):
    return kube.EndpointState(
        pod, f"uid-{pod}", f"10.244.0.{len(pod)}", "node-1", zone, ready, serving, term
    )


# --- what the control plane publishes ------------------------------------------------------
def test_a_terminating_pod_stays_in_the_slice_not_ready_with_its_serving_state() -> None:
    obj = kube.endpoint_slice(
        WEB, [ep("a", "zone-a"), ep("b", "zone-b", ready=False, serving=True, term=True)]
    )
    conds = {e["targetRef"]["name"]: e["conditions"] for e in obj["endpoints"]}
    assert conds == {
        "a": {"ready": True, "serving": True, "terminating": False},
        "b": {"ready": False, "serving": True, "terminating": True},
    }
    assert obj["metadata"]["labels"]["kubernetes.io/service-name"] == "web"
    assert obj["ports"] == [{"name": "http", "protocol": "TCP", "port": 8080}]


def test_prefer_close_hints_every_ready_endpoint_for_its_own_zone_only() -> None:
    spec = kube.ServiceSpec(**{**WEB.__dict__, "traffic_distribution": kube.PREFER_CLOSE})
    obj = kube.endpoint_slice(
        spec, [ep("a", "zone-a"), ep("b", "zone-b"), ep("c", "zone-c", ready=False, term=True)]
    )
    hints = {e["targetRef"]["name"]: e.get("hints") for e in obj["endpoints"]}
    assert hints == {
        "a": {"forZones": [{"name": "zone-a"}]},
        "b": {"forZones": [{"name": "zone-b"}]},
        "c": None,  # not ready: the controller's heuristic leaves it unhinted
    }
    assert "hints" not in kube.endpoint_slice(WEB, [ep("a", "zone-a")])["endpoints"][0]


def plan(tmp_path: Path, spec: kube.ServiceSpec, eps: list[kube.EndpointState]) -> set[str]:
    """`ipvsctl plan` as node-1 (zone-a) for the lab's objects: its cluster IP's real servers."""
    node = kube.node_object(kube.NodeSpec("node-1", "192.168.50.11", "zone-a", "10.244.1.0/24"))
    docs = [kube.service_object(spec), kube.endpoint_slice(spec, eps), node]
    path = tmp_path / "objects.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}))
    out = subprocess.run(
        [str(BIN / "ipvsctl"), "plan", "-f", str(path), "--node-name", "node-1", "--json"],
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    (vs,) = [v for v in json.loads(out.stdout)["virtual_servers"] if v["address"] == "10.96.0.10"]
    return {r["address"] for r in vs["real_servers"]}


def test_the_published_objects_mean_to_ipvsctl_what_the_lab_intends(tmp_path: Path) -> None:
    """Read back by ipvsctl's own rules: node-1 (zone-a) uses only its zone's endpoint with
    PreferClose, every ready one without; a terminating one takes nothing new."""
    eps = [ep("a", "zone-a"), ep("bb", "zone-b"), ep("ccc", "zone-c", ready=False, term=True)]
    close = kube.ServiceSpec(**{**WEB.__dict__, "traffic_distribution": kube.PREFER_CLOSE})
    assert plan(tmp_path, close, eps) == {"10.244.0.1"}
    assert plan(tmp_path, WEB, eps) == {"10.244.0.1", "10.244.0.2"}


@pytest.mark.parametrize(
    ("healthy", "streak", "ok", "want"),
    [
        (False, 0, True, (False, 1)),  # one good probe is not enough to rise
        (False, 1, True, (True, 0)),
        (True, 0, False, (True, 1)),
        (True, 1, False, (False, 0)),
        (True, 1, True, (True, 0)),  # a good probe resets the count of bad ones
        (False, 1, False, (False, 0)),
    ],
)
def test_the_load_balancer_needs_rise_or_fall_probes_in_a_row(
    healthy: bool, streak: int, ok: bool, want: tuple[bool, int]
) -> None:
    assert next_health(healthy, streak, ok, HealthPolicy(rise=2, fall=2)) == want


def test_the_service_object_carries_its_node_port_selector_and_distribution() -> None:
    spec = kube.ServiceSpec(**{**WEB.__dict__, "traffic_distribution": kube.PREFER_CLOSE})
    obj = kube.service_object(spec)
    assert obj["spec"]["ports"][0]["nodePort"] == 30080
    assert obj["spec"]["selector"] == {"app": "web"}
    assert obj["spec"]["trafficDistribution"] == "PreferClose"
    assert obj["spec"]["externalTrafficPolicy"] == "Cluster"
    assert "trafficDistribution" not in kube.service_object(WEB)["spec"]


# --- counting ----------------------------------------------------------------------------------
def req(start: float, ok: bool = True, error: str | None = None, connect: float | None = 0.001):
    return Record(start, start + 0.2, ok, error, "p" if ok else None, connect=connect)


def stream(start: float, outcome: str = "complete", pod: str | None = "p") -> StreamRecord:
    return StreamRecord(
        "node-1", start, start + 8, pod, 16 if outcome == "complete" else 3, 16, outcome
    )


def test_every_failure_counts_with_its_time_and_kind() -> None:
    s = summarise(
        [
            ("node-1", req(10.0)),
            ("node-2", req(11.0, False, "refused")),
            ("outside", req(12.5, False, "reset")),
        ],
        [stream(10.0), stream(10.0, "stalled"), stream(13.0, "refused", pod=None)],
        [],
        t0=10.0,
    )
    assert (s.requests, s.failed, s.resets, s.streams, s.cut_streams) == (3, 3, 1, 3, 1)
    assert s.failed_by_kind == {"refused": 2, "reset": 1}
    assert [(f.t, f.client, f.what, f.kind) for f in s.failures] == [
        (1.0, "node-2", "request", "refused"),
        (2.5, "outside", "request", "reset"),
        (3.0, "node-1", "stream", "refused"),
        (8.0, "node-1", "cut stream", "stalled"),
    ]
    assert not s.clean


def test_failures_in_an_expected_window_are_counted_apart_never_dropped() -> None:
    s = summarise(
        [("node-1", req(5.0, False, "refused")), ("node-1", req(9.0, False, "refused"))],
        [stream(5.5, "refused", pod=None), stream(1.0, "reset")],
        [UdpRecord("node-1", "q1", 5.0, 6.0, False, None, False)],
        t0=0.0,
        expected=[(4.0, 6.0)],
    )
    assert (s.failed, s.expected_failed, s.udp_failed, s.udp_expected_failed) == (1, 2, 0, 1)
    assert s.cut_streams == 1 and s.resets == 1  # a cut stream is never "expected"


def test_a_clean_run_is_clean_and_its_p99_is_the_nearest_rank() -> None:
    short = [("node-1", req(float(i), connect=i / 1000)) for i in range(1, 201)]
    s = summarise(
        short, [stream(0.0)], [UdpRecord("node-1", "q1", 0, 0.01, True, "p", True)], t0=0.0
    )
    assert s.clean and s.failures == []
    assert s.connect_p99_ms == 198.0
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0 and percentile([], 99) is None


def test_the_longest_udp_stall_runs_from_the_first_failure_to_the_next_answer() -> None:
    q = [
        UdpRecord("c", "q", 0.0, 0.01, True, "p", False),
        UdpRecord("c", "q", 1.0, 2.0, False, None, False),
        UdpRecord("c", "q", 1.5, 2.5, False, None, True),
        UdpRecord("c", "q", 3.0, 3.2, True, "p", True),
        UdpRecord("c", "q", 4.0, 5.0, False, None, False),
    ]
    assert longest_stall(q) == 2.2
    assert longest_stall(q[:3]) == 1.5  # none answered after: until the last one ended


def test_the_table_has_a_row_per_scenario_and_both_modes() -> None:
    on = summarise([("n", req(0.0))], [stream(0.0)], [], 0.0).to_json()
    off = summarise(
        [("n", req(0.0, False, "refused"))], [stream(0.0, "stalled")], [], 0.0
    ).to_json()
    table = markdown_table([{"scenario": "rollout", "ipvsctl": on, "nodrain": off}])
    assert "| rollout | 0 / 0 / 0 / 1 ms | 1 / 0 / 1 / 1 ms | 1 req, 1 streams |" in table


def test_cpu_of_a_restarted_daemon_is_its_new_process_not_a_difference() -> None:
    before = {"harness": (1, 10.0), "node-1": (100, 5.0), "node-2": (200, 7.0), "node-3": None}
    after = {"harness": (1, 12.5), "node-1": (100, 6.0), "node-2": (201, 3.0), "node-3": (300, 1.0)}
    assert cpu_used(before, after) == {
        "harness": 2.5,
        "node-1": 1.0,
        "node-2": "3.0 (new process)",
        "node-3": "1.0 (new process)",
    }


def test_an_unanswered_query_is_lost_late_or_unanswered_as_the_pods_saw_it() -> None:
    def q(sent: float, pod: str | None, late: float | None) -> dict[str, object]:
        return {"sent": sent, "received_by": pod, "late_answer_at": late}

    diagnosis = [
        q(1.0, None, None),
        q(2.0, "dns-1", 4.5),
        q(3.0, "dns-2", None),
        q(9.0, None, None),
    ]
    assert udp_verdicts(diagnosis) == {"lost": 2, "late": 1, "unanswered": 1}
    assert udp_verdicts(diagnosis, [(8.0, 10.0)]) == {"lost": 1, "late": 1, "unanswered": 1}


def test_prestops_count_drained_and_timed_out_and_the_longest_wait() -> None:
    pods = [
        {"prestop_start": 1.0, "prestop_end": 3.5, "prestop_answer": {"outcome": "drained"}},
        {"prestop_start": 2.0, "prestop_end": 27.0, "prestop_answer": {"outcome": "timeout"}},
        {
            "prestop_start": None,
            "prestop_end": None,
            "prestop_answer": None,
            "killed_connections": 2,
        },
    ]
    assert prestops(pods) == {"drained": 1, "timeout": 1, "longest_s": 25.0, "killed": 2}
    assert prestops([]) == {"drained": 0, "timeout": 0, "longest_s": None, "killed": 0}


def serve_stream(head_after: float, gap: float) -> tuple[socket.socket, threading.Thread]:
    """One `/stream` answer on loopback: its head after `head_after` s, then two lines with
    `gap` s after each, then the server's close."""
    srv = socket.create_server(("127.0.0.1", 0))

    def run() -> None:
        conn, _ = srv.accept()
        with conn:
            conn.recv(4096)
            time.sleep(head_after)
            conn.sendall(b"HTTP/1.1 200 OK\r\nX-Pod: web-1\r\n\r\n")
            for _ in range(2):
                conn.sendall(b"line\n")
                time.sleep(gap)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return srv, t


def test_a_stream_is_given_a_requests_timeout_for_its_answer_and_the_stall_between_lines() -> None:
    srv, t = serve_stream(head_after=0.4, gap=0.01)  # a slow answer, longer than the stall
    port = srv.getsockname()[1]
    streams = Streams("c", "", "127.0.0.1", port, time.monotonic, length=0.1, every=0.05)
    streams.stall, streams.answer_timeout = 0.2, 3.0
    rec = streams.one()
    t.join(5)
    srv.close()
    assert (rec.outcome, rec.pod, rec.lines) == ("complete", "web-1", 2)

    srv, t = serve_stream(head_after=0.0, gap=0.6)  # answered, then silent past the stall
    streams.port = srv.getsockname()[1]
    rec = streams.one()
    t.join(5)
    srv.close()
    assert (rec.outcome, rec.pod, rec.cut) == ("stalled", "web-1", True)

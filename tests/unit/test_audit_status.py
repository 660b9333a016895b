"""Drift audit and status joins on the in-memory kernel."""

from __future__ import annotations

from devkit.builders import endpoint, endpoint_slice, service
from devkit.harness import Harness, rs, vs
from ipvsctl.cli.status import join_status, render_status
from ipvsctl.daemon.status_json import engine_status, quiesced_json
from ipvsctl.model import RealServerStatus, VirtualServer, VirtualServerStatus

A, B = "10.244.1.5", "10.244.1.6"


def started(**kw):
    h = Harness(**kw)
    h.start(
        [service("web")],
        [endpoint_slice("web", [endpoint(A, pod="web-1"), endpoint(B, pod="web-2")])],
    )
    h.ops()
    return h


def audit_all(h):
    for _ in range(5):
        h.audit()
        h.engine.sync()


def test_audit_puts_back_what_was_changed_by_hand():
    h = started()
    h.fake.set_real_server_weight(vs(), rs(A), 5)
    h.fake.delete_real_server(vs(), rs(B))
    h.fake.add_real_server(vs(), rs("10.9.9.9"), 1)
    h.fake.add_virtual_server(VirtualServer(vs("10.96.7.7")), True)
    h.fake.take_ops()
    audit_all(h)
    assert h.fake.dump() == (
        "10.96.0.10:80/TCP rr\n"
        "  -> 10.244.1.5:8080 weight 1 active 0 inactive 0\n"
        "  -> 10.244.1.6:8080 weight 1 active 0 inactive 0\n"
        "  -> 10.9.9.9:8080 weight 0 active 0 inactive 0\n"  # unknown one drains, not cut
    )
    assert h.metrics.value("ipvsctl_drift_repairs_total", {"kind": "real_server_changed"}) == 3
    h.check(0)
    assert h.fake.weight(vs(), rs("10.9.9.9")) is None


def test_audit_recreates_a_deleted_virtual_server():
    h = started()
    h.fake.delete_virtual_server(vs(), True)
    audit_all(h)
    assert h.fake.weight(vs(), rs(A)) == 1 and h.fake.weight(vs(), rs(B)) == 1


def test_audit_leaves_draining_real_servers_alone():
    h = started()
    h.fake.set_connections(vs(), rs(A), active=1)
    h.upsert(endpoint_slice("web", [endpoint(B)]))
    h.ops()
    audit_all(h)
    assert h.ops() == [] and len(h.engine.drains.queue) == 1


def test_audit_spreads_work_over_steps():
    h = Harness()
    h.engine.audit.batch = 10
    h.start([service(f"s{i}", cluster_ip=f"10.96.0.{i + 1}") for i in range(50)], [])
    h.fake.dumps = 0
    h.audit()
    assert h.fake.dumps == 10


def test_status_shows_service_pod_and_drain():
    h = started()
    h.fake.set_connections(vs(), rs(A), active=2)
    h.upsert(endpoint_slice("web", [endpoint(B, pod="web-2")]))
    h.clock.advance(4)
    st = engine_status(h.view)
    (v,) = st["virtual_servers"]
    assert (v["service"], v["port_name"], v["kind"]) == ("default/web", "http", "ClusterIP")
    ra = next(r for r in v["real_servers"] if r["address"] == A)
    assert (ra["weight"], ra["state"], ra["pod"]) == (0, "draining", "default/web-1")
    assert ra["drain"]["age"] == 4 and ra["drain"]["time_left"] == 26
    assert ra["active_conns"] is None  # not read yet
    h.check(0)
    st = engine_status(h.view)
    ra = next(r for r in st["virtual_servers"][0]["real_servers"] if r["address"] == A)
    assert (ra["active_conns"], ra["inactive_conns"]) == (2, 0)

    kernel = [
        VirtualServerStatus(
            VirtualServer(vs()),
            (RealServerStatus(rs(A), 0, 2, 0), RealServerStatus(rs(B), 1, 0, 0)),
        )
    ]
    doc = join_status(kernel, None, st, None, "http://x")
    r = doc["virtual_servers"][0]["real_servers"][0]
    assert (r["active_conns"], r["state"], r["drain"]["reason"]) == (2, "draining", "removed")
    text = render_status(doc)
    assert "default/web:http" in text and "DRAINING (removed" in text


def test_status_without_daemon_still_shows_the_kernel():
    kernel = [VirtualServerStatus(VirtualServer(vs()), (RealServerStatus(rs(A), 1, 3, 1),))]
    doc = join_status(kernel, None, None, "daemon not reachable at http://x: refused", "http://x")
    assert doc["daemon"]["reachable"] is False
    assert doc["virtual_servers"][0]["real_servers"][0]["active_conns"] == 3
    assert "NOT REACHABLE" in render_status(doc)


def test_quiesced_reports_when_a_pod_ip_stops_getting_new_connections():
    h = Harness()
    svc2 = service("api", cluster_ip="10.96.0.11")
    h.start(
        [service("web"), svc2],
        [endpoint_slice("web", [endpoint(A), endpoint(B)]), endpoint_slice("api", [endpoint(A)])],
    )
    assert quiesced_json(h.view, A)["quiesced"] is False
    assert quiesced_json(h.view, A)["real_servers_with_weight"] == 2
    h.fake.set_connections(vs(), rs(A), active=1)
    h.upsert(endpoint_slice("web", [endpoint(B)]))
    assert quiesced_json(h.view, A)["quiesced"] is False  # still live behind "api"
    h.clock.advance(2)
    h.upsert(endpoint_slice("api", []))
    q = quiesced_json(h.view, A)
    assert q["quiesced"] is True and q["since"] == h.clock.wall()
    h.clock.advance(3)
    assert quiesced_json(h.view, A)["for_seconds"] == 3
    assert quiesced_json(h.view, "10.1.1.1") == {
        "ip": "10.1.1.1",
        "node": "node-a",
        "ready": True,
        "quiesced": True,
        "real_servers_with_weight": 0,
        "since": None,
        "for_seconds": None,
    }

"""CONTRACT.md "Draining", the virtual server bullets: a virtual server that
leaves the wanted set drains as its real servers do, on the in-memory kernel."""

from __future__ import annotations

import json
from pathlib import Path

from devkit.builders import endpoint, endpoint_slice, service, terminating
from devkit.harness import Harness, rs, vs
from ipvsctl.daemon.status_json import engine_status, quiesced_json
from ipvsctl.model import NO_DEADLINE, DeadlineSource, DrainReason, ServiceRef, VirtualServer
from ipvsctl.persist.drain_state import DrainStateFile, parse_state
from ipvsctl.reconcile.feed import Subscriptions

A, B, C = "10.244.1.5", "10.244.1.6", "10.244.2.7"
WEB = ServiceRef("default", "web")
DNS = {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 5353}
HTTP = {"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}
SLICE_PORTS = [
    {"name": "http", "port": 8080, "protocol": "TCP"},
    {"name": "dns", "port": 5353, "protocol": "UDP"},
]


def web(name="web", **kw):
    return service(name, ports=[HTTP, DNS], **kw)


def slice_of(*addresses, svc="web", name="web-abc"):
    eps = [endpoint(a, pod=f"pod-{a[-1]}") for a in addresses]
    return endpoint_slice(svc, eps, name=name, ports=SLICE_PORTS)


def started(*addresses, timeout=30.0, svc=None):
    h = Harness(service_drain_timeout=timeout)
    h.start([svc or web()], [slice_of(*addresses)])
    h.ops()
    return h


def delete_web(h):
    h.delete(web(), sync=False)
    h.delete(slice_of(), sync=False)
    h.engine.sync()


def test_a_deleted_services_virtual_server_drains_and_goes_with_its_last_real_server():
    h = started(A, B)
    h.fake.set_connections(vs(), rs(A), active=1, inactive=0)
    delete_web(h)
    assert h.ops() == [
        "set-rs 10.96.0.10:80/TCP -> 10.244.1.5:8080 weight 0",
        "set-rs 10.96.0.10:80/TCP -> 10.244.1.6:8080 weight 0",
        # UDP as its real servers always were: at once, conntrack entries with them
        "del-rs 10.96.0.10:53/UDP -> 10.244.1.5:5353",
        "flush-conntrack 10.96.0.10:53/UDP -> 10.244.1.5:5353",
        "del-rs 10.96.0.10:53/UDP -> 10.244.1.6:5353",
        "flush-conntrack 10.96.0.10:53/UDP -> 10.244.1.6:5353",
        "del-vs 10.96.0.10:53/UDP",
    ]
    assert "10.96.0.10" in h.fake.bound  # still bound: the TCP one drains on it
    assert h.engine.drains.draining_virtual_servers == {vs(): WEB}
    entry = h.engine.drains.queue.get(vs(), rs(A))
    assert entry.reason is DrainReason.VIRTUAL_SERVER_REMOVED and entry.vs_draining
    assert entry.deadline == h.clock.wall() + 30 and entry.pod is not None  # pod from before
    assert h.deletions("udp") == 2 and h.deletions("service_deleted") == 0

    h.check(1)  # the idle one goes; the virtual server stays for the other
    assert h.ops() == ["del-rs 10.96.0.10:80/TCP -> 10.244.1.6:8080"]
    h.fake.set_connections(vs(), rs(A), active=0, inactive=0)
    h.check(1)
    assert h.ops() == ["del-rs 10.96.0.10:80/TCP -> 10.244.1.5:8080", "del-vs 10.96.0.10:80/TCP"]
    assert "10.96.0.10" not in h.fake.bound
    assert not h.engine.drains.draining_virtual_servers and not h.engine.state.by_service
    assert h.engine.state.n_vs == 0 and h.engine.state.owner == {}
    assert h.deletions("drained") == 2 and h.deletions("service_deleted") == 0


def test_its_deadline_is_the_deleted_services_last_annotation():
    h = started(A, svc=web(annotations={"ipvsctl.io/drain-timeout": "5s"}))
    h.fake.set_connections(vs(), rs(A), active=1, inactive=0)
    delete_web(h)
    h.ops()
    h.check(4)
    assert h.ops() == []
    h.check(2)
    assert h.ops() == ["del-rs 10.96.0.10:80/TCP -> 10.244.1.5:8080", "del-vs 10.96.0.10:80/TCP"]
    assert h.deletions("deadline") == 1


def test_service_drain_timeout_0_deletes_at_once_as_before():
    h = started(A, timeout=0.0)
    h.fake.set_connections(vs(), rs(A), active=1, inactive=0)
    delete_web(h)
    assert h.ops() == ["del-vs 10.96.0.10:80/TCP", "del-vs 10.96.0.10:53/UDP"]
    assert h.deletions("service_deleted") == 2 and not h.engine.drains.draining_virtual_servers


def test_an_earlier_drains_deadline_is_kept_a_later_one_shortened():
    h = started(A, B, C)
    for a in (A, B, C):
        h.fake.set_connections(vs(), rs(a), active=1, inactive=0)
    # A: removed with a deadline 30 s away; B: terminating, its pod bounds it (no deadline)
    h.upsert(
        endpoint_slice(
            "web",
            [terminating(B, pod="pod-6"), endpoint(C, pod="pod-7")],
            name="web-abc",
            ports=SLICE_PORTS,
        )
    )
    before_a = h.engine.drains.queue.get(vs(), rs(A))
    assert h.engine.drains.queue.get(vs(), rs(B)).deadline == NO_DEADLINE
    h.ops()
    h.clock.advance(20)
    delete_web(h)
    assert "set-rs 10.96.0.10:80/TCP -> 10.244.2.7:8080 weight 0" in h.ops()
    a = h.engine.drains.queue.get(vs(), rs(A))
    b = h.engine.drains.queue.get(vs(), rs(B))
    assert a.deadline == before_a.deadline and a.deadline_source is DeadlineSource.DEFAULT
    assert b.deadline == h.clock.wall() + 30 and b.deadline_source is DeadlineSource.VIRTUAL_SERVER
    assert b.reason is DrainReason.TERMINATING and a.vs_draining and b.vs_draining


def test_a_service_claiming_the_key_takes_it_over_in_place():
    h = started(A)
    h.fake.set_connections(vs(), rs(A), active=1, inactive=0)
    delete_web(h)
    h.ops()
    # another Service, the same cluster IP (re-allocated) and port
    other = service("api", ports=[HTTP])
    h.upsert(other, sync=False)
    h.upsert(
        endpoint_slice("api", [endpoint(C, pod="api-0")], name="api-abc", ports=SLICE_PORTS[:1])
    )
    assert h.ops() == ["add-rs 10.96.0.10:80/TCP -> 10.244.2.7:8080 weight 1"]  # no del/add-vs
    api = ServiceRef("default", "api")
    assert h.engine.state.owner[vs()] == api and not h.engine.drains.draining_virtual_servers
    assert h.fake.weight(vs(), rs(A)) == 0 and (vs(), rs(A)) in h.engine.drains.queue
    assert not h.engine.drains.queue.get(vs(), rs(A)).vs_draining
    assert WEB not in h.engine.state.by_service
    doc = engine_status(h.view)
    assert [(v["service"], v["draining"]) for v in doc["virtual_servers"]] == [(str(api), False)]
    h.fake.set_connections(vs(), rs(A), active=0, inactive=0)
    h.check(1)  # the old one drains out; the virtual server is the new Service's
    assert h.ops() == ["del-rs 10.96.0.10:80/TCP -> 10.244.1.5:8080"]
    assert h.fake.weight(vs(), rs(C)) == 1


def test_the_vip_conflict_rule_still_decides_between_live_claims():
    h = started(A)
    h.fake.set_connections(vs(), rs(A), active=1, inactive=0)
    delete_web(h)
    h.ops()
    older = service("a-old", ports=[HTTP])
    older["metadata"]["creationTimestamp"] = "2020-01-01T00:00:00Z"
    newer = service("b-new", ports=[HTTP], cluster_ip="10.96.0.99", externalIPs=["10.96.0.10"])
    newer["metadata"]["creationTimestamp"] = "2019-01-01T00:00:00Z"
    h.upsert(newer, sync=False)
    h.upsert(older)
    # the cluster IP claim beats the external one, whatever the ages
    assert h.engine.state.owner[vs()] == ServiceRef("default", "a-old")


def test_a_port_removed_drains_its_virtual_server_and_the_service_keeps_the_rest():
    h = started(A)
    h.fake.set_connections(vs(), rs(A), active=1, inactive=0)
    h.upsert(service("web", ports=[DNS]))
    assert h.ops() == ["set-rs 10.96.0.10:80/TCP -> 10.244.1.5:8080 weight 0"]
    doc = engine_status(h.view)
    assert {(v["port"], v["draining"]) for v in doc["virtual_servers"]} == {(80, True), (53, False)}
    h.upsert(web())  # the port comes back: the Service has it again, in place
    assert h.ops() == ["set-rs 10.96.0.10:80/TCP -> 10.244.1.5:8080 weight 1"]
    assert not h.engine.drains.draining_virtual_servers and not len(h.engine.drains)


def test_weight_0_real_servers_of_a_draining_virtual_server_are_quiesced():
    h = started(A)
    h.fake.set_connections(vs(), rs(A), active=1, inactive=0)
    delete_web(h)
    q = quiesced_json(h.view, A)
    assert q["quiesced"] is True and q["real_servers_with_weight"] == 0


def test_the_audit_leaves_a_draining_virtual_server_alone():
    h = started(A)
    h.fake.set_connections(vs(), rs(A), active=1, inactive=0)
    delete_web(h)
    h.ops()
    for _ in range(3):
        assert h.audit() == 0
    assert h.ops() == [] and h.engine.drains.draining_virtual_servers == {vs(): WEB}


def test_a_draining_virtual_server_deleted_by_someone_else_is_forgotten():
    h = started(A)
    h.fake.set_connections(vs(), rs(A), active=1, inactive=0)
    delete_web(h)
    h.fake.delete_virtual_server(vs(), True)
    h.ops()
    h.check(1)  # the drain check finds it gone
    assert not h.engine.drains.draining_virtual_servers and vs() not in h.engine.state.owner
    assert h.engine.state.n_vs == 0


def test_restart_mid_drain_adopts_it_and_the_state_file_carries_it(tmp_path: Path):
    h = started(A)
    h.fake.set_connections(vs(), rs(A), active=1, inactive=0)
    delete_web(h)
    h.ops()
    f = DrainStateFile(tmp_path)
    f.save(h.engine.drains.queue.entries())
    assert json.loads(f.path.read_text())["entries"][0]["vs_draining"] is True
    h2 = Harness(kernel=h.kernel, restored=f.load(), service_drain_timeout=30.0)
    h2.clock.advance(h.clock.wall() - h2.clock.wall() + 3)
    h2.start([], [])
    assert h2.ops() == []  # neither an orphan deleted nor anything set back
    assert h2.engine.drains.draining_virtual_servers == {vs(): WEB}
    assert h2.audit() == 0
    h2.fake.set_connections(vs(), rs(A), active=0, inactive=0)
    h2.check(1)
    assert h2.ops() == ["del-rs 10.96.0.10:80/TCP -> 10.244.1.5:8080", "del-vs 10.96.0.10:80/TCP"]


def test_a_state_file_of_the_version_before_loads_unchanged():
    """Written by the daemon before virtual servers drained (tests/unit/data)."""
    raw = (Path(__file__).parent / "data" / "drain-queue-v1-before-vs-drains.json").read_bytes()
    entries = parse_state(raw)
    assert len(entries) == 3 and not any(e.vs_draining for e in entries)
    encode = json.JSONEncoder(separators=(",", ":")).encode
    text = '{"version":1,"entries":[' + ",".join(encode(e.to_json()) for e in entries) + "]}"
    assert text.encode() == raw.strip()  # and written back byte for byte


def test_nftables_elements_stay_while_the_virtual_server_drains():
    """The port filter keeps covering the still-bound address, masquerading its key."""
    from ipvsctl.netfilter.sync import NetfilterSync

    h = Harness(service_drain_timeout=30.0)
    sync = NetfilterSync(nft=None)  # type: ignore[arg-type]  # never pushed here
    h.feed.subscribe(Subscriptions(service=sync.on_service))
    h.feed.subscribe(Subscriptions(vs_drain=sync.on_virtual_server_drain))
    h.start([web()], [slice_of(A)])
    tcp, udp = vs(), vs("10.96.0.10", 53, "UDP")
    assert set(sync.desired) == {tcp, udp}
    h.fake.set_connections(tcp, rs(A), active=1, inactive=0)
    delete_web(h)
    assert set(sync.desired) == {tcp}  # the UDP one went at once, the draining one stays
    h.upsert(service("api", ports=[HTTP]))  # takes it over: its own element now
    assert sync.owner[tcp] == ServiceRef("default", "api") and not sync.draining
    h.delete(service("api", ports=[HTTP]))
    assert set(sync.desired) == {tcp} and sync.draining == {tcp}
    h.fake.set_connections(tcp, rs(A), active=0, inactive=0)
    h.check(1)
    assert sync.desired == {} and not sync.draining


def test_a_reading_that_missed_a_real_server_never_deletes_the_virtual_server():
    """The drain check forgets a real server it did not see; the virtual server goes only
    once the kernel confirms that none is left."""
    from ipvsctl.plan.ops import ForgetDrain

    h = started(A)
    h.fake.set_connections(vs(), rs(A), active=1, inactive=0)
    delete_web(h)
    h.ops()
    h.engine.applier.apply(WEB, [ForgetDrain(vs(), rs(A))])  # as a reading without it
    assert h.ops() == [] and h.fake.weight(vs(), rs(A)) == 0  # kept, connection and all
    assert h.engine.repaired and WEB in h.engine.dirty
    h.engine.sync()  # its Service's diff drains it again
    assert (vs(), rs(A)) in h.engine.drains.queue and h.engine.drains.queue.get(
        vs(), rs(A)
    ).vs_draining
    h.fake.set_connections(vs(), rs(A), active=0, inactive=0)
    h.check(1)
    assert h.ops() == ["del-rs 10.96.0.10:80/TCP -> 10.244.1.5:8080", "del-vs 10.96.0.10:80/TCP"]


# --- an owned virtual server nobody wants, found at start-up or by the audit ------------
def _left_by_a_daemon_that_went_down(*, conns: int) -> Harness:
    """web's table as a running daemon left it, connections on its TCP real server; then
    the daemon is gone and web is deleted meanwhile (or its state file lost)."""
    h = started(A)
    h.fake.set_connections(vs(), rs(A), active=conns, inactive=0)
    return h


def test_a_restart_drains_a_virtual_server_whose_service_went_while_it_was_down():
    h = _left_by_a_daemon_that_went_down(conns=3)
    h2 = Harness(kernel=h.kernel, service_drain_timeout=30.0)
    h2.start([], [])
    assert h2.ops() == [
        # UDP as a deleted Service's: at once, conntrack entries with it
        "del-rs 10.96.0.10:53/UDP -> 10.244.1.5:5353",
        "flush-conntrack 10.96.0.10:53/UDP -> 10.244.1.5:5353",
        "del-vs 10.96.0.10:53/UDP",
        "set-rs 10.96.0.10:80/TCP -> 10.244.1.5:8080 weight 0",
    ]
    entry = h2.engine.drains.queue.get(vs(), rs(A))
    assert entry.vs_draining and entry.deadline == h2.clock.wall() + 30.0
    assert vs() in h2.engine.drains.draining_virtual_servers
    assert h2.audit() == 0 and h2.ops() == []  # neither foreign nor unknown to the audit
    h2.check(1)
    assert h2.ops() == []  # its connection still open: it stays
    h2.fake.set_connections(vs(), rs(A), active=0, inactive=0)
    h2.check(1)
    assert h2.ops() == ["del-rs 10.96.0.10:80/TCP -> 10.244.1.5:8080", "del-vs 10.96.0.10:80/TCP"]


def test_a_restarted_daemons_orphan_is_cut_at_the_service_drain_timeout():
    h = _left_by_a_daemon_that_went_down(conns=3)
    h2 = Harness(kernel=h.kernel, service_drain_timeout=30.0)
    h2.start([], [])
    h2.ops()
    h2.check(29)
    assert h2.ops() == []
    h2.check(2)
    assert h2.ops() == ["del-rs 10.96.0.10:80/TCP -> 10.244.1.5:8080", "del-vs 10.96.0.10:80/TCP"]
    assert h2.deletions("deadline") == 1


def test_a_restart_deletes_an_empty_orphan_and_any_with_service_drain_timeout_0():
    h = started()  # web with no endpoints: its virtual servers are empty
    h2 = Harness(kernel=h.kernel, service_drain_timeout=30.0)
    h2.start([], [])
    assert sorted(h2.ops()) == ["del-vs 10.96.0.10:53/UDP", "del-vs 10.96.0.10:80/TCP"]
    h = _left_by_a_daemon_that_went_down(conns=3)
    h3 = Harness(kernel=h.kernel, service_drain_timeout=0.0)
    h3.start([], [])
    assert "del-vs 10.96.0.10:80/TCP" in h3.ops()


def test_a_service_that_claims_an_orphans_address_takes_it_over_in_place():
    h = _left_by_a_daemon_that_went_down(conns=3)
    h2 = Harness(kernel=h.kernel, service_drain_timeout=30.0)
    h2.start([], [])
    h2.ops()
    h2.upsert(web(name="web2"), sync=False)
    h2.upsert(slice_of(B, svc="web2", name="web2-abc"))
    ops = h2.ops()
    assert "add-rs 10.96.0.10:80/TCP -> 10.244.1.6:8080 weight 1" in ops
    assert not any(op.startswith("del-") and "10.96.0.10:80/TCP" in op for op in ops)
    assert h2.fake.weight(vs(), rs(A)) == 0  # the old one goes on draining


def test_the_audit_drains_an_owned_virtual_server_it_does_not_know():
    h = started(A, timeout=30.0)
    # made behind the daemon's back (a tool, or a start-up deletion that failed)
    h.fake.add_virtual_server(VirtualServer(vs("10.96.0.77")), True)
    h.fake.add_real_server(vs("10.96.0.77"), rs(C), 1)
    h.fake.set_connections(vs("10.96.0.77"), rs(C), active=2, inactive=0)
    h.ops()
    assert h.audit() == 1
    h.engine.sync()  # the loop's next sync: the stand-in Service it marked
    assert h.ops() == ["set-rs 10.96.0.77:80/TCP -> 10.244.2.7:8080 weight 0"]
    assert vs("10.96.0.77") in h.engine.drains.draining_virtual_servers
    h.fake.set_connections(vs("10.96.0.77"), rs(C), active=0, inactive=0)
    h.check(1)
    assert h.ops() == [
        "del-rs 10.96.0.77:80/TCP -> 10.244.2.7:8080",
        "del-vs 10.96.0.77:80/TCP",
    ]


def test_an_orphans_drain_survives_a_second_restart(tmp_path: Path):
    h = _left_by_a_daemon_that_went_down(conns=3)
    h2 = Harness(kernel=h.kernel, service_drain_timeout=30.0)
    h2.start([], [])
    h2.ops()
    f = DrainStateFile(tmp_path)
    f.save(h2.engine.drains.queue.entries())
    restored = f.load()
    assert len(restored) == 1 and restored[0].vs_draining
    h3 = Harness(kernel=h.kernel, restored=restored, service_drain_timeout=30.0)
    h3.clock.advance(h2.clock.wall() - h3.clock.wall() + 10)
    h3.start([], [])
    assert h3.ops() == []
    assert h3.engine.drains.queue.get(vs(), rs(A)).deadline == h2.clock.wall() + 30.0
    h3.check(21)
    assert h3.ops() == ["del-rs 10.96.0.10:80/TCP -> 10.244.1.5:8080", "del-vs 10.96.0.10:80/TCP"]

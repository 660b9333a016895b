"""The engine on a real kernel: Engine(NetlinkKernel in the node's netns) fed raw Kubernetes
objects (devkit/harness.py's Harness, with a hand-moved clock for deadlines), real
connections from a client pod through the virtual IPs, and what the kernel holds read back
from it, with `ipvsadm -Ln` and `conntrack -L` as independent witnesses.

Connections to a real server whose drain must end are closed with a reset
(`Connection.abort()`, `request(reset=True)`): a normally closed one stays in IPVS as
InActConn for 2 minutes (TIME_WAIT, whatever --ipvs-tcpfin-timeout says), a reset one 10 s.
"""

from __future__ import annotations

import random
import time
from typing import Any

import pytest

from devkit.builders import endpoint, endpoint_slice, service
from devkit.harness import Harness
from devkit.labkit import Node, Pod, RecordingKernel, wait_for
from ipvsctl.daemon.status_json import engine_status
from ipvsctl.kernel.fake import FakeKernel
from ipvsctl.model import NodeContext, Protocol, RealServerKey, ServiceKey
from ipvsctl.source.events import Delete, ObjectKind, Upsert

pytestmark = pytest.mark.lab

VIP, VIP6 = "10.96.0.10", "fd96::10"
KEY = ServiceKey(Protocol.TCP, VIP, 80)
KEY6 = ServiceKey(Protocol.TCP, VIP6, 80)
NODE = NodeContext("node-a", ("192.0.2.10", "fd00:2::10"))


def harness(node: Node, drain_timeout: float = 600.0) -> Harness:
    """An engine on the node's real kernel, its mutating calls recorded (`h.ops()`)."""
    h = Harness(kernel=RecordingKernel(node.kernel), drain_timeout=drain_timeout, node=NODE)
    h.ops = h.kernel.take_ops  # type: ignore[method-assign]
    return h


def eps(*pods: Pod, family: int = 4) -> list[dict[str, Any]]:
    return [endpoint(p.address(family), pod=p.name) for p in pods]


def rs(pod: Pod, family: int = 4, port: int = 8080) -> RealServerKey:
    return RealServerKey(pod.address(family), port)


def weights(node: Node, key: ServiceKey) -> dict[str, int]:
    """The witness: real server -> weight, as `ipvsadm -Ln` shows them."""
    return {name: r.weight for name, r in node.ipvsadm()[str(key)].real_servers.items()}


def counts(node: Node, key: ServiceKey, server: RealServerKey) -> tuple[int, int, int]:
    """(weight, ActiveConn, InActConn) as the engine's kernel reads them."""
    s = next(s for s in node.kernel.list_real_servers(key) if s.key == server)
    return s.weight, s.active_conns, s.inactive_conns


def held_connection(
    node: Node, client: Pod, pods: list[Pod], key: ServiceKey = KEY, vip: str = VIP, family: int = 4
) -> tuple[Any, Pod]:
    """A connection held open through the virtual server, and the pod that took it; waits
    until the kernel counts it as ActiveConn."""
    held = client.connect(vip, key.port)
    pod = next(p for p in pods if p.name == held.pod)
    wait_for(lambda: counts(node, key, rs(pod, family))[1] >= 1, what="ActiveConn")
    return held, pod


def drained_when(
    h: Harness, node: Node, key: ServiceKey, server: RealServerKey, timeout: float = 90.0
) -> None:
    """Run drain checks until the real server is gone from the kernel."""

    def gone() -> bool:
        h.check()
        return str(server) not in node.ipvsadm()[str(key)].real_servers

    wait_for(gone, timeout=timeout, interval=0.5, what=f"{server} deleted by the drain check")


# --- draining TCP ---------------------------------------------------------------------------
def test_draining_real_server_keeps_its_connection_and_is_deleted_when_it_closes(
    node: Node, client: Pod
) -> None:
    pods = [node.make_pod(f"10.244.1.{i}") for i in (1, 2, 3)]
    h = harness(node)
    h.start([service("web")], [endpoint_slice("web", eps(*pods))])
    assert weights(node, KEY) == {f"{p.ip}:8080": 1 for p in pods}
    assert {r.forward for r in node.ipvsadm()[str(KEY)].real_servers.values()} == {"Masq"}

    held, gone = held_connection(node, client, pods)
    rest = [p for p in pods if p is not gone]
    h.ops()
    h.upsert(endpoint_slice("web", eps(*rest)))
    assert h.ops() == [f"set-rs {KEY} -> {rs(gone)} weight 0"]  # weight 0, not deleted
    assert weights(node, KEY)[str(rs(gone))] == 0
    assert node.ipvsadm()[str(KEY)].real_servers[str(rs(gone))].active >= 1

    # new connections all go to the other pods; the held one still works end to end
    answered = [client.request(VIP, 80) for _ in range(6)]
    assert set(answered) == {p.name for p in rest}
    assert held.echo("still served")
    h.check(advance=5)  # a drain check while the connection is open: nothing to delete
    assert h.ops() == [] and counts(node, KEY, rs(gone))[:2] == (0, 1)
    assert h.engine.drains.queue.get(KEY, rs(gone)) is not None

    held.abort()
    drained_when(h, node, KEY, rs(gone))
    assert h.ops() == [f"del-rs {KEY} -> {rs(gone)}"]
    assert h.deletions("drained") == 1 and h.deletions("deadline") == 0
    assert len(h.engine.drains.queue) == 0
    assert weights(node, KEY) == {str(rs(p)): 1 for p in rest}


def test_a_closed_connection_holds_a_real_server_for_time_wait_whatever_the_fin_timeout(
    node: Node, client: Pod
) -> None:
    """Why drain tests close with a reset: a normal close goes straight to TIME_WAIT in
    IPVS (2 minutes) and counts as InActConn all that time; --ipvs-tcpfin-timeout sets the
    FIN_WAIT timeout only. A reset leaves a CLOSE entry for 10 s."""
    pod = node.make_pod("10.244.1.1")
    h = harness(node)
    h.start([service("web")], [endpoint_slice("web", eps(pod))])
    node.kernel.set_timeouts(tcpfin=1)
    client.connect(VIP, 80).close()
    client.connect(VIP, 80).abort()

    def states() -> list[str]:
        return sorted(c[1] for c in node.ipvs_connections() if c[4] == str(rs(pod)))

    wait_for(lambda: states() == ["CLOSE", "TIME_WAIT"], what="both connections closed")
    wait_for(lambda: states() == ["TIME_WAIT"], timeout=60, what="the reset one expiring")
    assert counts(node, KEY, rs(pod)) == (1, 0, 1)  # still InActConn, long after 1 s
    h.upsert(endpoint_slice("web", []))
    h.check()
    # ... but a TIME_WAIT entry carries no data: it does not hold the drain (CONTRACT)
    assert str(rs(pod)) not in node.ipvsadm()[str(KEY)].real_servers
    assert h.deletions("drained") == 1 and h.deletions("deadline") == 0


def test_deadline_deletes_a_real_server_whose_connection_stays_open(
    node: Node, client: Pod
) -> None:
    pods = [node.make_pod("10.244.1.1"), node.make_pod("10.244.1.2")]
    h = harness(node, drain_timeout=30)
    h.start([service("web")], [endpoint_slice("web", eps(*pods))])
    held, gone = held_connection(node, client, pods)
    (other,) = [p for p in pods if p is not gone]
    h.upsert(endpoint_slice("web", eps(other)))
    h.ops()

    h.check(advance=20)  # before the deadline (--drain-timeout 30)
    assert h.ops() == [] and held.echo()
    assert counts(node, KEY, rs(gone))[:2] == (0, 1)  # still established
    h.check(advance=11)  # past it
    assert h.ops() == [f"del-rs {KEY} -> {rs(gone)}"]
    assert h.deletions("deadline") == 1 and h.deletions("drained") == 0
    assert str(rs(gone)) not in node.ipvsadm()[str(KEY)].real_servers
    # the kernel ends what was left (expire_nodest_conn=1): the deadline is a real limit
    held.sock.settimeout(15)
    assert not held.echo("after the deadline")
    held.close()


def test_returning_endpoint_gets_weight_1_in_place_and_keeps_its_connection(
    node: Node, client: Pod
) -> None:
    pods = [node.make_pod("10.244.1.1"), node.make_pod("10.244.1.2")]
    h = harness(node)
    h.start([service("web")], [endpoint_slice("web", eps(*pods))])
    held, back = held_connection(node, client, pods)
    (other,) = [p for p in pods if p is not back]
    h.upsert(endpoint_slice("web", eps(other)))
    assert weights(node, KEY)[str(rs(back))] == 0
    h.ops()

    h.upsert(endpoint_slice("web", eps(*pods)))
    # in place: one weight change, never delete and re-add (that would reset connections)
    assert h.ops() == [f"set-rs {KEY} -> {rs(back)} weight 1"]
    assert len(h.engine.drains.queue) == 0
    assert counts(node, KEY, rs(back))[:2] == (1, 1)  # the connection is still counted
    assert node.ipvsadm()[str(KEY)].real_servers[str(rs(back))].active >= 1
    assert held.echo("survived the return")
    wait_for(lambda: client.request(VIP, 80) == back.name, what="back in rotation")
    h.check(advance=3600)  # the drain check no longer knows it: nothing is deleted later
    assert h.ops() == [] and held.echo()
    held.close()


# --- UDP --------------------------------------------------------------------------------------
def test_udp_real_server_is_deleted_at_once_and_its_conntrack_entries_go(
    node: Node, client: Pod
) -> None:
    pods = [node.make_pod(f"10.244.1.{i}", tcp=(), udp=(5353,)) for i in (1, 2)]
    ports = [{"name": "dns", "port": 53, "protocol": "UDP"}]
    slice_ports = [{"name": "dns", "port": 5353, "protocol": "UDP"}]
    key = ServiceKey(Protocol.UDP, VIP, 53)
    h = harness(node)
    h.start([service("dns", ports=ports)], [endpoint_slice("dns", eps(*pods), ports=slice_ports)])
    assert weights(node, key) == {f"{p.ip}:5353": 1 for p in pods}

    sock = client.udp_socket()  # one source port: every datagram is one flow
    first = wait_for(lambda: client.udp(VIP, 53, sock), what="UDP answer")
    gone = next(p for p in pods if p.name == first)
    (other,) = [p for p in pods if p is not gone]

    def entries() -> list[str]:
        out = node.conntrack("-p", "udp")
        return [
            line for line in out.splitlines() if f"dst={VIP} " in line and f"src={gone.ip} " in line
        ]

    wait_for(entries, what="conntrack entry for the flow")
    h.ops()
    h.upsert(endpoint_slice("dns", eps(other), ports=slice_ports))
    assert h.ops() == [
        f"del-rs {key} -> {gone.ip}:5353",
        f"flush-conntrack {key} -> {gone.ip}:5353",
    ]
    assert weights(node, key) == {f"{other.ip}:5353": 1}  # at once, no drain
    assert entries() == []
    assert len(h.engine.drains.queue) == 0 and h.deletions("udp") == 1
    # the same flow now reaches the live pod (a datagram may be lost while IPVS expires
    # the entry to the deleted real server: expire_nodest_conn)
    wait_for(lambda: client.udp(VIP, 53, sock) == other.name, what="flow moved")
    sock.close()


# --- IPv6 -------------------------------------------------------------------------------------
def test_ipv6_end_to_end_dual_stack_service_drains_one_family(node: Node, client: Pod) -> None:
    pods = [node.make_pod(f"10.244.1.{i}", f"fd00::{i}") for i in (1, 2)]
    h = harness(node)
    v4 = endpoint_slice("web", eps(*pods), name="web-v4")
    h.start(
        [service("web", cluster_ip=[VIP, VIP6])],
        [v4, endpoint_slice("web", eps(*pods, family=6), name="web-v6", address_type="IPv6")],
    )
    assert weights(node, KEY6) == {f"[{p.ip6}]:8080": 1 for p in pods}
    assert weights(node, KEY) == {f"{p.ip}:8080": 1 for p in pods}
    assert {VIP, VIP6} <= node.interface_addresses()
    assert {client.request(VIP6, 80, reset=True) for _ in range(4)} == {p.name for p in pods}

    held, gone = held_connection(node, client, pods, KEY6, VIP6, family=6)
    (other,) = [p for p in pods if p is not gone]
    h.ops()
    h.upsert(endpoint_slice("web", eps(other, family=6), name="web-v6", address_type="IPv6"))
    assert h.ops() == [f"set-rs {KEY6} -> {rs(gone, 6)} weight 0"]  # IPv4 untouched
    assert weights(node, KEY6) == {f"[{gone.ip6}]:8080": 0, f"[{other.ip6}]:8080": 1}
    assert weights(node, KEY) == {f"{p.ip}:8080": 1 for p in pods}
    assert [client.request(VIP6, 80) for _ in range(4)] == [other.name] * 4
    assert held.echo("v6 still served")

    held.abort()
    drained_when(h, node, KEY6, rs(gone, 6))
    assert h.ops() == [f"del-rs {KEY6} -> {rs(gone, 6)}"]
    assert weights(node, KEY6) == {f"[{other.ip6}]:8080": 1}


# --- ClientIP persistence ---------------------------------------------------------------------
def test_client_ip_affinity_keeps_a_client_on_one_pod(node: Node, client: Pod) -> None:
    pods = [node.make_pod(f"10.244.1.{i}") for i in (1, 2, 3)]
    h = harness(node)
    svc = service(
        "web",
        sessionAffinity="ClientIP",
        sessionAffinityConfig={"clientIP": {"timeoutSeconds": 300}},
    )
    h.start([svc], [endpoint_slice("web", eps(*pods))])
    seen = node.ipvsadm()[str(KEY)]
    assert (seen.scheduler, seen.flags) == ("rr", "persistent 300")

    first = client.request(VIP, 80, reset=True)
    assert [client.request(VIP, 80, reset=True) for _ in range(5)] == [first] * 5
    # its pod drains: the client's new connections move (expire_quiescent_template=1),
    # and stay together on one of the others
    pinned = next(p for p in pods if p.name == first)
    h.upsert(endpoint_slice("web", eps(*[p for p in pods if p is not pinned])))
    moved = wait_for(
        lambda: (n := client.request(VIP, 80, reset=True)) != first and n,
        what="rescheduled away from the draining pod",
    )
    assert [client.request(VIP, 80, reset=True) for _ in range(3)] == [moved] * 3


# --- drift audit ------------------------------------------------------------------------------
def test_drift_audit_repairs_hand_changes_and_leaves_a_draining_real_server_alone(
    node: Node, client: Pod
) -> None:
    pods = [node.make_pod(f"10.244.1.{i}") for i in (1, 2, 3)]
    h = harness(node)
    h.start([service("web")], [endpoint_slice("web", eps(*pods))])
    held, draining = held_connection(node, client, pods)
    changed, deleted = [p for p in pods if p is not draining]
    h.upsert(endpoint_slice("web", eps(changed, deleted)))
    entry = h.engine.drains.queue.get(KEY, rs(draining))
    assert entry is not None
    h.ops()

    vs = f"{VIP}:80"
    node.run("ipvsadm", "-E", "-t", vs, "-s", "wrr")
    node.run("ipvsadm", "-e", "-t", vs, "-r", f"{changed.ip}:8080", "-m", "-w", "5")
    node.run("ipvsadm", "-d", "-t", vs, "-r", f"{deleted.ip}:8080")
    node.run("ipvsadm", "-a", "-t", vs, "-r", "10.244.1.99:8080", "-m", "-w", "1")
    assert h.audit() == 4  # scheduler, a weight, a missing and a stray one
    h.engine.sync()
    assert h.ops() == [
        f"set-vs {KEY} rr",
        f"set-rs {KEY} -> {rs(changed)} weight 1",
        f"add-rs {KEY} -> {rs(deleted)} weight 1",
        f"set-rs {KEY} -> 10.244.1.99:8080 weight 0",  # the stray one drains, gently
    ]
    h.check()  # it has no connections: deleted at the first check
    assert h.ops() == [f"del-rs {KEY} -> 10.244.1.99:8080"]
    seen = node.ipvsadm()[str(KEY)]
    assert seen.scheduler == "rr"
    assert weights(node, KEY) == {str(rs(changed)): 1, str(rs(deleted)): 1, str(rs(draining)): 0}
    # the draining real server: not one operation, still queued, connection still served
    assert h.engine.drains.queue.get(KEY, rs(draining)) == entry
    assert seen.real_servers[str(rs(draining))].active >= 1
    assert held.echo("untouched by the audit")
    assert h.audit() == 0  # and the next round finds nothing
    held.close()


# --- the engine and the kernel agree ----------------------------------------------------------
class RandomCluster:
    """Random changes to Services and EndpointSlices, one small change at a time as a cluster
    makes them (an endpoint added, removed, turning terminating; one field of a Service),
    over a small, collision-prone space: shared external IPs, dual-stack, NodePorts, UDP,
    affinity, schedulers, traffic policy Local, deletes, and updates that change nothing."""

    SCHEDULERS = ("rr", "wrr", "lc", "wlc", "sh")

    def __init__(self, seed: int, services: int = 30) -> None:
        self.rng = random.Random(seed)
        self.n = services
        self.version = 0
        self.specs: dict[int, dict[str, Any]] = {}
        self.slices: dict[tuple[int, str], dict[int, tuple[bool, bool, bool, str]]] = {}
        for i in range(services):
            self.specs[i] = self._random_spec()
            for part in ("a", "v6"):
                self.slices[(i, part)] = {
                    j: self._random_endpoint() for j in self.rng.sample(range(1, 9), 2)
                }

    def _random_spec(self) -> dict[str, Any]:
        r = self.rng
        return {
            "type": r.choice(["ClusterIP", "ClusterIP", "NodePort", "LoadBalancer"]),
            "port": r.choice([80, 443]),
            "dual": r.random() < 0.4,
            "p1": r.choice([None, "UDP", "TCP"]),
            "external": r.choice([None, None, 1, 2]),
            "affinity": r.choice([None, None, None, 60, 10800]),
            "etp_local": r.random() < 0.2,
            "itp_local": r.random() < 0.1,
            "scheduler": r.choice([None, None, *self.SCHEDULERS]),
        }

    def _random_endpoint(self) -> tuple[bool, bool, bool, str]:
        """(ready, serving, terminating, node)."""
        r = self.rng
        ready = r.random() < 0.75
        return (
            ready,
            ready or r.random() < 0.5,
            not ready and r.random() < 0.7,
            r.choice(["node-a", "node-b"]),
        )

    def _meta(self, name: str) -> dict[str, Any]:
        self.version += 1
        return {"name": name, "namespace": "default", "resourceVersion": str(self.version)}

    def service(self, i: int) -> dict[str, Any]:
        p = self.specs[i]
        ports = [{"name": "p0", "port": p["port"], "protocol": "TCP", "nodePort": 30000 + i}]
        if p["p1"]:
            ports.append({"name": "p1", "port": 53, "protocol": p["p1"], "nodePort": 31000 + i})
        ips = [f"10.96.1.{i + 1}"] + ([f"fd96::1:{i + 1:x}"] if p["dual"] else [])
        spec: dict[str, Any] = {
            "clusterIPs": ips,
            "clusterIP": ips[0],
            "ports": ports,
            "type": p["type"],
        }
        if p["external"]:
            spec["externalIPs"] = [f"198.51.100.{p['external']}"]
        if p["affinity"]:
            spec["sessionAffinity"] = "ClientIP"
            spec["sessionAffinityConfig"] = {"clientIP": {"timeoutSeconds": p["affinity"]}}
        if p["etp_local"]:
            spec["externalTrafficPolicy"] = "Local"
        if p["itp_local"]:
            spec["internalTrafficPolicy"] = "Local"
        meta = self._meta(f"s{i}")
        if p["scheduler"]:
            meta["annotations"] = {"ipvsctl.io/scheduler": p["scheduler"]}
        obj: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": meta,
            "spec": spec,
        }
        if p["type"] == "LoadBalancer":
            obj["status"] = {"loadBalancer": {"ingress": [{"ip": f"203.0.113.{i + 1}"}]}}
        return obj

    def endpoint_slice(self, i: int, part: str) -> dict[str, Any]:
        v6 = part == "v6"
        endpoints = [
            endpoint(
                f"fd00::{i + 1:x}:{j}" if v6 else f"10.244.{i}.{j}",
                ready=ready,
                serving=serving,
                terminating=terminating or None,
                node=node,
                pod=f"s{i}-{j}",
            )
            for j, (ready, serving, terminating, node) in sorted(self.slices[(i, part)].items())
        ]
        p1 = self.specs[i]["p1"] if i in self.specs else None
        ports = [
            {"name": "p0", "port": 8080, "protocol": "TCP"},
            {"name": "p1", "port": 5353, "protocol": p1 or "UDP"},
        ]
        return {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                **self._meta(f"s{i}-{part}"),
                "labels": {"kubernetes.io/service-name": f"s{i}"},
            },
            "addressType": "IPv6" if v6 else "IPv4",
            "ports": ports,
            "endpoints": endpoints,
        }

    def initial(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        return (
            [self.service(i) for i in self.specs],
            [self.endpoint_slice(i, part) for i, part in self.slices],
        )

    def change(self) -> Upsert | Delete:
        r = self.rng
        i = r.randrange(self.n)
        x = r.random()
        now = time.monotonic()
        if x < 0.25:  # one field of a Service (or the Service back after a delete)
            if i in self.specs:
                field = r.choice(list(self.specs[i]))
                self.specs[i][field] = self._random_spec()[field]
            else:
                self.specs[i] = self._random_spec()
            return Upsert(ObjectKind.SERVICE, self.service(i), now)
        if x < 0.3 and self.specs.pop(i, None) is not None:
            return Delete(ObjectKind.SERVICE, "default", f"s{i}", now)
        if x < 0.35 and i in self.specs:  # an update that changes nothing we read
            return Upsert(ObjectKind.SERVICE, self.service(i), now)
        part = r.choice(["a", "b", "v6"])
        if x < 0.42 and self.slices.pop((i, part), None) is not None:
            return Delete(ObjectKind.ENDPOINT_SLICE, "default", f"s{i}-{part}", now)
        eps = self.slices.setdefault((i, part), {})
        j = r.randrange(1, 9)
        if j in eps and r.random() < 0.5:
            del eps[j]
        else:
            eps[j] = self._random_endpoint()
        return Upsert(ObjectKind.ENDPOINT_SLICE, self.endpoint_slice(i, part), now)


def test_the_engine_and_the_kernel_agree_after_a_burst_of_1000_random_changes(
    node: Node,
) -> None:
    cluster = RandomCluster(seed=1000)
    real = Harness(kernel=node.kernel, drain_timeout=30, node=NODE)
    fake = Harness(kernel=FakeKernel(), drain_timeout=30, node=NODE)
    services, slices = cluster.initial()
    t0 = time.monotonic()
    for h in (real, fake):
        h.start(services, slices)
    assert node.kernel.dump() == fake.fake.dump()

    batches = 0
    for n in range(1, 1001):
        event = cluster.change()
        for h in (real, fake):
            h.engine.handle(event)
        if n % 25 == 0:  # the loop's batching: many events, one sync
            batches += 1
            for h in (real, fake):
                assert h.engine.sync().failed == set()
                h.check(advance=7)  # no traffic: drained ones go; some deadlines pass
        if n % 500 == 0:
            assert node.kernel.dump() == fake.fake.dump(), f"after {n} changes"
    elapsed = time.monotonic() - t0

    table = node.kernel.dump()
    assert table == fake.fake.dump()
    print(
        f"1000 changes in {batches} batches: {elapsed:.1f}s; "
        f"{table.count(chr(10))} lines in the table"
    )
    assert table.count("  -> ") > 20 and table.count("/UDP") > 0 and "[fd" in table
    assert node.kernel.bound_addresses() == sorted(fake.fake.bound)
    assert engine_status(real.view) == engine_status(fake.view)
    assert real.audit() == 0  # what the engine applied is what the kernel has

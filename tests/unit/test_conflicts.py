"""Two Services claiming one virtual server: the rule (plan/conflicts.py) over every arrival
order, and the engine keeping to it, with its log line and metrics, including the
CVE-2020-8554 case of a tenant naming the cluster DNS's ClusterIP as an external IP."""

from __future__ import annotations

import itertools
import logging

import pytest

from devkit.builders import endpoint, endpoint_slice, service
from devkit.harness import NODE, Harness, rs, vs
from ipvsctl.model import ServiceRef, VirtualServerKind
from ipvsctl.plan.conflicts import Claims, rank, resolve
from ipvsctl.reconcile.cluster import plan_objects
from ipvsctl.source.convert import parse_service
from ipvsctl.source.events import ObjectKind, Upsert

CIP, EXT, LB = (
    VirtualServerKind.CLUSTER_IP,
    VirtualServerKind.EXTERNAL_IP,
    VirtualServerKind.LOAD_BALANCER,
)
K = vs("10.96.0.10", 53, "UDP")


def ref(name: str, namespace: str = "default") -> ServiceRef:
    return ServiceRef(namespace, name)


# (claims: (service, kind, created), winner)
CASES = [
    (
        "cluster IP beats an older external IP",
        [("kube-dns", CIP, 2000.0), ("evil", EXT, 1000.0)],
        "kube-dns",
    ),
    ("cluster IP beats a load-balancer IP", [("b", LB, 1.0), ("a", CIP, 5.0)], "a"),
    ("older of two external IPs", [("new", EXT, 200.0), ("old", EXT, 100.0)], "old"),
    ("older of external and load-balancer IP", [("lb", LB, 100.0), ("ext", EXT, 200.0)], "lb"),
    ("same age: namespace/name", [("b", EXT, 100.0), ("a", EXT, 100.0)], "a"),
    ("no creation time ranks after one", [("a", EXT, None), ("z", EXT, 300.0)], "z"),
    ("three claimants", [("x", EXT, 3.0), ("y", LB, 2.0), ("w", EXT, None)], "y"),
]


@pytest.mark.parametrize(("claims", "winner"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_the_winner_is_the_same_in_every_arrival_order(claims, winner):
    ranked = [(ref(n), rank(kind, created, ref(n))) for n, kind, created in claims]
    assert resolve((r, K, rk) for r, rk in ranked) == {K: ref(winner)}
    for order in itertools.permutations(ranked):
        c = Claims()
        for r, rk in order:
            c.update(r, {K: rk})
        assert c.winner(K) == ref(winner), order
        assert c.conflicts() == len(claims) - 1
        assert set(c.losers(K)) == {r for r, _ in ranked} - {ref(winner)}


def test_when_the_winner_goes_the_next_takes_over_and_those_affected_are_named():
    c = Claims()
    dns, evil, other = ref("kube-dns", "kube-system"), ref("evil", "aaa-tenant"), ref("o")
    assert c.update(evil, {K: rank(EXT, 100.0, evil)}) == set()
    # the cluster IP arrives: evil lost the key, so evil must be rebuilt
    assert c.update(dns, {K: rank(CIP, 500.0, dns)}) == {evil}
    assert c.update(other, {K: rank(EXT, 900.0, other)}) == set()  # a loser more: no change
    assert c.winner(K) == dns and c.conflicts() == 2
    assert c.update(dns, {}) == {evil}  # the winner goes: the next in rank gets it
    assert c.winner(K) == evil and c.conflicts() == 1
    assert c.update(evil, {}) == {other}
    assert c.update(other, {}) == set() and c.winner(K) is None and c.conflicts() == 0
    assert c.by_key == {} and c.by_ref == {}


def test_creation_timestamp_is_read_and_a_bad_one_is_ignored_with_a_warning():
    svc = service("web")
    svc["metadata"]["creationTimestamp"] = "2024-05-01T10:00:00Z"
    assert parse_service(svc).value.created == 1714557600.0
    svc["metadata"]["creationTimestamp"] = "yesterday"
    parsed = parse_service(svc)
    assert parsed.value.created is None
    assert any("creationTimestamp" in w for w in parsed.warnings)


# --- the engine ------------------------------------------------------------------------------
DNS_PORTS = [{"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53}]
SLICE_PORTS = [{"name": "dns", "port": 53, "protocol": "UDP"}]


def kube_dns() -> dict:
    s = service("kube-dns", cluster_ip="10.96.0.10", namespace="kube-system", ports=DNS_PORTS)
    s["metadata"]["creationTimestamp"] = "2024-01-01T00:00:00Z"
    return s


def evil() -> dict:
    # older than kube-dns would be no help: a cluster IP wins whatever the age
    s = service(
        "evil",
        cluster_ip="10.96.7.7",
        namespace="aaa-tenant",
        ports=DNS_PORTS,
        externalIPs=["10.96.0.10"],
    )
    s["metadata"]["creationTimestamp"] = "2023-01-01T00:00:00Z"
    return s


def slices() -> list[dict]:
    return [
        endpoint_slice(
            "kube-dns", [endpoint("10.244.0.53")], namespace="kube-system", ports=SLICE_PORTS
        ),
        endpoint_slice(
            "evil", [endpoint("10.244.6.66")], namespace="aaa-tenant", ports=SLICE_PORTS
        ),
    ]


def real_servers(h: Harness) -> set:
    return real_servers_of(h, K)


ARRIVALS = list(itertools.permutations(["kube-dns", "evil", "dns-slice", "evil-slice"]))


@pytest.mark.parametrize("order", ARRIVALS, ids=["-".join(o) for o in ARRIVALS])
def test_a_tenant_external_ip_never_takes_the_cluster_dns_in_any_arrival_order(order, caplog):
    objects = {
        "kube-dns": kube_dns(),
        "evil": evil(),
        "dns-slice": slices()[0],
        "evil-slice": slices()[1],
    }
    h = Harness()
    h.start([], [])
    with caplog.at_level(logging.WARNING, logger="ipvsctl"):
        for name in order:
            h.upsert(objects[name])
    assert real_servers(h) == {rs("10.244.0.53", 53)}
    assert h.engine.state.owner[K] == ref("kube-dns", "kube-system")
    assert real_servers_of(h, vs("10.96.7.7", 53, "UDP")) == {rs("10.244.6.66", 53)}
    assert h.metrics.value("ipvsctl_virtual_server_conflict_losers") == 1
    assert h.metrics.value("ipvsctl_virtual_server_conflicts_total") == 1  # logged once
    lines = [
        r for r in caplog.records if r.getMessage() == "virtual server claimed by another service"
    ]
    assert len(lines) == 1 and lines[0].fields["service"] == ref("evil", "aaa-tenant")
    assert lines[0].fields["winner"] == ref("kube-dns", "kube-system")


def real_servers_of(h: Harness, key) -> set:
    return {s.key for s in h.kernel.list_real_servers(key)}


@pytest.mark.parametrize("services", [[kube_dns(), evil()], [evil(), kube_dns()]])
def test_start_up_list_gives_the_cluster_ip_whatever_the_name_order(services):
    h = Harness()
    h.start(services, slices())  # aaa-tenant/evil sorts first by name
    assert real_servers_of(h, K) == {rs("10.244.0.53", 53)}
    assert h.metrics.value("ipvsctl_virtual_server_conflict_losers") == 1


def test_when_the_winner_goes_the_loser_takes_over_and_gives_back_when_it_returns():
    h = Harness()
    h.start([kube_dns(), evil()], slices())
    h.delete(kube_dns())
    assert real_servers_of(h, K) == {rs("10.244.6.66", 53)}  # in the same sync
    assert h.engine.state.owner[K] == ref("evil", "aaa-tenant")
    assert h.metrics.value("ipvsctl_virtual_server_conflict_losers") == 0
    h.upsert(kube_dns())  # the cluster IP comes back: it wins again, in one sync
    assert real_servers_of(h, K) == {rs("10.244.0.53", 53)}
    assert h.engine.state.owner[K] == ref("kube-dns", "kube-system")
    assert h.metrics.value("ipvsctl_virtual_server_conflicts_total") == 2


def test_older_of_two_external_ip_claims_wins_even_when_it_arrives_second():
    new = service("aaa", cluster_ip="10.96.1.1", externalIPs=["203.0.113.5"], ports=DNS_PORTS)
    new["metadata"]["creationTimestamp"] = "2025-01-01T00:00:00Z"
    old = service("zzz", cluster_ip="10.96.1.2", externalIPs=["203.0.113.5"], ports=DNS_PORTS)
    old["metadata"]["creationTimestamp"] = "2020-01-01T00:00:00Z"
    h = Harness()
    h.start(
        [new],
        [
            endpoint_slice("aaa", [endpoint("10.244.1.1")], ports=SLICE_PORTS),
            endpoint_slice("zzz", [endpoint("10.244.2.2")], ports=SLICE_PORTS),
        ],
    )
    key = vs("203.0.113.5", 53, "UDP")
    assert real_servers_of(h, key) == {rs("10.244.1.1", 53)}
    h.engine.handle(Upsert(ObjectKind.SERVICE, old, 0.0))
    h.engine.sync()
    assert real_servers_of(h, key) == {rs("10.244.2.2", 53)}


def test_plan_follows_the_same_rule():
    objects = {ObjectKind.SERVICE: [evil(), kube_dns()], ObjectKind.ENDPOINT_SLICE: slices()}
    chosen, problems = plan_objects(objects, NODE)
    by_key = {dvs.key: desired.ref for desired, dvs in chosen}
    assert by_key[K] == ref("kube-dns", "kube-system")
    assert any("aaa-tenant/evil" in p.name for p in problems)

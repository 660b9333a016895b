"""The netfilter listener through the real Engine (in-memory IPVS): which nft transactions
each Service change causes, batching, retries, and the periodic checks."""

from __future__ import annotations

import re
import threading

import pytest

from devkit.builders import endpoint, endpoint_slice, service
from devkit.harness import Harness, vs
from ipvsctl.model import ServiceRef
from ipvsctl.netfilter.nft import NftError, NftNotFound, NftUnavailable
from ipvsctl.netfilter.ruleset import Element, RulesetConfig, Verdict
from ipvsctl.netfilter.sync import NetfilterSync, SyncConfig
from ipvsctl.reconcile.feed import Subscriptions
from tests.unit.test_netfilter_ruleset import desired

CONFIG = SyncConfig(
    RulesetConfig(cluster_cidrs=("10.244.0.0/16",)), check_interval=10, audit_interval=100
)
_ELEMENTS = re.compile(
    r"^(add|delete) element inet ipvsctl "
    r"(services[46]|virtual-servers[46]|firewall[46]|firewall-allow[46]|vips[46]|vip-ports[46]) "
    r"\{ (.*) \}$"
)
_NAMES = (
    "services4",
    "services6",
    "virtual-servers4",
    "virtual-servers6",
    "firewall4",
    "firewall6",
    "firewall-allow4",
    "firewall-allow6",
    "vips4",
    "vips6",
    "vip-ports4",
    "vip-ports6",
)


class FakeNft:
    """Plays nft for the statements ipvsctl writes: keeps the maps' elements, fails on
    request, and fails a delete of a missing element as the kernel does."""

    def __init__(self) -> None:
        self.scripts: list[tuple[str, str]] = []  # (operation, script)
        self.exists = False
        self.maps: dict[str, dict[str, str]] = {n: {} for n in _NAMES}  # maps and sets
        self.fail = 0
        self.listing = "table v1"  # chains with rules, sets, maps
        self.declarations = "chains v1"  # chains, sets, maps without rules

    def apply(self, script: str, operation: str) -> None:
        if self.fail:
            self.fail -= 1
            raise NftError(f"nft {operation}: injected", operation)
        maps = {k: dict(v) for k, v in self.maps.items()}
        exists = self.exists
        for line in script.splitlines():
            if line.startswith("delete table"):
                exists, maps = False, {n: {} for n in _NAMES}
            elif line.startswith("add table"):
                exists = True
            elif line.startswith(("flush map", "flush set")):
                maps[line.split()[-1]].clear()
            elif m := _ELEMENTS.match(line):
                verb, name, items = m.groups()
                for item in items.split(", "):
                    k, _, v = item.partition(" : goto ")
                    if verb == "add":
                        maps[name][k] = v
                    elif k not in maps[name]:
                        raise NftNotFound(f"nft {operation}: no such element", operation)
                    else:
                        del maps[name][k]
        self.scripts.append((operation, script))
        self.maps, self.exists = maps, exists

    def list_table(self, target: str, operation: str = "check") -> str | None:
        return self.listing if self.exists else None

    def list_declarations(self, target: str, operation: str = "check") -> str | None:
        return self.declarations if self.exists else None

    def list_map(self, target: str, name: str, operation: str = "check"):
        if not self.exists:
            return None
        out = []
        for k, v in self.maps[name].items():
            address, proto, port = k.split(" . ")
            out.append((address, proto, int(port), v))
        return out

    def list_set(self, target: str, name: str, operation: str = "check"):
        if not self.exists:
            return None
        return [tuple(k.split(" . ")) for k in self.maps[name]]

    def ops(self) -> list[str]:
        out = [op for op, _ in self.scripts]
        self.scripts.clear()
        return out

    def elements(self) -> dict[str, str]:
        return {k: v for n in ("services4", "services6") for k, v in self.maps[n].items()}


def nodeport(name: str = "web", local: bool = False, port: int = 30080, ip: str = "10.96.0.10"):
    spec = {"externalTrafficPolicy": "Local"} if local else {}
    return service(
        name,
        cluster_ip=ip,
        type="NodePort",
        ports=[{"name": "http", "port": 80, "nodePort": port}],
        **spec,
    )


@pytest.fixture
def setup():
    h = Harness()
    nft = FakeNft()
    sync = NetfilterSync(nft, CONFIG, ready=lambda: h.engine.started, clock=h.clock.monotonic)
    h.feed.subscribe(Subscriptions(service=sync.on_service))
    return h, nft, sync


def test_start_writes_the_chains_and_the_first_push_replaces_every_element(setup):
    h, nft, sync = setup
    nft.exists = True
    nft.maps["services4"]["10.96.9.9 . tcp . 80"] = "cluster-ip"  # left by an earlier run
    sync.start()
    assert nft.ops() == ["base"]
    assert nft.elements() == {"10.96.9.9 . tcp . 80": "cluster-ip"}  # kept until the push
    assert sync.flush() and nft.ops() == []  # engine not ready: nothing yet

    h.start(
        [nodeport(), service("db", cluster_ip="10.96.0.20")],
        [endpoint_slice("web", [endpoint("10.244.1.5")])],
    )
    assert sync.flush()
    assert nft.ops() == ["replace"]
    assert nft.elements() == {
        "10.96.0.10 . tcp . 80": "cluster-ip",
        "192.0.2.10 . tcp . 30080": "external",
        "10.96.0.20 . tcp . 80": "cluster-ip",
    }
    assert sync.flush() and nft.ops() == []  # nothing more to do


def test_endpoint_events_never_touch_nftables(setup):
    h, nft, sync = setup
    sync.start()
    h.start([nodeport()], [endpoint_slice("web", [endpoint("10.244.1.5")])])
    sync.flush()
    nft.ops()
    for eps in (
        [endpoint("10.244.1.5"), endpoint("10.244.1.6")],
        [endpoint("10.244.1.6")],
        [endpoint("10.244.1.6", ready=False)],
        [],
    ):
        h.upsert(endpoint_slice("web", eps))
        assert sync.flush()
    assert h.fake.dump() != ""  # IPVS followed the endpoints...
    assert nft.ops() == []  # ...nftables did not move


def test_service_changes_become_element_deltas_one_transaction_per_batch(setup):
    h, nft, sync = setup
    sync.start()
    h.start([nodeport()], [])
    sync.flush()
    nft.ops()

    # two Services changed in one batch: one transaction
    h.upsert(service("db", cluster_ip="10.96.0.20"), sync=False)
    h.upsert(nodeport(local=True), sync=False)
    h.engine.sync()
    assert sync.flush()
    ((op, script),) = nft.scripts
    assert op == "elements"
    assert script == (
        "delete element inet ipvsctl services4 { 192.0.2.10 . tcp . 30080 }\n"
        "add element inet ipvsctl services4 { 10.96.0.20 . tcp . 80 : goto cluster-ip, "
        "192.0.2.10 . tcp . 30080 : goto external-local }\n"
        "add element inet ipvsctl virtual-servers4 { 10.96.0.20 . tcp . 80 }\n"
        "add element inet ipvsctl vip-ports4 { 10.96.0.20 . tcp . 80 }\n"
        "add element inet ipvsctl vips4 { 10.96.0.20 }\n"
    )
    nft.ops()

    h.delete(service("db"))
    assert sync.flush()
    assert nft.scripts[-1][1] == (
        "delete element inet ipvsctl services4 { 10.96.0.20 . tcp . 80 }\n"
        "delete element inet ipvsctl virtual-servers4 { 10.96.0.20 . tcp . 80 }\n"
        "delete element inet ipvsctl vip-ports4 { 10.96.0.20 . tcp . 80 }\n"
        "delete element inet ipvsctl vips4 { 10.96.0.20 }\n"
    )
    assert nft.elements() == {
        "10.96.0.10 . tcp . 80": "cluster-ip",
        "192.0.2.10 . tcp . 30080": "external-local",
    }
    assert sync.applied == {
        vs(): Element(Verdict.CLUSTER_IP, vip=True),
        vs("192.0.2.10", 30080): Element(Verdict.EXTERNAL_LOCAL),
    }


def test_a_service_removed_and_added_back_in_one_batch_costs_nothing(setup):
    h, nft, sync = setup
    sync.start()
    h.start([nodeport()], [])
    sync.flush()
    nft.ops()
    h.delete(nodeport())
    h.upsert(nodeport())
    assert sync.flush() and nft.ops() == []


def test_failed_push_is_retried_as_a_full_replace(setup):
    h, nft, sync = setup
    sync.start()
    h.start([nodeport()], [])
    sync.flush()
    nft.ops()
    nft.fail = 1
    h.upsert(service("db", cluster_ip="10.96.0.20"))
    sync.step()
    assert nft.ops() == []  # the failed one is not recorded
    assert sync.pending()
    sync.step()  # backoff: not yet
    assert nft.ops() == []
    h.clock.advance(CONFIG.retry_min)
    sync.step()
    assert nft.ops() == ["replace"]
    assert "10.96.0.20 . tcp . 80" in nft.elements()
    assert not sync.pending()


def test_periodic_check_rewrites_a_missing_or_changed_table_with_its_elements(setup):
    h, nft, sync = setup
    sync.start()
    h.start([nodeport()], [])
    sync.flush()
    nft.ops()

    assert sync.check() and sync.audit()
    nft.listing = "table v1 with a rule someone added"
    assert sync.check()  # the cheap check sees chains, sets and maps only...
    assert not sync.audit()  # ...the audit sees rules
    assert sync.flush()
    assert nft.ops() == ["table"]
    assert nft.elements() == {
        "10.96.0.10 . tcp . 80": "cluster-ip",
        "192.0.2.10 . tcp . 30080": "external",
    }
    assert sync.check() and sync.audit()  # the new listing is the baseline
    nft.declarations = "chains v1 and one more chain"
    assert not sync.check()
    assert sync.flush() and nft.ops() == ["table"]

    nft.exists, nft.maps = False, {n: {} for n in _NAMES}  # `nft flush ruleset`
    h.clock.advance(CONFIG.check_interval)
    sync.step()  # the check finds it, the push in the same step rewrites it
    assert nft.ops() == ["table"]
    assert len(nft.elements()) == 2


def test_audit_puts_back_elements_someone_removed(setup):
    h, nft, sync = setup
    sync.start()
    h.start([nodeport()], [])
    sync.flush()
    nft.ops()
    assert sync.audit()
    del nft.maps["services4"]["10.96.0.10 . tcp . 80"]
    nft.maps["services6"]["fd00::1 . tcp . 1"] = "external"
    h.clock.advance(CONFIG.audit_interval)
    sync.step()
    assert nft.ops() == ["replace"]
    assert nft.elements() == {
        "10.96.0.10 . tcp . 80": "cluster-ip",
        "192.0.2.10 . tcp . 30080": "external",
    }


def test_audit_puts_back_source_ranges_someone_removed(setup):
    h, nft, sync = setup
    sync.start()
    h.start(
        [
            service(
                "lb",
                cluster_ip="10.96.0.30",
                type="LoadBalancer",
                lb_ips=["203.0.113.7"],
                loadBalancerSourceRanges=["198.51.100.0/24"],
                ports=[{"name": "http", "port": 80}],
            )
        ],
        [],
    )
    sync.flush()
    nft.ops()
    restricted = {
        "firewall4": {"203.0.113.7 . tcp . 80": ""},
        "firewall-allow4": {"203.0.113.7 . tcp . 80 . 198.51.100.0/24": ""},
    }
    assert {n: nft.maps[n] for n in restricted} == restricted
    assert sync.audit()
    nft.maps["firewall-allow4"].clear()  # e.g. `nft flush set`: the LB IP would be closed
    h.clock.advance(CONFIG.audit_interval)
    sync.step()
    assert nft.ops() == ["replace"]
    assert {n: nft.maps[n] for n in restricted} == restricted
    del nft.maps["firewall4"]["203.0.113.7 . tcp . 80"]  # ... or open to all
    h.clock.advance(CONFIG.audit_interval)
    sync.step()
    assert nft.ops() == ["replace"]
    assert {n: nft.maps[n] for n in restricted} == restricted and sync.audit()


def test_start_replaces_a_table_it_cannot_update_in_place():
    nft = FakeNft()
    nft.fail = 1  # e.g. a map of another type from another version
    sync = NetfilterSync(nft, CONFIG)
    sync.start()
    assert [op for op, _ in nft.scripts] == ["table"]
    assert sync.baseline == ("chains v1", "table v1")


def test_start_fails_at_once_without_nft():
    class NoNft(FakeNft):
        def apply(self, script, operation):
            self.scripts.append((operation, script))
            raise NftUnavailable(f"nft {operation}: not found", operation)

    nft = NoNft()
    with pytest.raises(NftUnavailable):
        NetfilterSync(nft, CONFIG).start()
    assert nft.ops() == ["base"]  # no attempt to replace the table


def test_a_key_taken_over_by_another_service_is_not_deleted_by_the_first(setup):
    _, _, sync = setup
    a, b = ServiceRef("default", "a"), ServiceRef("default", "b")
    web = desired(nodeport())
    sync.on_service(a, None, web)
    sync.on_service(b, None, web)  # b took the keys (a let them go earlier in the batch)
    sync.on_service(a, web, None)  # a's late removal must not remove b's elements
    assert set(sync.desired) == set(web.virtual_servers)
    assert all(sync.owner[k] == b for k in web.virtual_servers)


def test_the_thread_pushes_when_woken(setup):
    h, nft, sync = setup
    sync.start()
    stop = threading.Event()
    t = threading.Thread(target=sync.run, args=(stop,), daemon=True)
    t.start()
    try:
        h.start([nodeport()], [])
        sync.wake.set()
        for _ in range(200):
            if "replace" in [op for op, _ in nft.scripts]:
                break
            threading.Event().wait(0.01)
        assert "replace" in [op for op, _ in nft.scripts]
    finally:
        stop.set()
        sync.wake.set()
        t.join(5)
    assert not t.is_alive()


def _filter(nft: FakeNft) -> dict[str, set[str]]:
    return {n: set(nft.maps[n]) for n in ("vips4", "vip-ports4") if nft.maps[n]}


def test_port_filter_sets_follow_services_sharing_an_address(setup):
    h, nft, sync = setup
    sync.start()
    # two Services on one external IP, at different ports
    web = service(
        "web",
        cluster_ip="10.96.0.10",
        externalIPs=["203.0.113.7"],
        ports=[{"name": "http", "port": 80}],
    )
    dns = service(
        "dns",
        cluster_ip="10.96.0.53",
        externalIPs=["203.0.113.7"],
        ports=[{"name": "dns", "port": 53, "protocol": "UDP"}],
    )
    h.start([web, dns], [])
    assert sync.flush()
    assert _filter(nft) == {
        "vips4": {"10.96.0.10", "10.96.0.53", "203.0.113.7"},
        "vip-ports4": {
            "10.96.0.10 . tcp . 80",
            "203.0.113.7 . tcp . 80",
            "10.96.0.53 . udp . 53",
            "203.0.113.7 . udp . 53",
        },
    }
    nft.ops()
    h.delete(web)  # the shared address stays for dns; only web's ports leave
    assert sync.flush() and nft.ops() == ["elements"]
    assert _filter(nft) == {
        "vips4": {"10.96.0.53", "203.0.113.7"},
        "vip-ports4": {"10.96.0.53 . udp . 53", "203.0.113.7 . udp . 53"},
    }
    h.delete(dns)
    assert sync.flush() and _filter(nft) == {}
    assert +sync.applied_counts == {} and +sync.desired_counts == {}


def test_audit_puts_back_port_filter_elements_someone_removed(setup):
    h, nft, sync = setup
    sync.start()
    h.start([nodeport()], [])
    sync.flush()
    nft.ops()
    want = _filter(nft)
    assert want == {"vips4": {"10.96.0.10"}, "vip-ports4": {"10.96.0.10 . tcp . 80"}}
    assert sync.audit()
    nft.maps["vip-ports4"].clear()  # the ClusterIP's own port would be refused
    h.clock.advance(CONFIG.audit_interval)
    sync.step()
    assert nft.ops() == ["replace"] and _filter(nft) == want
    nft.maps["vips4"].clear()  # ... or the address open on every port
    h.clock.advance(CONFIG.audit_interval)
    sync.step()
    assert nft.ops() == ["replace"] and _filter(nft) == want and sync.audit()


def test_the_daemon_s_node_addresses_are_never_filtered():
    h = Harness()
    nft = FakeNft()
    sync = NetfilterSync(
        nft,
        CONFIG,
        ready=lambda: h.engine.started,
        clock=h.clock.monotonic,
        node_ips=lambda: h.engine.config.node.node_ips,
    )
    h.feed.subscribe(Subscriptions(service=sync.on_service))
    sync.start()
    # at a port in the NodePort range: a node address at any other is no virtual server
    ports = [{"name": "http", "port": 30080}]
    h.start([service("web", externalIPs=["192.0.2.10"], ports=ports)], [])
    assert sync.flush()
    assert _filter(nft) == {"vips4": {"10.96.0.10"}, "vip-ports4": {"10.96.0.10 . tcp . 30080"}}
    assert nft.elements()["192.0.2.10 . tcp . 30080"] == "external"  # still masqueraded

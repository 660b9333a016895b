"""The nftables generator: golden ruleset text, elements per Service, element deltas.

The texts here are what `nft -f -` receives; test_netfilter_nft.py feeds them to the real
nft (in a throwaway network namespace) where that is possible."""

from __future__ import annotations

import pytest

from devkit.builders import endpoint, endpoint_slice, service
from ipvsctl.model import NodeContext, Protocol, ServiceKey, ServiceRef
from ipvsctl.netfilter.ruleset import (
    Element,
    ElementDelta,
    RulesetConfig,
    Verdict,
    base_ruleset,
    delete_table_ruleset,
    delta_ruleset,
    element_delta,
    filter_counts,
    parse_cidrs,
    replace_elements_ruleset,
    replace_table_ruleset,
    service_elements,
)
from ipvsctl.plan.desired import build_desired_service
from ipvsctl.source.convert import parse_endpoint_slice, parse_service

NODE = NodeContext("node-a", ("192.0.2.10", "2001:db8::10"), "rr")
CONFIG = RulesetConfig(cluster_cidrs=("10.244.0.0/16", "fd00:10:244::/56"))
# Map elements without source ranges, by verdict
CIP, EXT, EXT_LOCAL = (
    Element(Verdict.CLUSTER_IP),
    Element(Verdict.EXTERNAL),
    Element(Verdict.EXTERNAL_LOCAL),
)
# ... on an address of the dummy interface (the port filter covers it)
VCIP, VEXT = Element(Verdict.CLUSTER_IP, vip=True), Element(Verdict.EXTERNAL, vip=True)

GOLDEN_BASE = """\
add table inet ipvsctl
add map inet ipvsctl services4 { type ipv4_addr . inet_proto . inet_service : verdict ; }
add map inet ipvsctl services6 { type ipv6_addr . inet_proto . inet_service : verdict ; }
add set inet ipvsctl hairpin4 { type ipv4_addr . ipv4_addr ; flags dynamic,timeout ; timeout 10s ; size 65535 ; }
add set inet ipvsctl hairpin6 { type ipv6_addr . ipv6_addr ; flags dynamic,timeout ; timeout 10s ; size 65535 ; }
add set inet ipvsctl firewall4 { type ipv4_addr . inet_proto . inet_service ; }
add set inet ipvsctl firewall-allow4 { type ipv4_addr . inet_proto . inet_service . ipv4_addr ; flags interval ; }
add set inet ipvsctl firewall6 { type ipv6_addr . inet_proto . inet_service ; }
add set inet ipvsctl firewall-allow6 { type ipv6_addr . inet_proto . inet_service . ipv6_addr ; flags interval ; }
add set inet ipvsctl virtual-servers4 { type ipv4_addr . inet_proto . inet_service ; }
add set inet ipvsctl virtual-servers6 { type ipv6_addr . inet_proto . inet_service ; }
add set inet ipvsctl vips4 { type ipv4_addr ; }
add set inet ipvsctl vip-ports4 { type ipv4_addr . inet_proto . inet_service ; }
add set inet ipvsctl vips6 { type ipv6_addr ; }
add set inet ipvsctl vip-ports6 { type ipv6_addr . inet_proto . inet_service ; }
add chain inet ipvsctl hairpin
add chain inet ipvsctl source-ranges
add chain inet ipvsctl vip-filter
add chain inet ipvsctl cluster-ip
add chain inet ipvsctl external
add chain inet ipvsctl external-local
add chain inet ipvsctl nat-postrouting { type nat hook postrouting priority srcnat ; policy accept ; }
add chain inet ipvsctl filter-input { type filter hook input priority mangle ; policy accept ; }
add chain inet ipvsctl filter-output { type filter hook output priority mangle ; policy accept ; }
add chain inet ipvsctl hold-forward { type filter hook forward priority 110 ; policy accept ; }
add chain inet ipvsctl hold-input { type filter hook input priority 110 ; policy accept ; }
add chain inet ipvsctl hold-output { type filter hook output priority filter ; policy accept ; }
flush chain inet ipvsctl hairpin
flush chain inet ipvsctl source-ranges
flush chain inet ipvsctl vip-filter
flush chain inet ipvsctl cluster-ip
flush chain inet ipvsctl external
flush chain inet ipvsctl external-local
flush chain inet ipvsctl nat-postrouting
flush chain inet ipvsctl filter-input
flush chain inet ipvsctl filter-output
flush chain inet ipvsctl hold-forward
flush chain inet ipvsctl hold-input
flush chain inet ipvsctl hold-output
add rule inet ipvsctl hairpin meta nfproto ipv4 update @hairpin4 { ip saddr . ip saddr } ip saddr . ip daddr @hairpin4 masquerade fully-random
add rule inet ipvsctl hairpin meta nfproto ipv6 update @hairpin6 { ip6 saddr . ip6 saddr } ip6 saddr . ip6 daddr @hairpin6 masquerade fully-random
add rule inet ipvsctl source-ranges meta nfproto ipv4 ip daddr . meta l4proto . th dport @firewall4 ip daddr . meta l4proto . th dport . ip saddr != @firewall-allow4 drop
add rule inet ipvsctl source-ranges meta nfproto ipv6 ip6 daddr . meta l4proto . th dport @firewall6 ip6 daddr . meta l4proto . th dport . ip6 saddr != @firewall-allow6 drop
add rule inet ipvsctl vip-filter meta nfproto ipv4 ip daddr @vips4 ip daddr . meta l4proto . th dport != @vip-ports4 reject
add rule inet ipvsctl vip-filter meta nfproto ipv6 ip6 daddr @vips6 ip6 daddr . meta l4proto . th dport != @vip-ports6 reject
add rule inet ipvsctl cluster-ip jump hairpin
add rule inet ipvsctl cluster-ip fib saddr type local masquerade fully-random
add rule inet ipvsctl cluster-ip meta nfproto ipv4 ip saddr != { 10.244.0.0/16 } masquerade fully-random
add rule inet ipvsctl cluster-ip meta nfproto ipv6 ip6 saddr != { fd00:10:244::/56 } masquerade fully-random
add rule inet ipvsctl external masquerade fully-random
add rule inet ipvsctl external-local jump hairpin
add rule inet ipvsctl external-local fib saddr type local masquerade fully-random
add rule inet ipvsctl nat-postrouting meta l4proto { tcp, udp, sctp } ct original ip daddr . meta l4proto . ct original proto-dst vmap @services4
add rule inet ipvsctl nat-postrouting meta l4proto { tcp, udp, sctp } ct original ip6 daddr . meta l4proto . ct original proto-dst vmap @services6
add rule inet ipvsctl filter-input ct state new meta l4proto { tcp, udp, sctp } jump source-ranges
add rule inet ipvsctl filter-output ct state new meta l4proto { tcp, udp, sctp } jump source-ranges
add rule inet ipvsctl filter-input ct state new meta l4proto { tcp, udp, sctp } jump vip-filter
add rule inet ipvsctl hold-forward meta l4proto { tcp, udp, sctp } ip daddr . meta l4proto . th dport @virtual-servers4 drop
add rule inet ipvsctl hold-forward meta l4proto { tcp, udp, sctp } ip6 daddr . meta l4proto . th dport @virtual-servers6 drop
add rule inet ipvsctl hold-forward meta l4proto { tcp, udp, sctp } ct direction reply ct status & dnat == 0 ct original ip daddr . meta l4proto . ct original proto-dst @virtual-servers4 ip saddr . meta l4proto . th sport != @virtual-servers4 drop
add rule inet ipvsctl hold-forward meta l4proto { tcp, udp, sctp } ct direction reply ct status & dnat == 0 ct original ip6 daddr . meta l4proto . ct original proto-dst @virtual-servers6 ip6 saddr . meta l4proto . th sport != @virtual-servers6 drop
add rule inet ipvsctl hold-input meta l4proto { tcp, udp, sctp } ct direction original ct status & dnat == 0 ip daddr . meta l4proto . th dport @virtual-servers4 ct state established drop
add rule inet ipvsctl hold-input meta l4proto { tcp, udp, sctp } ct direction original ct status & dnat == 0 ip6 daddr . meta l4proto . th dport @virtual-servers6 ct state established drop
add rule inet ipvsctl hold-input ip daddr . meta l4proto . th dport @virtual-servers4 ct state new tcp flags & (syn | ack) == syn drop
add rule inet ipvsctl hold-input meta l4proto udp ip daddr . meta l4proto . th dport @virtual-servers4 drop
add rule inet ipvsctl hold-input ip6 daddr . meta l4proto . th dport @virtual-servers6 ct state new tcp flags & (syn | ack) == syn drop
add rule inet ipvsctl hold-input meta l4proto udp ip6 daddr . meta l4proto . th dport @virtual-servers6 drop
add rule inet ipvsctl hold-input meta l4proto { tcp, udp, sctp } ct direction reply ct status & dnat == 0 ct original ip daddr . meta l4proto . ct original proto-dst @virtual-servers4 ip saddr . meta l4proto . th sport != @virtual-servers4 drop
add rule inet ipvsctl hold-input meta l4proto { tcp, udp, sctp } ct direction reply ct status & dnat == 0 ct original ip6 daddr . meta l4proto . ct original proto-dst @virtual-servers6 ip6 saddr . meta l4proto . th sport != @virtual-servers6 drop
add rule inet ipvsctl hold-output meta l4proto { tcp, udp, sctp } ct direction original ct status & dnat == 0 ip daddr . meta l4proto . th dport @virtual-servers4 ct state established drop
add rule inet ipvsctl hold-output meta l4proto { tcp, udp, sctp } ct direction original ct status & dnat == 0 ip6 daddr . meta l4proto . th dport @virtual-servers6 ct state established drop
add rule inet ipvsctl hold-output ip daddr . meta l4proto . th dport @virtual-servers4 ct state new tcp flags & (syn | ack) == syn drop
add rule inet ipvsctl hold-output meta l4proto udp ip daddr . meta l4proto . th dport @virtual-servers4 drop
add rule inet ipvsctl hold-output ip6 daddr . meta l4proto . th dport @virtual-servers6 ct state new tcp flags & (syn | ack) == syn drop
add rule inet ipvsctl hold-output meta l4proto udp ip6 daddr . meta l4proto . th dport @virtual-servers6 drop
"""  # noqa: E501


def desired(svc: dict, slices: list[dict] = ()):
    return build_desired_service(
        parse_service(svc).value, [parse_endpoint_slice(s).value for s in slices], NODE
    )


def key(address: str, port: int, proto: str = "TCP") -> ServiceKey:
    return ServiceKey(Protocol(proto), address, port)


def test_golden_base_ruleset_with_dual_stack_cluster_cidrs():
    assert base_ruleset(CONFIG) == GOLDEN_BASE


def test_without_cluster_cidr_only_the_node_itself_is_masqueraded_to_cluster_ips():
    text = base_ruleset(RulesetConfig())
    cluster = [ln for ln in text.splitlines() if ln.startswith("add rule inet ipvsctl cluster-ip")]
    assert cluster == [
        "add rule inet ipvsctl cluster-ip jump hairpin",
        "add rule inet ipvsctl cluster-ip fib saddr type local masquerade fully-random",
    ]


def test_masquerade_all_masquerades_every_cluster_ip_connection_and_nothing_more():
    text = base_ruleset(RulesetConfig(cluster_cidrs=("10.244.0.0/16",), masquerade_all=True))
    cluster = [ln for ln in text.splitlines() if ln.startswith("add rule inet ipvsctl cluster-ip")]
    assert cluster == ["add rule inet ipvsctl cluster-ip masquerade fully-random"]
    # externalTrafficPolicy: Local still keeps the client's address (as kube-proxy)
    assert "add rule inet ipvsctl external-local jump hairpin" in text


def test_parse_cidrs_normalizes_and_rejects():
    assert parse_cidrs(["10.244.1.7/16", "10.244.0.0/16", "FD00::1/64"]) == (
        "10.244.0.0/16",
        "fd00::/64",
    )
    with pytest.raises(ValueError, match=r"10\.300\.0\.0/16: not a CIDR"):
        parse_cidrs(["10.300.0.0/16"])


def test_elements_per_address_kind_and_traffic_policy():
    svc = service(
        "web",
        cluster_ip=["10.96.0.10", "fd96::10"],
        type="LoadBalancer",
        ipFamilies=["IPv4", "IPv6"],
        externalIPs=["203.0.113.7"],
        lb_ips=["198.51.100.9"],
        ports=[
            {"name": "http", "port": 80, "nodePort": 30080},
            {"name": "dns", "port": 53, "protocol": "UDP", "nodePort": 30053},
        ],
    )
    got = service_elements(desired(svc))
    assert got == {
        key("10.96.0.10", 80): VCIP,
        key("fd96::10", 80): VCIP,
        key("203.0.113.7", 80): VEXT,
        key("198.51.100.9", 80): VEXT,
        key("192.0.2.10", 30080): EXT,  # node addresses: no port filter
        key("2001:db8::10", 30080): EXT,
        key("10.96.0.10", 53, "UDP"): VCIP,
        key("fd96::10", 53, "UDP"): VCIP,
        key("203.0.113.7", 53, "UDP"): VEXT,
        key("198.51.100.9", 53, "UDP"): VEXT,
        key("192.0.2.10", 30053, "UDP"): EXT,
        key("2001:db8::10", 30053, "UDP"): EXT,
    }
    local = service(
        "web",
        type="NodePort",
        externalTrafficPolicy="Local",
        internalTrafficPolicy="Local",
        ports=[{"name": "http", "port": 80, "nodePort": 30080}],
    )
    assert service_elements(desired(local)) == {
        key("10.96.0.10", 80): VCIP,  # internal policy changes endpoints only
        key("192.0.2.10", 30080): EXT_LOCAL,
    }
    assert service_elements(None) == {}


def test_endpoint_changes_leave_the_elements_equal():
    svc = service("web", type="NodePort", ports=[{"name": "http", "port": 80, "nodePort": 30080}])
    before = desired(svc, [endpoint_slice("web", [endpoint("10.244.1.5")])])
    after = desired(
        svc,
        [
            endpoint_slice(
                "web", [endpoint("10.244.1.6", ready=False), endpoint("10.244.2.7", node="node-b")]
            )
        ],
    )
    assert before != after
    assert service_elements(before) == service_elements(after)
    assert not element_delta(service_elements(before), service_elements(after))


def test_element_delta_per_service_change_and_its_text():
    a, b, c = key("10.96.0.10", 80), key("10.96.0.11", 53, "UDP"), key("fd96::10", 80)
    applied = {a: CIP, b: EXT}
    wanted = {a: CIP, b: EXT_LOCAL, c: EXT}
    delta = element_delta(applied, wanted)
    assert delta == ElementDelta(
        delete=((b, EXT),),
        add=((c, EXT), (b, EXT_LOCAL)),  # sorted by key
    )
    assert delta_ruleset(CONFIG, delta) == (
        "delete element inet ipvsctl services4 { 10.96.0.11 . udp . 53 }\n"
        "add element inet ipvsctl services4 { 10.96.0.11 . udp . 53 : goto external-local }\n"
        "add element inet ipvsctl services6 { fd96::10 . tcp . 80 : goto external }\n"
        # a verdict change keeps the key in the virtual-servers set (the hold rules')
        "add element inet ipvsctl virtual-servers6 { fd96::10 . tcp . 80 }\n"
    )
    # only the keys asked about: O(the Service), whatever else differs
    assert element_delta(applied, {}, keys=[a]) == ElementDelta(delete=((a, CIP),))
    assert not element_delta(applied, dict(applied))


FLUSH_SETS = "".join(
    f"flush set inet ipvsctl {name}\n"
    for name in (
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
)


def test_full_replacements_are_one_transaction_each():
    elements = {
        key("10.96.0.10", 80): CIP,
        key("192.0.2.10", 30080, "SCTP"): EXT,
        key("fd96::10", 80): CIP,
    }
    assert replace_elements_ruleset(CONFIG, elements) == (
        "flush map inet ipvsctl services4\n"
        "flush map inet ipvsctl services6\n"
        + FLUSH_SETS
        + "add element inet ipvsctl services4 { 192.0.2.10 . sctp . 30080 : goto external, "
        "10.96.0.10 . tcp . 80 : goto cluster-ip }\n"
        "add element inet ipvsctl services6 { fd96::10 . tcp . 80 : goto cluster-ip }\n"
        "add element inet ipvsctl virtual-servers4 { 192.0.2.10 . sctp . 30080, "
        "10.96.0.10 . tcp . 80 }\n"
        "add element inet ipvsctl virtual-servers6 { fd96::10 . tcp . 80 }\n"
    )
    table = replace_table_ruleset(CONFIG, elements)
    assert table.startswith("add table inet ipvsctl\ndelete table inet ipvsctl\n" + GOLDEN_BASE)
    assert table.endswith("add element inet ipvsctl virtual-servers6 { fd96::10 . tcp . 80 }\n")
    assert replace_elements_ruleset(CONFIG, {}) == (
        "flush map inet ipvsctl services4\nflush map inet ipvsctl services6\n" + FLUSH_SETS
    )
    assert delete_table_ruleset(CONFIG) == "add table inet ipvsctl\ndelete table inet ipvsctl\n"


def test_service_ref_is_not_in_the_text():
    # no Service names in nftables: the ruleset is about virtual servers only
    svc = service("secret-name", namespace="team")
    text = replace_elements_ruleset(CONFIG, service_elements(desired(svc)))
    assert "secret" not in text and "team" not in text
    assert ServiceRef("team", "secret-name")  # (the listener keeps the owner itself)


def test_port_filter_elements_for_every_bound_address_and_health_check_port():
    svc = service(
        "web",
        type="LoadBalancer",
        externalIPs=["203.0.113.7"],
        lb_ips=["198.51.100.9"],
        externalTrafficPolicy="Local",
        healthCheckNodePort=32000,
        ports=[{"name": "http", "port": 80, "nodePort": 30080}],
    )
    elements = service_elements(desired(svc))
    assert filter_counts(elements.items()) == {
        ("vips4", "10.96.0.10"): 1,
        ("vip-ports4", "10.96.0.10", "tcp", "80"): 1,
        ("vips4", "203.0.113.7"): 1,
        ("vip-ports4", "203.0.113.7", "tcp", "80"): 1,
        ("vips4", "198.51.100.9"): 1,
        ("vip-ports4", "198.51.100.9", "tcp", "80"): 1,
        # cloud load balancers may probe the health check at the load-balancer IP
        ("vip-ports4", "198.51.100.9", "tcp", "32000"): 1,
    }  # nothing for the NodePort on 192.0.2.10: node addresses are not filtered
    text = replace_elements_ruleset(CONFIG, elements)
    assert "add element inet ipvsctl vips4 { 10.96.0.10, 198.51.100.9, 203.0.113.7 }\n" in text
    assert (
        "add element inet ipvsctl vip-ports4 { 10.96.0.10 . tcp . 80, 198.51.100.9 . tcp "
        ". 32000, 198.51.100.9 . tcp . 80, 203.0.113.7 . tcp . 80 }\n"
    ) in text


def test_a_shared_address_leaves_the_vips_set_with_its_last_virtual_server():
    http, dns, dns_tcp = (
        key("10.96.0.10", 80),
        key("10.96.0.10", 53, "UDP"),
        key("10.96.0.10", 53),
    )
    applied = {http: VCIP, dns: VCIP}
    # one of two virtual servers on the address goes: only its port leaves
    delta = element_delta(
        applied,
        {http: VCIP},
        keys=[dns],
        applied_counts=filter_counts(applied.items()),
        desired_counts=filter_counts({http: VCIP}.items()),
    )
    assert delta.filter_delete == (("vip-ports4", "10.96.0.10", "udp", "53"),)
    assert delta.filter_add == ()
    assert delta_ruleset(CONFIG, delta) == (
        "delete element inet ipvsctl services4 { 10.96.0.10 . udp . 53 }\n"
        "delete element inet ipvsctl virtual-servers4 { 10.96.0.10 . udp . 53 }\n"
        "delete element inet ipvsctl vip-ports4 { 10.96.0.10 . udp . 53 }\n"
    )
    # the last one goes: the address leaves too
    delta = element_delta({http: VCIP}, {})
    assert delta.filter_delete == (
        ("vip-ports4", "10.96.0.10", "tcp", "80"),
        ("vips4", "10.96.0.10"),
    )
    # a first virtual server on a new address brings it; a second only its port
    delta = element_delta({}, {dns_tcp: VCIP, dns: VCIP})
    assert delta.filter_add == (
        ("vip-ports4", "10.96.0.10", "tcp", "53"),
        ("vip-ports4", "10.96.0.10", "udp", "53"),
        ("vips4", "10.96.0.10"),
    )
    # a verdict change on a bound address leaves the filter sets alone
    delta = element_delta({http: VCIP}, {http: VEXT})
    assert delta.delete and delta.add and not (delta.filter_add or delta.filter_delete)
    # a NodePort has no filter elements at all
    assert not element_delta({}, {key("192.0.2.10", 30080): EXT}).filter_add


def test_an_external_ip_that_is_a_node_address_stays_out_of_the_port_filter():
    # else every host port on the node's own address (sshd) would be refused
    # (at a port in the NodePort range: a node address at any other is no virtual server)
    svc = service("web", externalIPs=["192.0.2.10"], ports=[{"name": "http", "port": 30080}])
    elements = service_elements(desired(svc), node_ips=NODE.node_ips)
    assert elements[key("192.0.2.10", 30080)] == EXT
    assert ("vips4", "192.0.2.10") not in filter_counts(elements.items())
    assert ("vips4", "10.96.0.10") in filter_counts(elements.items())
    # without knowing the node's addresses it would be filtered
    assert service_elements(desired(svc))[key("192.0.2.10", 30080)].vip

"""loadBalancerSourceRanges: parsed from the Service, narrowed per load-balancer IP, and
turned into nftables elements (the lab shows the traffic: tests/lab/test_netfilter_lab.py)."""

from __future__ import annotations

from devkit.builders import service
from ipvsctl.kube.trim import trim_service
from ipvsctl.model import NodeContext, Protocol, ServiceKey
from ipvsctl.netfilter.ruleset import (
    Element,
    RulesetConfig,
    Verdict,
    delta_ruleset,
    element_delta,
    service_elements,
)
from ipvsctl.plan.desired import build_desired_service, source_ranges
from ipvsctl.source.convert import parse_service

NODE = NodeContext("node-a", ("192.0.2.10", "2001:db8::10"), "rr")
LB4, LB6 = "203.0.113.7", "2001:db8:7::1"


def lb_service(ranges: list[str] | None, **spec) -> dict:
    if ranges is not None:
        spec["loadBalancerSourceRanges"] = ranges
    return service(
        "web",
        ["10.96.0.10", "fd96::10"],
        type="LoadBalancer",
        lb_ips=[LB4, LB6],
        ports=[{"name": "http", "port": 80, "nodePort": 30080}],
        **spec,
    )


def elements(svc: dict) -> dict[ServiceKey, Element]:
    return service_elements(build_desired_service(parse_service(svc).value, [], NODE))


def key(address: str, port: int = 80) -> ServiceKey:
    return ServiceKey(Protocol.TCP, address, port)


def test_only_load_balancer_ips_are_restricted_each_to_its_own_family():
    got = elements(lb_service(["198.51.100.0/24", "2001:db8:99::/48"]))
    assert got[key(LB4)] == Element(Verdict.EXTERNAL, ("198.51.100.0/24",), vip=True)
    assert got[key(LB6)] == Element(Verdict.EXTERNAL, ("2001:db8:99::/48",), vip=True)
    # cluster IPs and NodePorts stay open, as kube-proxy does it
    assert got[key("10.96.0.10")] == Element(Verdict.CLUSTER_IP, vip=True)
    assert got[key("192.0.2.10", 30080)] == Element(Verdict.EXTERNAL)


def test_without_ranges_nothing_is_restricted():
    assert all(e.source_ranges is None for e in elements(lb_service(None)).values())
    assert all(e.source_ranges is None for e in elements(lb_service([])).values())


def test_a_range_holding_a_node_address_lets_the_node_reach_the_ip():
    # The node reaches a local address with that address as source (kube-proxy's
    # allowFromNode): the load-balancer IP itself is allowed.
    got = elements(lb_service(["192.0.2.0/24"]))
    assert got[key(LB4)].source_ranges == ("192.0.2.0/24", "203.0.113.7/32")
    assert got[key(LB6)].source_ranges == ()  # no IPv6 range: closed, not open
    assert source_ranges(("10.0.0.0/8",), LB4, NODE.node_ips) == ("10.0.0.0/8",)
    assert source_ranges(None, LB4, NODE.node_ips) is None


def test_bad_ranges_are_ignored_with_a_warning_and_all_bad_means_closed():
    parsed = parse_service(lb_service(["nonsense", " 198.51.100.7/24 "]))
    assert parsed.value.source_ranges == ("198.51.100.0/24",)
    assert any("nonsense" in w for w in parsed.warnings)
    closed = parse_service(lb_service(["nonsense"]))
    assert closed.value.source_ranges == ()
    assert elements(lb_service(["nonsense"]))[key(LB4)].source_ranges == ()


def test_ranges_on_other_types_are_ignored():
    svc = service(
        "web",
        type="NodePort",
        loadBalancerSourceRanges=["198.51.100.0/24"],
        ports=[{"name": "http", "port": 80, "nodePort": 30080}],
    )
    assert parse_service(svc).value.source_ranges is None


def test_the_api_source_keeps_the_field():
    assert trim_service(lb_service(["198.51.100.0/24"]))["spec"]["loadBalancerSourceRanges"] == [
        "198.51.100.0/24"
    ]


def test_a_range_change_is_a_delta_of_the_sets_only():
    before = elements(lb_service(["198.51.100.0/24"]))
    after = elements(lb_service(["198.51.100.0/24", "192.168.2.0/24"]))
    text = delta_ruleset(RulesetConfig(), element_delta(before, after))
    assert text == (
        "delete element inet ipvsctl services4 { 203.0.113.7 . tcp . 80 }\n"
        "delete element inet ipvsctl firewall4 { 203.0.113.7 . tcp . 80 }\n"
        "delete element inet ipvsctl firewall-allow4 { 203.0.113.7 . tcp . 80 . "
        "198.51.100.0/24 }\n"
        "add element inet ipvsctl services4 { 203.0.113.7 . tcp . 80 : goto external }\n"
        "add element inet ipvsctl firewall4 { 203.0.113.7 . tcp . 80 }\n"
        "add element inet ipvsctl firewall-allow4 { 203.0.113.7 . tcp . 80 . "
        "192.168.2.0/24, 203.0.113.7 . tcp . 80 . 198.51.100.0/24 }\n"
    )

"""CONTRACT.md "What becomes a virtual server", through the real conversion and planner."""

from __future__ import annotations

import pytest

from devkit.builders import endpoint, endpoint_slice, service, terminating
from ipvsctl.cli.render import plan_json
from ipvsctl.model import NodeContext
from ipvsctl.reconcile.cluster import plan_objects
from ipvsctl.source.events import ObjectKind

NODE = NodeContext("node-a", ("192.0.2.10", "2001:db8::10"), "rr")


def vs_map(services, slices, node=NODE):
    plan, problems = plan_objects(
        {ObjectKind.SERVICE: list(services), ObjectKind.ENDPOINT_SLICE: list(slices)}, node
    )
    out = {}
    for v in plan_json(plan)["virtual_servers"]:
        key = f"{v['protocol']} {v['address']}:{v['port']}"
        out[key] = sorted(f"{r['address']}:{r['port']}" for r in v["real_servers"])
    return out, plan_json(plan), problems


def test_cluster_ip_with_ready_endpoints():
    got, js, problems = vs_map(
        [service("web")], [endpoint_slice("web", [endpoint("10.244.1.5"), endpoint("10.244.2.6")])]
    )
    assert got == {"TCP 10.96.0.10:80": ["10.244.1.5:8080", "10.244.2.6:8080"]}
    v = js["virtual_servers"][0]
    assert (v["service"], v["port_name"], v["scheduler"], v["persistent_timeout"]) == (
        "default/web",
        "http",
        "rr",
        0,
    )
    assert all(r["weight"] == 1 for r in v["real_servers"])
    assert problems == []


def test_headless_and_external_name_give_nothing():
    got, _, _ = vs_map(
        [
            service("headless", cluster_ip="None"),
            service("ext", cluster_ip=None, type="ExternalName", externalName="example.org"),
        ],
        [endpoint_slice("headless", [endpoint("10.244.1.5")])],
    )
    assert got == {}


def test_every_address_kind_and_nodeports():
    svc = service(
        "web",
        cluster_ip="10.96.0.10",
        type="LoadBalancer",
        externalIPs=["203.0.113.7"],
        lb_ips=["198.51.100.9"],
        ports=[
            {"name": "http", "port": 80, "nodePort": 30080},
            {"name": "dns", "port": 53, "protocol": "UDP", "nodePort": 30053},
        ],
    )
    sl = endpoint_slice(
        "web",
        [endpoint("10.244.1.5")],
        ports=[{"name": "http", "port": 8080}, {"name": "dns", "port": 5353, "protocol": "UDP"}],
    )
    got, _, _ = vs_map([svc], [sl])
    assert got == {
        "TCP 10.96.0.10:80": ["10.244.1.5:8080"],
        "TCP 192.0.2.10:30080": ["10.244.1.5:8080"],  # IPv4 service: only IPv4 node IPs
        "TCP 198.51.100.9:80": ["10.244.1.5:8080"],
        "TCP 203.0.113.7:80": ["10.244.1.5:8080"],
        "UDP 10.96.0.10:53": ["10.244.1.5:5353"],
        "UDP 192.0.2.10:30053": ["10.244.1.5:5353"],
        "UDP 198.51.100.9:53": ["10.244.1.5:5353"],
        "UDP 203.0.113.7:53": ["10.244.1.5:5353"],
    }


def test_lb_ips_ignored_unless_type_load_balancer():
    got, _, _ = vs_map([service("web", lb_ips=["198.51.100.9"])], [])
    assert list(got) == ["TCP 10.96.0.10:80"]


def test_dual_stack_gets_real_servers_of_its_own_family():
    svc = service(
        "web",
        cluster_ip=["10.96.0.10", "fd00::0010"],
        type="NodePort",
        ports=[{"name": "http", "port": 80, "nodePort": 30080}],
    )
    v4 = endpoint_slice("web", [endpoint("10.244.1.5")], name="web-v4")
    v6 = endpoint_slice("web", [endpoint("fd00:244::5")], name="web-v6", address_type="IPv6")
    got, _, _ = vs_map([svc], [v4, v6])
    assert got == {
        "TCP 10.96.0.10:80": ["10.244.1.5:8080"],
        "TCP 192.0.2.10:30080": ["10.244.1.5:8080"],
        "TCP 2001:db8::10:30080": ["fd00:244::5:8080"],
        "TCP fd00::10:80": ["fd00:244::5:8080"],  # compressed form
    }


def test_named_ports_and_protocol_must_match():
    svc = service("web", ports=[{"name": "http", "port": 80}, {"name": "metrics", "port": 9090}])
    sl = endpoint_slice(
        "web",
        [endpoint("10.244.1.5")],
        ports=[
            {"name": "http", "port": 8080},
            {"name": "metrics", "port": 9100, "protocol": "UDP"},
            {"name": "other", "port": 1},
        ],
    )
    got, _, _ = vs_map([svc], [sl])
    assert got == {"TCP 10.96.0.10:80": ["10.244.1.5:8080"], "TCP 10.96.0.10:9090": []}


def test_unnamed_port_matches_unnamed_slice_port():
    svc = service("web", ports=[{"port": 80}])
    sl = endpoint_slice("web", [endpoint("10.244.1.5")], ports=[{"port": 8080}])
    assert vs_map([svc], [sl])[0] == {"TCP 10.96.0.10:80": ["10.244.1.5:8080"]}


def test_duplicates_across_slices_count_once_and_other_services_slices_ignored():
    a = endpoint_slice("web", [endpoint("10.244.1.5"), endpoint("10.244.1.6")], name="web-a")
    b = endpoint_slice("web", [endpoint("10.244.1.6"), endpoint("10.244.1.7")], name="web-b")
    other = endpoint_slice("api", [endpoint("10.244.9.9")], name="api-a")
    fqdn = endpoint_slice("web", [], name="web-fqdn", address_type="FQDN")
    got, _, _ = vs_map([service("web")], [a, b, other, fqdn])
    assert got == {"TCP 10.96.0.10:80": ["10.244.1.5:8080", "10.244.1.6:8080", "10.244.1.7:8080"]}


def test_slice_in_other_namespace_is_not_used():
    sl = endpoint_slice("web", [endpoint("10.244.1.5")], namespace="other")
    assert vs_map([service("web")], [sl])[0] == {"TCP 10.96.0.10:80": []}


def test_conditions_absent_mean_ready_and_serving():
    sl = endpoint_slice("web", [endpoint("10.244.1.5", ready=None)])
    assert vs_map([service("web")], [sl])[0] == {"TCP 10.96.0.10:80": ["10.244.1.5:8080"]}


def test_session_affinity_is_persistence():
    default = service("a", cluster_ip="10.96.0.1", sessionAffinity="ClientIP")
    custom = service(
        "b",
        cluster_ip="10.96.0.2",
        sessionAffinity="ClientIP",
        sessionAffinityConfig={"clientIP": {"timeoutSeconds": 60}},
    )
    _, js, _ = vs_map([default, custom], [])
    assert [v["persistent_timeout"] for v in js["virtual_servers"]] == [10800, 60]


@pytest.mark.parametrize(
    ("annotations", "scheduler"),
    [
        ({}, "rr"),
        ({"kube-router.io/service.scheduler": "lc"}, "lc"),
        ({"ipvsctl.io/scheduler": "sh", "kube-router.io/service.scheduler": "lc"}, "sh"),
    ],
)
def test_scheduler_annotations(annotations, scheduler):
    _, js, _ = vs_map([service("web", annotations=annotations)], [])
    assert js["virtual_servers"][0]["scheduler"] == scheduler


def test_default_scheduler_from_node_context():
    node = NodeContext("node-a", (), "wlc")
    _, js, _ = vs_map([service("web")], [], node=node)
    assert js["virtual_servers"][0]["scheduler"] == "wlc"


def test_unknown_scheduler_annotation_falls_back_with_a_warning():
    _, js, problems = vs_map([service("web", annotations={"ipvsctl.io/scheduler": "bogus"})], [])
    assert js["virtual_servers"][0]["scheduler"] == "rr"
    assert len(problems) == 1 and not problems[0].fatal and "bogus" in problems[0].reason


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        (service("bad", cluster_ip="10.96.0.300"), "not an IP address"),
        (service("bad", ports=[{"port": 70000}]), "not a port number"),
        (service("bad", ports=[{"port": 80, "protocol": "ICMP"}]), "unknown protocol"),
        (service("bad", type="Weird"), "unknown type"),
        (service("bad", externalIPs=["nope"]), "not an IP address"),
        ({"kind": "Service", "metadata": {}, "spec": {}}, "metadata.name"),
        (endpoint_slice("web", [endpoint("fd00::1")]), "not an IPv4 address"),
        (endpoint_slice("web", [endpoint("10.0.0.1")], address_type="IPX"), "unknown address type"),
        (endpoint_slice("web", [{"addresses": []}]), "addresses is empty"),
        (endpoint_slice("web", [endpoint("10.0.0.1")], ports=[{"port": "x"}]), "not a port"),
    ],
)
def test_bad_objects_are_skipped_and_the_rest_is_planned(bad, why):
    good_svc = service("good", cluster_ip="10.96.0.99")
    good_slice = endpoint_slice("good", [endpoint("10.244.7.7")])
    kind = ObjectKind.ENDPOINT_SLICE if bad["kind"] == "EndpointSlice" else ObjectKind.SERVICE
    svcs = [good_svc, service("web")] + ([bad] if kind is ObjectKind.SERVICE else [])
    slices = [good_slice] + ([bad] if kind is ObjectKind.ENDPOINT_SLICE else [])
    got, _, problems = vs_map(svcs, slices)
    assert got["TCP 10.96.0.99:80"] == ["10.244.7.7:8080"]
    assert len(problems) == 1 and problems[0].fatal and why in problems[0].reason
    assert problems[0].kind is kind


# --- kube-proxy pkg/proxy/topology_test.go TestCategorizeEndpoints (without topology
# hints, ProxyTerminatingEndpoints on as it is GA), ported: which endpoints a cluster IP
# (internal policy) and a NodePort (external policy) get. ------------------------------
def _ep(n, ready=True, serving=None, term=None, local=True):
    return endpoint(
        f"10.0.0.{n}",
        ready=ready,
        serving=serving,
        terminating=term,
        node="node-a" if local else "node-b",
    )


@pytest.mark.parametrize(
    ("itp", "etp", "eps", "cluster", "external"),
    [
        # "internalTrafficPolicy: Local, but all endpoints are remote"
        ("Local", "Cluster", [_ep(0, local=False), _ep(1, local=False)], [], [0, 1]),
        # "internalTrafficPolicy: Local, some endpoints are local"
        ("Local", "Cluster", [_ep(0), _ep(1, local=False)], [0], [0, 1]),
        # "Cluster traffic policy, endpoints not Ready"
        ("Cluster", "Cluster", [_ep(0, ready=False), _ep(1, ready=False)], [], []),
        # "Cluster traffic policy, some endpoints are Ready"
        ("Cluster", "Cluster", [_ep(0, ready=False), _ep(1)], [1], [1]),
        # "Cluster traffic policy, PTE enabled, all endpoints are terminating"
        (
            "Cluster",
            "Cluster",
            [_ep(0, False, True, True), _ep(1, False, True, True, local=False)],
            [0, 1],
            [0, 1],
        ),
        # "iTP: Cluster, eTP: Local, some endpoints local"
        ("Cluster", "Local", [_ep(0), _ep(1, local=False)], [0, 1], [0]),
        # "iTP: Local, eTP: Local, all endpoints remote": kube-proxy's IPVS mode (#97081, and
        # CONTRACT.md) gives the external addresses the cluster-wide endpoints instead
        ("Local", "Local", [_ep(0, local=False), _ep(1, local=False)], [], [0, 1]),
        # "iTP: Local, eTP: Local, PTE enabled, all endpoints remote and terminating"
        (
            "Local",
            "Local",
            [_ep(0, False, True, True, False), _ep(1, False, True, True, False)],
            [],
            [0, 1],
        ),
        # "iTP: Cluster, eTP: Local, PTE enabled, with terminating endpoints"
        (
            "Cluster",
            "Local",
            [
                _ep(0, local=False),
                _ep(1, False, False, None),
                _ep(2, False, True, True),
                _ep(3, False, True, True, False),
            ],
            [0],
            [2],
        ),
        # terminating but not serving is never a fallback
        ("Cluster", "Cluster", [_ep(0, False, False, True)], [], []),
    ],
)
def test_kube_proxy_categorize_endpoints(itp, etp, eps, cluster, external):
    svc = service(
        "web",
        type="NodePort",
        internalTrafficPolicy=itp,
        externalTrafficPolicy=etp,
        ports=[{"name": "http", "port": 80, "nodePort": 30080}],
    )
    sl = endpoint_slice("web", eps, ports=[{"name": "http", "port": 80}])
    got, _, _ = vs_map([svc], [sl], node=NodeContext("node-a", ("192.0.2.10",)))
    assert got["TCP 10.96.0.10:80"] == [f"10.0.0.{n}:80" for n in cluster]
    assert got["TCP 192.0.2.10:30080"] == [f"10.0.0.{n}:80" for n in external]


def test_ready_preferred_over_terminating_kep_1669():
    sl = endpoint_slice("web", [endpoint("10.244.1.5"), terminating("10.244.1.6")])
    assert vs_map([service("web")], [sl])[0] == {"TCP 10.96.0.10:80": ["10.244.1.5:8080"]}


def test_external_ips_follow_external_policy():
    svc = service("web", externalIPs=["203.0.113.7"], externalTrafficPolicy="Local")
    sl = endpoint_slice("web", [endpoint("10.244.1.5"), endpoint("10.244.2.6", node="node-b")])
    got, _, _ = vs_map([svc], [sl])
    assert got == {
        "TCP 10.96.0.10:80": ["10.244.1.5:8080", "10.244.2.6:8080"],
        "TCP 203.0.113.7:80": ["10.244.1.5:8080"],
    }


def test_virtual_server_wanted_twice_goes_to_first_service():
    a = service("a", cluster_ip="10.96.0.1", externalIPs=["203.0.113.7"])
    b = service("b", cluster_ip="10.96.0.2", externalIPs=["203.0.113.7"])
    _, js, problems = vs_map([b, a], [])
    owners = {v["address"]: v["service"] for v in js["virtual_servers"]}
    assert owners["203.0.113.7"] == "default/a"
    assert [p.name for p in problems] == ["default/b"]


def test_plan_json_is_sorted_by_protocol_then_address_by_value_then_port():
    svcs = [service(f"s{i}", cluster_ip=f"10.96.0.{i}") for i in (100, 9, 10, 2)]
    svcs.append(service("u", cluster_ip="10.96.0.1", ports=[{"port": 53, "protocol": "UDP"}]))
    svcs.append(service("v6", cluster_ip="fd00::a", ip_families=["IPv6"]))
    svcs.append(service("v6b", cluster_ip="fd00::9", ip_families=["IPv6"]))
    _, js, _ = vs_map(svcs, [])
    keys = [(v["protocol"], v["address"], v["port"]) for v in js["virtual_servers"]]
    # as strings, 10.96.0.10 and .100 came before .2 and .9, and fd00::a before fd00::9
    assert keys == [
        ("TCP", "10.96.0.2", 80),
        ("TCP", "10.96.0.9", 80),
        ("TCP", "10.96.0.10", 80),
        ("TCP", "10.96.0.100", 80),
        ("TCP", "fd00::9", 80),
        ("TCP", "fd00::a", 80),
        ("UDP", "10.96.0.1", 53),
    ]


def test_health_check_node_port_and_local_flags():
    svc = service(
        "lb",
        type="LoadBalancer",
        externalTrafficPolicy="Local",
        healthCheckNodePort=32000,
        lb_ips=["198.51.100.9"],
        ports=[{"name": "http", "port": 80, "nodePort": 30080}],
    )
    plan, _ = plan_objects({ObjectKind.SERVICE: [svc]}, NODE)
    desired = plan[0][0]
    assert desired.health_check_node_port == 32000
    local = {str(dvs.key): dvs.local_only for _, dvs in plan}
    assert local == {
        "10.96.0.10:80/TCP": False,
        "192.0.2.10:30080/TCP": True,
        "198.51.100.9:80/TCP": True,
    }


def test_a_service_of_many_ports_reads_its_slices_ports_once():
    """A tenant's Service of 1,024 ports over a slice of 1,024 ports: each Service port
    used to scan every slice port (2 families x 1,024 x 1,024 comparisons, a third of the
    build's time, under the loop lock at every change of the slice); the slices' ports are
    indexed once per build. The plan is the same."""
    import dataclasses

    from ipvsctl.plan.desired import build_desired_service
    from ipvsctl.source.events import Replace
    from ipvsctl.source.store import ObjectStore

    class CountingPorts(tuple):
        reads = 0

        def __iter__(self):
            CountingPorts.reads += 1
            return super().__iter__()

    n = 64
    ports = [{"name": f"p{j}", "port": 1000 + j, "protocol": "TCP"} for j in range(n)]
    slice_ports = [{"name": f"p{j}", "port": 8000 + j, "protocol": "TCP"} for j in range(n)]
    store = ObjectStore("rr", node_name="node-a")
    store.apply(Replace(ObjectKind.SERVICE, [service("amp", ports=ports)], 0.0))
    store.apply(
        Replace(
            ObjectKind.ENDPOINT_SLICE,
            [endpoint_slice("amp", [endpoint("10.244.1.5")], ports=slice_ports)],
            0.0,
        )
    )
    (ref,) = store.services
    (sl,) = store.slices_of(ref)
    counted = dataclasses.replace(sl, ports=CountingPorts(sl.ports))
    desired = build_desired_service(store.services[ref], [counted], NODE)
    assert CountingPorts.reads == 1
    assert len(desired.virtual_servers) == n
    assert {dvs.real_servers[0].port for dvs in desired.virtual_servers.values()} == {
        8000 + j for j in range(n)
    }

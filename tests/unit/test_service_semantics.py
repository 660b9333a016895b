"""The Service semantics kube-proxy and kube-router users rely on (CONTRACT.md
"What becomes a virtual server", "Durations"), table-style as kube-proxy's tests, through
the real conversion and planner (`plan --json`) and the engine on the in-memory kernel."""

from __future__ import annotations

import dataclasses
import math

import pytest

from devkit.builders import endpoint, endpoint_slice, service, terminating
from devkit.harness import Harness, rs, vs
from ipvsctl.cli.render import plan_json
from ipvsctl.daemon.options import SourceOptions
from ipvsctl.model import DeadlineSource, NodeContext
from ipvsctl.reconcile.cluster import plan_objects
from ipvsctl.source.events import ObjectKind

NODE = NodeContext("node-a", ("192.0.2.10",), "rr")
A, B = "10.244.1.5", "10.244.1.6"


def plan(services, slices=(), node=NODE):
    result, problems = plan_objects(
        {ObjectKind.SERVICE: list(services), ObjectKind.ENDPOINT_SLICE: list(slices)}, node
    )
    got = {}
    for v in plan_json(result)["virtual_servers"]:
        got[f"{v['protocol']} {v['address']}:{v['port']}"] = sorted(
            f"{r['address']}:{r['port']}" for r in v["real_servers"]
        )
    return got, problems


def labelled(svc, **labels):
    svc["metadata"]["labels"] = dict(labels)
    return svc


# --- ipvsctl.io/drain-timeout: durations ----------------------------------------------


@pytest.mark.parametrize(
    ("value", "deadline", "source", "warned"),
    [
        ("5", 5, DeadlineSource.ANNOTATION, False),
        ("2.5", 2.5, DeadlineSource.ANNOTATION, False),
        ("5m", 300, DeadlineSource.ANNOTATION, False),
        ("1m30s", 90, DeadlineSource.ANNOTATION, False),
        ("1h", 3600, DeadlineSource.ANNOTATION, False),
        ("500ms", 0.5, DeadlineSource.ANNOTATION, False),
        # Invalid: one warning, counted, and the next rule: the endpoint is listed as
        # terminating, so its pod's lifetime bounds it (no deadline of its own).
        ("5 minutes", math.inf, DeadlineSource.POD, True),
        ("-5s", math.inf, DeadlineSource.POD, True),
        ("nan", math.inf, DeadlineSource.POD, True),
        ("1d", math.inf, DeadlineSource.POD, True),
        ("99999999h", math.inf, DeadlineSource.POD, True),
    ],
)
def test_drain_timeout_annotation(value, deadline, source, warned):
    svc = service("web", annotations={"ipvsctl.io/drain-timeout": value})
    h = Harness(drain_timeout=300)
    h.start([svc], [endpoint_slice("web", [endpoint(A, pod="pod-5"), endpoint(B)])])
    h.fake.set_connections(vs(), rs(A), active=1)
    h.upsert(endpoint_slice("web", [endpoint(B), terminating(A, pod="pod-5")]))
    e = h.engine.drains.queue.get(vs(), rs(A))
    assert e.deadline_source is source
    assert e.deadline - e.since == pytest.approx(deadline, abs=1)
    invalid = h.metrics.value("ipvsctl_invalid_objects_total", {"kind": "Service"})
    assert invalid == (1 if warned else 0)


def test_invalid_drain_timeout_annotation_without_pod_falls_to_the_flag():
    svc = service("web", annotations={"ipvsctl.io/drain-timeout": "soon"})
    h = Harness(drain_timeout=30)
    h.start([svc], [endpoint_slice("web", [endpoint(A), endpoint(B)])])
    h.fake.set_connections(vs(), rs(A), active=1)
    h.upsert(endpoint_slice("web", [endpoint(B)]))
    e = h.engine.drains.queue.get(vs(), rs(A))
    assert (e.deadline - e.since, e.deadline_source) == (30, DeadlineSource.DEFAULT)


def test_plan_warns_once_about_an_invalid_drain_timeout():
    _, problems = plan([service("web", annotations={"ipvsctl.io/drain-timeout": "5 min"})])
    assert len(problems) == 1 and not problems[0].fatal
    assert "ipvsctl.io/drain-timeout" in problems[0].reason


# --- --service-proxy-name and service.kubernetes.io/headless --------------------------

PROXY = "service.kubernetes.io/service-proxy-name"
HEADLESS = "service.kubernetes.io/headless"


@pytest.mark.parametrize(
    ("proxy_name", "labels", "served"),
    [
        (None, {}, True),
        (None, {"app": "web"}, True),
        (None, {PROXY: "cilium"}, False),
        (None, {PROXY: ""}, False),  # labelled at all: another proxy's, as kube-proxy
        (None, {HEADLESS: ""}, False),
        (None, {HEADLESS: "true"}, False),
        ("ipvsctl", {}, False),
        ("ipvsctl", {PROXY: "ipvsctl"}, True),
        ("ipvsctl", {PROXY: "cilium"}, False),
        ("ipvsctl", {PROXY: "ipvsctl", HEADLESS: ""}, False),
    ],
)
def test_service_labels(proxy_name, labels, served):
    node = NodeContext("node-a", ("192.0.2.10",), "rr", service_proxy_name=proxy_name)
    got, problems = plan(
        [labelled(service("web"), **labels)], [endpoint_slice("web", [endpoint(A)])], node
    )
    assert got == ({"TCP 10.96.0.10:80": [f"{A}:8080"]} if served else {})
    assert problems == []  # another proxy's Service is no problem of ours


def test_label_selector_matches_the_filter():
    from ipvsctl.source.convert import service_label_selector

    assert service_label_selector(None) == f"!{HEADLESS},!{PROXY}"
    assert service_label_selector("ipvsctl") == f"{PROXY}=ipvsctl,!{HEADLESS}"


def test_service_relabelled_to_another_proxy_is_removed_like_a_deleted_one():
    h = Harness()
    h.start([service("web")], [endpoint_slice("web", [endpoint(A)])])
    h.ops()
    h.upsert(labelled(service("web"), **{PROXY: "cilium"}))
    assert h.ops() == ["del-vs 10.96.0.10:80/TCP"]
    assert h.engine.intake.store.services == {}
    h.upsert(service("web"))  # label removed again: ours again
    assert "add-vs 10.96.0.10:80/TCP rr" in h.ops()[0]


def test_relist_drops_a_service_that_is_no_longer_ours():
    from ipvsctl.source.events import Replace

    h = Harness()
    h.start(
        [service("web"), service("db", cluster_ip="10.96.0.11")],
        [endpoint_slice("web", [endpoint(A)])],
    )
    h.ops()
    h.engine.handle(
        Replace(
            ObjectKind.SERVICE,
            [service("web"), labelled(service("db", cluster_ip="10.96.0.11"), **{HEADLESS: ""})],
            h.clock.monotonic(),
        )
    )
    h.engine.sync()
    assert h.ops() == ["del-vs 10.96.0.11:80/TCP"]


@pytest.mark.parametrize("bad", ["a,b", "x=y", "-a", "a" * 64, "bad name", "!x"])
def test_bad_service_proxy_name_is_exit_2(bad, tmp_path):
    from typer.testing import CliRunner

    from ipvsctl.cli.app import app

    for cmd in (["plan", "-f", str(tmp_path)], ["run", "--manifests", str(tmp_path)]):
        r = CliRunner().invoke(app, [*cmd, "--service-proxy-name", bad])
        assert r.exit_code == 2, r.output
        assert "--service-proxy-name" in r.output.strip().splitlines()[-1]


def test_plan_cli_takes_service_proxy_name(tmp_path):
    import json

    import yaml
    from typer.testing import CliRunner

    from ipvsctl.cli.app import app

    docs = [
        labelled(service("mine"), **{PROXY: "ipvsctl"}),
        service("theirs", cluster_ip="10.96.0.11"),
        labelled(service("headless", cluster_ip="10.96.0.12"), **{HEADLESS: ""}),
        endpoint_slice("mine", [endpoint(A)]),
        endpoint_slice("theirs", [endpoint(B)]),
    ]
    (tmp_path / "all.yaml").write_text(yaml.safe_dump_all(docs))
    base = ["plan", "-f", str(tmp_path), "--node-ip", "192.0.2.10", "--json"]
    for extra, want in (
        ([], ["default/theirs"]),
        (["--service-proxy-name", "ipvsctl"], ["default/mine"]),
    ):
        r = CliRunner().invoke(app, base + extra)
        assert r.exit_code == 0, r.output
        js = json.loads(r.stdout)
        assert [v["service"] for v in js["virtual_servers"]] == want


@pytest.mark.parametrize("proxy_name", [None, "ipvsctl"])
def test_daemon_lists_and_watches_services_with_the_selector(proxy_name):
    """Through the daemon's own wiring (open_source) and the real client, on the wire."""
    import queue
    import threading

    from devkit.fakeapi import FakeAPIServer
    from ipvsctl.daemon.adapters import open_source
    from ipvsctl.daemon.options import DaemonOptions
    from ipvsctl.obs.metrics import Metrics
    from ipvsctl.source.convert import service_label_selector

    api = FakeAPIServer().start()
    try:
        node = NodeContext("node-a", service_proxy_name=proxy_name)
        source = open_source(
            DaemonOptions(node=node, source=SourceOptions(apiserver=api.url)), Metrics()
        )
        events: queue.Queue = queue.Queue()
        stop = threading.Event()
        t = threading.Thread(target=source.run, args=(events.put, stop), daemon=True)
        t.start()
        # Services and EndpointSlices (this node's Node is watched too, at its own pace)
        assert api.wait_for(
            lambda: api.open_watches("Service") == 1 and api.open_watches("EndpointSlice") == 1,
            10.0,
        )
        stop.set()
        t.join(10.0)
        selector = service_label_selector(proxy_name)
        calls = {
            (r.resource, r.verb): r.query.get("labelSelector")
            for r in api.requests
            if r.resource in ("services", "endpointslices")
        }
        assert calls == {
            ("services", "list"): selector,
            ("services", "watch"): selector,
            ("endpointslices", "list"): None,
            ("endpointslices", "watch"): None,
        }
    finally:
        api.stop()


# --- --service-node-port-range --------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "ports"),
    [
        ("30000-32767", range(30000, 32768)),
        ("20000-22767", range(20000, 22768)),
        ("80", range(80, 81)),
        ("1-65535", range(1, 65536)),
        (" 100 - 200 ", range(100, 201)),
    ],
)
def test_node_port_range_accepted(text, ports):
    from ipvsctl.model.portrange import parse_port_range

    assert parse_port_range(text) == ports


@pytest.mark.parametrize(
    "text",
    [
        "",
        "-",
        "32767-30000",
        "0-100",
        "1-65536",
        "a-b",
        "30000:32767",
        "30000-",
        "-32767",
        "1-2-3",
        "99999999999-1",
        "\uff11-\uff12",
    ],
)
def test_node_port_range_rejected(text):
    from ipvsctl.model.portrange import parse_port_range

    with pytest.raises(ValueError):
        parse_port_range(text)


def _keys(*pairs):
    from ipvsctl.model import Protocol, ServiceKey

    return [ServiceKey(Protocol.TCP, ip, port) for ip, port in pairs]


@pytest.mark.parametrize(
    ("ports", "owned"),
    [
        (None, [("192.0.2.10", 30080)]),  # the default range
        (range(20000, 22768), [("192.0.2.10", 20080)]),
        (range(20000, 32768), [("192.0.2.10", 20080), ("192.0.2.10", 30080)]),
    ],
)
def test_cleanup_ownership_follows_the_node_port_range(ports, owned):
    from ipvsctl.plan.ownership import owned_virtual_servers

    candidates = _keys(
        ("192.0.2.10", 20080), ("192.0.2.10", 30080), ("192.0.2.10", 22), ("192.0.2.99", 20080)
    )
    args = () if ports is None else (ports,)
    assert owned_virtual_servers(candidates, [], ["192.0.2.10"], *args) == _keys(*owned)


def test_daemon_ownership_follows_the_node_port_range(monkeypatch):
    """A NodePort virtual server outside the default range is the daemon's (adopted and
    removed when nothing wants it) once --service-node-port-range says so."""
    from ipvsctl.daemon.adapters import open_kernel
    from ipvsctl.daemon.options import DaemonOptions
    from ipvsctl.kernel import netlink

    class Kernel:
        def __init__(self, interface: str) -> None:
            pass

        def bound_addresses(self):
            return ["10.96.0.10"]

    monkeypatch.setattr(netlink, "NetlinkKernel", Kernel)
    monkeypatch.setattr(netlink, "configure_host", lambda **kw: None)
    monkeypatch.setattr(netlink, "interface_addresses", lambda: ["10.96.0.77"])  # kube-router's
    node = NodeContext("node-a", ("192.0.2.10",))
    k20080, k30080, kvip = _keys(("192.0.2.10", 20080), ("192.0.2.10", 30080), ("10.96.0.10", 80))
    _, default, take_over = open_kernel(DaemonOptions(node=node))
    assert (default(k20080), default(k30080), default(kvip)) == (False, True, True)
    custom_node = dataclasses.replace(node, node_port_range=range(20000, 22768))
    _, custom, _ = open_kernel(DaemonOptions(node=custom_node))
    assert (custom(k20080), custom(k30080), custom(kvip)) == (True, False, True)
    # Ours, or a Kubernetes proxy's (kube-dummy-if), may be taken over; not
    # anyone else's (keepalived's address, a node address outside the NodePort range)
    (krouter, kkeepalived) = _keys(("10.96.0.77", 80), ("198.51.100.50", 80))
    assert [take_over(k) for k in (kvip, k30080, krouter, kkeepalived, k20080)] == [
        True,
        True,
        True,
        False,
        False,
    ]


@pytest.mark.parametrize("bad", ["32767-30000", "0-10", "1-70000", "many"])
def test_bad_node_port_range_is_exit_2(bad, tmp_path):
    from typer.testing import CliRunner

    from ipvsctl.cli.app import app

    for cmd in (
        ["run", "--manifests", str(tmp_path)],
        ["cleanup", "--node-ip", "192.0.2.10", "--dry-run"],
    ):
        r = CliRunner().invoke(app, [*cmd, "--service-node-port-range", bad])
        assert r.exit_code == 2, r.output
        assert "--service-node-port-range" in r.output.strip().splitlines()[-1]


def test_cleanup_removes_node_ports_of_a_custom_range(tmp_path):
    from ipvsctl.cli.cleanup import cleanup_node
    from tests.unit.test_cleanup import FakeHost

    host = FakeHost()
    before = set(host.vs)
    cleanup_node(host, "kube-ipvs0", ["192.0.2.10"], None, node_port_range=range(22, 23))
    gone = sorted(str(k) for k in before - set(host.vs))
    assert "192.0.2.10:22/TCP" in gone and "192.0.2.10:30080/TCP" not in gone


# --- externalTrafficPolicy: Local with no local endpoint (kube-proxy IPVS, #97081) -----


def _etp_local(itp="Cluster"):
    return service(
        "web",
        type="LoadBalancer",
        externalTrafficPolicy="Local",
        internalTrafficPolicy=itp,
        externalIPs=["203.0.113.7"],
        lb_ips=["198.51.100.9"],
        healthCheckNodePort=32000,
        ports=[{"name": "http", "port": 80, "nodePort": 30080}],
    )


LOCAL, REMOTE, REMOTE2 = "10.244.1.5", "10.244.2.6", "10.244.3.7"
EXTERNAL = ("TCP 192.0.2.10:30080", "TCP 198.51.100.9:80", "TCP 203.0.113.7:80")


@pytest.mark.parametrize(
    ("itp", "eps", "cluster", "external"),
    [
        # a local endpoint: external addresses use only it
        ("Cluster", [endpoint(LOCAL), endpoint(REMOTE, node="node-b")], [LOCAL, REMOTE], [LOCAL]),
        # none local: the cluster-wide endpoints instead of none
        (
            "Cluster",
            [endpoint(REMOTE, node="node-b"), endpoint(REMOTE2, node="node-c")],
            [REMOTE, REMOTE2],
            [REMOTE, REMOTE2],
        ),
        # a local one that is not ready: KEP-1669 first (a serving, terminating local one)
        ("Cluster", [terminating(LOCAL), endpoint(REMOTE, node="node-b")], [REMOTE], [LOCAL]),
        # local but neither ready nor serving: no local endpoint, so cluster-wide
        (
            "Cluster",
            [terminating(LOCAL, serving=False), endpoint(REMOTE, node="node-b")],
            [REMOTE],
            [REMOTE],
        ),
        # internalTrafficPolicy Local has no such fallback (kube-proxy drops, as here)
        ("Local", [endpoint(REMOTE, node="node-b")], [], [REMOTE]),
        # no endpoint anywhere: nothing
        ("Cluster", [], [], []),
    ],
)
def test_external_local_without_local_endpoints(itp, eps, cluster, external):
    got, _ = plan([_etp_local(itp)], [endpoint_slice("web", eps)])
    assert got["TCP 10.96.0.10:80"] == [f"{a}:8080" for a in cluster]
    for key in EXTERNAL:
        assert got[key] == [f"{a}:8080" for a in external], key


def test_fallback_keeps_the_health_check_at_503():
    """The healthCheckNodePort counts local ready endpoints, never the fallback's."""
    from ipvsctl.healthcheck.state import local_ready_endpoints

    result, _ = plan_objects(
        {
            ObjectKind.SERVICE: [_etp_local()],
            ObjectKind.ENDPOINT_SLICE: [endpoint_slice("web", [endpoint(REMOTE, node="node-b")])],
        },
        NODE,
    )
    desired = result[0][0]
    assert local_ready_endpoints(desired, "node-a") == 0
    assert desired.health_check_node_port == 32000


# --- LoadBalancer ingress ipMode (KEP-1860) -------------------------------------------


@pytest.mark.parametrize(
    ("ingress", "vips", "warned"),
    [
        ([{"ip": "198.51.100.9"}], ["198.51.100.9"], False),
        ([{"ip": "198.51.100.9", "ipMode": "VIP"}], ["198.51.100.9"], False),
        ([{"ip": "198.51.100.9", "ipMode": "Proxy"}], [], False),
        (
            [{"ip": "198.51.100.9", "ipMode": "Proxy"}, {"ip": "198.51.100.10", "ipMode": "VIP"}],
            ["198.51.100.10"],
            False,
        ),
        ([{"ip": "198.51.100.9", "ipMode": "proxy"}], ["198.51.100.9"], True),  # case matters
        ([{"ip": "198.51.100.9", "ipMode": "Tunnel"}], ["198.51.100.9"], True),
        ([{"ip": "198.51.100.9", "ipMode": 7}], ["198.51.100.9"], True),
        ([{"hostname": "lb.example.org", "ipMode": "Proxy"}], [], False),
    ],
)
def test_load_balancer_ip_mode(ingress, vips, warned):
    svc = service("web", type="LoadBalancer")
    svc["status"] = {"loadBalancer": {"ingress": ingress}}
    got, problems = plan([svc], [endpoint_slice("web", [endpoint(A)])])
    assert sorted(k.split()[1] for k in got if not k.startswith("TCP 10.96.")) == [
        f"{ip}:80" for ip in vips
    ]
    assert "TCP 10.96.0.10:80" in got  # the Service itself is never skipped
    assert [p.fatal for p in problems] == ([False] if warned else [])
    if warned:
        assert "ipMode" in problems[0].reason


def test_unknown_ip_mode_is_counted():
    svc = service("web", type="LoadBalancer")
    svc["status"] = {"loadBalancer": {"ingress": [{"ip": "198.51.100.9", "ipMode": "X"}]}}
    h = Harness()
    h.start([svc], [endpoint_slice("web", [endpoint(A)])])
    assert h.metrics.value("ipvsctl_invalid_objects_total", {"kind": "Service"}) == 1
    assert "198.51.100.9:80/TCP" in h.fake.dump()


# --- kube-router annotations with no ipvsctl meaning ----------------------------------

LOCAL_IGNORED = (
    "kube-router.io/service.local (use internalTrafficPolicy/externalTrafficPolicy: Local)"
)


@pytest.mark.parametrize(
    ("annotations", "named"),
    [
        (
            {"kube-router.io/service.dsr": "tunnel"},
            ["kube-router.io/service.dsr (ipvsctl forwards with NAT only)"],
        ),
        ({"kube-router.io/service.local": "true"}, [LOCAL_IGNORED]),
        (
            {"kube-router.io/service.hairpin": ""},
            ["kube-router.io/service.hairpin (hairpin is always on)"],
        ),
        (
            {"kube-router.io/service.hairpin.externalips": ""},
            ["kube-router.io/service.hairpin.externalips (hairpin is always on)"],
        ),
        (
            {"kube-router.io/service.skiplbips": "true"},
            ["kube-router.io/service.skiplbips (every load-balancer IP is served)"],
        ),
        (
            {
                "kube-router.io/service.dsr": "tunnel",
                "kube-router.io/service.local": "true",
                "kube-router.io/service.hairpin": "",
            },
            [
                "kube-router.io/service.dsr (ipvsctl forwards with NAT only)",
                "kube-router.io/service.hairpin (hairpin is always on)",
                LOCAL_IGNORED,
            ],
        ),
        ({"kube-router.io/service.scheduler": "lc"}, []),  # honoured: no warning
        ({"kube-router.io/other": "x", "ipvsctl.io/scheduler": "rr"}, []),
    ],
)
def test_kube_router_annotations_warn_once_per_service(annotations, named):
    got, problems = plan(
        [service("web", annotations=annotations)], [endpoint_slice("web", [endpoint(A)])]
    )
    assert got == {"TCP 10.96.0.10:80": [f"{A}:8080"]}  # the Service is still served
    if not named:
        assert problems == []
        return
    assert len(problems) == 1 and not problems[0].fatal
    assert problems[0].reason == f"kube-router annotations ignored: {', '.join(named)}"


def test_plan_prints_the_kube_router_warning(tmp_path):
    import yaml
    from typer.testing import CliRunner

    from ipvsctl.cli.app import app

    (tmp_path / "svc.yaml").write_text(
        yaml.safe_dump(service("web", annotations={"kube-router.io/service.dsr": "tunnel"}))
    )
    r = CliRunner().invoke(app, ["plan", "-f", str(tmp_path), "--node-ip", "192.0.2.10"])
    assert r.exit_code == 0
    warnings = [line for line in r.stderr.splitlines() if "kube-router" in line]
    assert len(warnings) == 1 and "default/web warning" in warnings[0]


# --- scheduler flags (mh as kube-proxy; kube-router's schedflags; ipvsctl's) ------------


@pytest.mark.parametrize(
    ("annotations", "default", "scheduler", "flags", "warned"),
    [
        ({}, "rr", "rr", None, False),
        ({}, "mh", "mh", ["flag-2"], False),  # kube-proxy: mh hashes the source port too
        ({"ipvsctl.io/scheduler": "mh"}, "rr", "mh", ["flag-2"], False),
        (
            {
                "kube-router.io/service.scheduler": "mh",
                "kube-router.io/service.schedflags": "flag-1,flag-2",
            },
            "rr",
            "mh",
            ["flag-1", "flag-2"],
            False,
        ),
        (
            {"ipvsctl.io/scheduler": "sh", "ipvsctl.io/scheduler-flags": "sh-fallback, sh-port"},
            "rr",
            "sh",
            ["flag-1", "flag-2"],
            False,
        ),
        (
            {"ipvsctl.io/scheduler": "mh", "ipvsctl.io/scheduler-flags": ""},
            "rr",
            "mh",
            None,
            False,
        ),  # explicitly none
        # ipvsctl's annotation wins over kube-router's
        (
            {"ipvsctl.io/scheduler-flags": "flag-3", "kube-router.io/service.schedflags": "flag-1"},
            "rr",
            "rr",
            ["flag-3"],
            False,
        ),
        # unknown flag: one warning, the scheduler's default
        (
            {"ipvsctl.io/scheduler": "mh", "ipvsctl.io/scheduler-flags": "flag-9"},
            "rr",
            "mh",
            ["flag-2"],
            True,
        ),
        ({"kube-router.io/service.schedflags": "fast"}, "rr", "rr", None, True),
    ],
)
def test_scheduler_flags(annotations, default, scheduler, flags, warned):
    node = NodeContext("node-a", ("192.0.2.10",), default)
    result, problems = plan_objects(
        {ObjectKind.SERVICE: [service("web", annotations=annotations)]}, node
    )
    v = plan_json(result)["virtual_servers"][0]
    assert v["scheduler"] == scheduler
    assert v.get("scheduler_flags") == flags
    assert len(problems) == (1 if warned else 0)


def test_adopted_virtual_server_gets_its_flags_corrected():
    """A virtual server found in the kernel with other flags is set, not left as found."""
    from ipvsctl.model import VirtualServer

    h = Harness(node=NodeContext("node-a", ("192.0.2.10",), "mh"))
    h.fake.add_virtual_server(VirtualServer(vs(), "mh", 0, 0x08), True)  # mh-fallback only
    h.ops()
    h.start([service("web")], [endpoint_slice("web", [endpoint(A)])])
    ops = h.ops()
    assert any(op.startswith("set-vs 10.96.0.10:80/TCP mh flag-2") for op in ops), ops
    assert "mh flag-2" in h.fake.dump()


# --- external IPs that are node addresses (kube-proxy's shouldBind) --------------------


@pytest.mark.parametrize(
    ("external", "bound"),
    [
        ("203.0.113.7", {"10.96.0.10", "203.0.113.7"}),  # a plain external IP: on the interface
        ("192.0.2.10", {"10.96.0.10"}),  # a node address: IPVS serves it, never re-bound
    ],
)
def test_external_ip_that_is_a_node_address_is_not_bound(external, bound):
    h = Harness(node=NodeContext("node-a", ("192.0.2.10",)))
    # at a port in the NodePort range: a node address at any other is no virtual server
    ports = [{"name": "http", "port": 30080, "protocol": "TCP", "targetPort": 8080}]
    svc = service("web", externalIPs=[external], ports=ports)
    h.start([svc], [endpoint_slice("web", [endpoint(A)])])
    assert f"{external}:30080/TCP" in h.fake.dump()
    assert set(h.fake.bound) == bound
    h.delete(service("web"))
    assert not h.fake.bound and h.fake.dump() == ""

"""Handing the node over to another proxy: the rule (pure: what a Service may still have,
which connections hold the handover, when it is due, what goes), and a real daemon
in-process on the fake kernel and nft: nothing new added once asked, what it holds put back
when removed, the last connection awaited (closing ones too), then everything it owned gone,
idle, ready, `status` saying so; only loopback may ask; `ipvsctl handover --wait`."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from devkit.builders import endpoint, endpoint_slice, service
from ipvsctl.cli.app import app
from ipvsctl.cli.handover import describe, wait_handed_over
from ipvsctl.cli.node_drain import Answer
from ipvsctl.daemon.options import (
    DaemonOptions,
    DrainOptions,
    HTTPOptions,
    NetfilterOptions,
    SourceOptions,
)
from ipvsctl.daemon.wiring import Daemon
from ipvsctl.httpd.request import Request
from ipvsctl.kernel.fake import FakeKernel
from ipvsctl.manifests import ManifestSource
from ipvsctl.model import (
    AppliedVirtualServer,
    ConnCounts,
    ConnScan,
    DesiredService,
    DesiredVirtualServer,
    NodeContext,
    Protocol,
    RealServerKey,
    RealServerStatus,
    ServiceKey,
    ServiceRef,
    VirtualServer,
    VirtualServerKind,
)
from ipvsctl.persist.action_token import read_token
from ipvsctl.plan.handover import (
    OpenConnections,
    Phase,
    due,
    held_of,
    narrow,
    open_connections,
    release_ops,
)
from ipvsctl.plan.ops import DeleteVirtualServer
from ipvsctl.reconcile.handover import Handover
from ipvsctl.reconcile.loop import LoopConfig
from tests.unit.test_daemon import get, wait_for, write
from tests.unit.test_netfilter_sync import FakeNft

REF = ServiceRef("default", "web")
VS = ServiceKey(Protocol.TCP, "10.96.0.10", 80)
VS2 = ServiceKey(Protocol.TCP, "10.96.0.10", 443)
RS1 = RealServerKey("10.244.1.5", 8080)
RS2 = RealServerKey("10.244.1.6", 8080)


def dvs(key: ServiceKey, *rs: RealServerKey) -> DesiredVirtualServer:
    return DesiredVirtualServer(
        VirtualServer(key), VirtualServerKind.CLUSTER_IP, "http", tuple(sorted(rs))
    )


def desired(*vss: DesiredVirtualServer, hc: int | None = None) -> DesiredService:
    return DesiredService(REF, {v.key: v for v in vss}, health_check_node_port=hc)


# --- the rule --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("case", "held", "want", "got"),
    [
        ("as held: the same object", {VS: frozenset({RS1})}, desired(dvs(VS, RS1)), None),
        (
            "a new real server is not added",
            {VS: frozenset({RS1})},
            desired(dvs(VS, RS1, RS2)),
            desired(dvs(VS, RS1)),
        ),
        (
            "a real server gone stays gone (its drain goes on)",
            {VS: frozenset({RS1, RS2})},
            desired(dvs(VS, RS2)),
            desired(dvs(VS, RS2)),
        ),
        (
            "a new virtual server is not added",
            {VS: frozenset({RS1})},
            desired(dvs(VS, RS1), dvs(VS2, RS1)),
            desired(dvs(VS, RS1)),
        ),
        (
            "a new Service asks for nothing, no health check port either",
            {},
            desired(dvs(VS, RS1), hc=32000),
            desired(),
        ),
    ],
)
def test_narrow_keeps_only_what_was_held(case, held, want, got):
    out = narrow(want, held)
    if got is None:
        assert out is want
    else:
        assert out == got, case


def test_held_of_is_every_applied_virtual_server_with_its_real_servers():
    applied = {
        REF: {VS: AppliedVirtualServer(VirtualServer(VS), True, {RS1: 1, RS2: 0})},
        ServiceRef("default", "gone"): {VS2: AppliedVirtualServer(VirtualServer(VS2), True)},
    }
    assert held_of(applied) == {VS: frozenset({RS1, RS2}), VS2: frozenset()}


def rs(key: RealServerKey, active: int, inactive: int = 0) -> RealServerStatus:
    return RealServerStatus(key, 1, active, inactive)


@pytest.mark.parametrize(
    ("case", "table", "scan", "want"),
    [
        ("nothing", {VS: []}, None, OpenConnections(0, 0)),
        ("a virtual server removed by another program: cannot tell", {VS: None}, None, None),
        ("established", {VS: [rs(RS1, 2), rs(RS2, 1)]}, None, OpenConnections(3, 0)),
        ("inactive, not read: cannot tell", {VS: [rs(RS1, 0, 1)]}, None, None),
        (
            "inactive, the table not read whole: cannot tell",
            {VS: [rs(RS1, 0, 1)]},
            ConnScan({}, unattributed=1),
            None,
        ),
        (
            "inactive and closing (a half-closed download)",
            {VS: [rs(RS1, 1, 2)]},
            ConnScan({(VS, RS1): ConnCounts(0, 1, 1)}),
            OpenConnections(1, 1),
        ),
        (
            "inactive and closed (TIME_WAIT) hold nothing",
            {VS: [rs(RS1, 0, 2)]},
            ConnScan({(VS, RS1): ConnCounts(0, 0, 2)}),
            OpenConnections(0, 0),
        ),
        (
            "another pair's connections are not ours",
            {VS: [rs(RS1, 0, 1)]},
            ConnScan({(VS, RS1): ConnCounts(0, 0, 1), (VS2, RS1): ConnCounts(0, 5, 0)}),
            OpenConnections(0, 0),
        ),
    ],
)
def test_open_connections(case, table, scan, want):
    assert open_connections(table, scan) == want, case


@pytest.mark.parametrize(
    ("phase", "asked", "read", "open_", "want"),
    [
        (Phase.HANDING_OVER, 10.0, 10.0, 0, True),
        (Phase.HANDING_OVER, 10.0, 11.0, 0, True),
        (Phase.HANDING_OVER, 10.0, 9.9, 0, False),  # read before it was asked
        (Phase.HANDING_OVER, 10.0, 11.0, 1, False),
        (Phase.HANDING_OVER, 10.0, 11.0, None, False),  # could not tell
        (Phase.HANDING_OVER, 10.0, None, None, False),
        (Phase.SERVING, None, 11.0, 0, False),
        (Phase.HANDED_OVER, 10.0, 11.0, 0, False),
    ],
)
def test_due(phase, asked, read, open_, want):
    assert due(phase, asked, read, open_) is want


def test_release_ops_delete_every_virtual_server_with_its_address_uncounted():
    applied = {
        REF: {
            VS: AppliedVirtualServer(VirtualServer(VS), True, {RS1: 1}),
            VS2: AppliedVirtualServer(VirtualServer(VS2), False, {RS1: 0}),
        },
        ServiceRef("default", "empty"): {},
    }
    assert release_ops(applied) == [
        (REF, [DeleteVirtualServer(VS, True, 0), DeleteVirtualServer(VS2, False, 0)])
    ]


# --- the command's wait -----------------------------------------------------------------------


def test_wait_asks_again_after_a_restart_and_ends_handed_over_or_at_the_timeout():
    asked: list[bool] = []
    answers = [
        Answer({"phase": "handing_over", "asked_for": 0, "established": 1, "closing": 0}),
        Answer(None, "daemon not reachable at x: refused"),  # restarting
        Answer({"phase": "serving"}),  # restarted: serves again
        Answer({"phase": "handing_over", "asked_for": 1, "established": 0, "closing": 1}),
        Answer({"phase": "handed_over"}),
    ]

    def fetch(ask: bool) -> Answer:
        asked.append(ask)
        return answers.pop(0)

    lines: list[str] = []
    code = wait_handed_over(fetch, timeout=60, interval=1, echo=lines.append, sleep=lambda s: None)
    assert code == 0 and lines[-1].startswith("handed over")
    # asked first, again after it answered nothing or serving, never while handing over
    assert asked == [True, False, True, True, False]
    t = [0.0]
    code = wait_handed_over(
        lambda ask: Answer({"phase": "handing_over", "established": 2, "closing": 0}),
        timeout=5,
        interval=1,
        echo=lines.append,
        clock=lambda: t[0],
        sleep=lambda s: t.__setitem__(0, t[0] + s),
    )
    assert code == 1 and lines[-1].startswith("ipvsctl: not handed over after 5s")
    assert "2 established, 0 closing" in describe(
        {"phase": "handing_over", "established": 2, "closing": 0}
    )


# --- a real daemon ---------------------------------------------------------------------------


class TrashKernel(FakeKernel):
    """The kernel's trash (`ip_vs_trash_get_dest`): a real server of a deleted virtual
    server, added back to the same virtual server, comes back with its connections."""

    def __init__(self) -> None:
        super().__init__()
        self.trash: dict[tuple[ServiceKey, RealServerKey], tuple[int, int]] = {}

    def delete_virtual_server(self, key: ServiceKey, bind_address: bool) -> None:
        svc = self.services.get(key)
        for rs, dest in (svc.dests if svc else {}).items():
            self.trash[(key, rs)] = (dest.active, dest.inactive)
        super().delete_virtual_server(key, bind_address)

    def add_real_server(self, key: ServiceKey, rs: RealServerKey, weight: int) -> None:
        super().add_real_server(key, rs, weight)
        if (key, rs) in self.trash:
            self.set_connections(key, rs, *self.trash.pop((key, rs)))


CLUSTER_IP = ServiceKey(Protocol.TCP, "10.96.0.10", 80)
POD = RealServerKey("10.244.1.5", 8080)
NEW_POD = RealServerKey("10.244.1.6", 8080)


def web(*ips: str) -> tuple[dict[str, Any], dict[str, Any]]:
    return (
        service("web", cluster_ip="10.96.0.10"),
        endpoint_slice("web", [endpoint(ip) for ip in ips]),
    )


@pytest.fixture
def daemon(tmp_path: Path) -> Any:
    folder = tmp_path / "m"
    folder.mkdir()
    write(folder, "web.yaml", *web("10.244.1.5"))
    kernel, nft = TrashKernel(), FakeNft()
    d = Daemon(
        DaemonOptions(
            node=NodeContext("node-a", ("192.0.2.10",)),
            source=SourceOptions(manifests=str(folder)),
            drain=DrainOptions(state_dir=str(tmp_path / "state")),
            http=HTTPOptions(listen="127.0.0.1:0"),
            netfilter=NetfilterOptions(cluster_cidrs=("10.244.0.0/16",)),
        ),
        kernel,
        ManifestSource(folder, interval=0.05),
        nft=nft,
        loop_config=LoopConfig(idle_wakeup=0.05, drain_check_interval=0.05, audit_interval=0.05),
    )
    d.start()
    try:
        wait_for(lambda: d.engine.started and "10.96.0.10 . tcp . 80" in nft.elements())
        yield d, folder, kernel, nft
    finally:
        d.shutdown()


def post(url: str) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(url, data=b"", method="POST")
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def state(d: Daemon) -> dict[str, Any]:
    code, text = get(f"http://127.0.0.1:{d.http.port}/v1/handover")
    assert code == 200, text
    return json.loads(text)


def test_the_daemon_hands_over_once_the_last_connection_ended(daemon: Any) -> None:
    d, folder, kernel, nft = daemon
    url = f"http://127.0.0.1:{d.http.port}"
    assert state(d)["phase"] == "serving"
    kernel.set_connections(CLUSTER_IP, POD, 1)  # a client mid-stream through ipvsctl

    result: list[Any] = []
    waiter = threading.Thread(
        target=lambda: result.append(
            CliRunner().invoke(app, ["handover", "--wait", "--timeout", "30", "--endpoint", url])
        )
    )
    waiter.start()
    wait_for(lambda: state(d)["phase"] == "handing_over")
    code, again = post(f"{url}/v1/handover")  # asked twice: the same handover
    assert code == 202 and again["phase"] == "handing_over"

    # Nothing new: a new Service and a new endpoint are heard, never programmed.
    write(folder, "web.yaml", *web("10.244.1.5", "10.244.1.6"))
    write(
        folder,
        "api.yaml",
        service("api", cluster_ip="10.96.0.20"),
        endpoint_slice("api", [endpoint("10.244.2.1")]),
    )
    api = ServiceRef("default", "api")
    wait_for(lambda: d.view.desired(api) is not None)
    wait_for(lambda: "10.244.1.6" in (d.view.desired(REF) or DesiredService(REF)).endpoints)
    assert set(kernel.services) == {CLUSTER_IP}
    assert kernel.weight(CLUSTER_IP, NEW_POD) is None
    assert "10.96.0.20 . tcp . 80" not in nft.elements()

    # What it holds is still put back when another program removes it (`ipvsadm -C`),
    # the connection with it; meanwhile the handover is not decided.
    kernel.delete_virtual_server(CLUSTER_IP, True)
    wait_for(lambda: kernel.weight(CLUSTER_IP, POD) == 1)
    assert kernel.weight(CLUSTER_IP, NEW_POD) is None
    assert state(d)["phase"] == "handing_over"

    wait_for(lambda: state(d)["established"] == 1)
    assert waiter.is_alive() and state(d)["phase"] == "handing_over"
    # the client half-closed, the server still sends: closing, still open
    kernel.set_connections(CLUSTER_IP, POD, 0, inactive=1)
    kernel.add_connection(CLUSTER_IP, POD, "FIN_WAIT")
    wait_for(lambda: state(d)["closing"] == 1 and state(d)["established"] == 0)
    assert state(d)["phase"] == "handing_over"
    assert kernel.services and nft.exists

    # Done: TIME_WAIT carries nothing.
    assert kernel.conn_lines is not None
    lines = kernel.conn_lines
    lines[:] = [line.replace("FIN_WAIT   ", "TIME_WAIT  ") for line in lines]
    waiter.join(30)
    assert result and result[0].exit_code == 0, result[0].output if result else "no result"
    assert "waiting: handing over" in result[0].output
    assert result[0].output.rstrip().endswith("is idle")
    assert kernel.services == {} and kernel.bound == {}
    wait_for(lambda: not nft.exists)
    assert state(d)["phase"] == "handed_over" and d.metrics.value("ipvsctl_handover_phase") == 2
    assert get(f"{url}/readyz")[0] == 200
    r = CliRunner().invoke(app, ["status", "--endpoint", url])
    assert "handover: handed over" in r.output, r.output
    assert json.loads(get(f"{url}/status")[1])["handover"] == "handed_over"

    # Idle until restarted: changes are not followed, nothing comes back.
    write(folder, "web.yaml", *web("10.244.1.7"))
    kernel.add_virtual_server(VirtualServer(ServiceKey(Protocol.TCP, "10.96.0.99", 80)), True)
    code, doc = post(f"{url}/v1/handover")
    assert code == 200 and doc["handed_over"]
    d.loop.step()
    assert set(kernel.services) == {ServiceKey(Protocol.TCP, "10.96.0.99", 80)}
    assert not nft.exists


def test_only_the_node_may_ask_and_look(daemon: Any, tmp_path: Path) -> None:
    """Loopback may ask; a node address only with the daemon's action token (a pod's
    connection may come masqueraded from one, and cannot read the node's state dir); a pod
    never, token or not."""
    d, _, kernel, _ = daemon
    handle = d.http._handle
    token = read_token(tmp_path / "state")
    assert token is not None and token == d.action_token
    assert (tmp_path / "state" / "action-token").stat().st_mode & 0o077 == 0
    for peer, headers in [
        ("10.244.3.7", {}),  # a pod
        ("10.244.3.7", {"x-ipvsctl-token": token}),  # a pod, even with the token
        ("192.0.2.10", {}),  # the node's own address without the token (masqueraded?)
        ("192.0.2.10", {"x-ipvsctl-token": "0" * 32}),  # a wrong token
    ]:
        resp = handle(Request("POST", "/v1/handover", {}, headers, peer))
        assert resp.code == 403, (peer, headers)
    assert handle(Request("GET", "/v1/handover", {}, {}, "10.244.3.7")).code == 403
    assert handle(Request("GET", "/v1/handover", {}, {}, "192.0.2.10")).code == 200
    assert d.part(Handover).phase is Phase.SERVING and kernel.services
    # POST anywhere else is refused before any handler: only GET and HEAD there
    from ipvsctl.httpd.request import Refusal, frame_request

    framed = frame_request(
        b"POST /status HTTP/1.1\r\nHost: x\r\n\r\n",
        "127.0.0.1",
        None,
        0.0,
        max_request_line=8192,
        max_head=16384,
        post=d.http.actions.keys(),
    )
    assert isinstance(framed, Refusal) and framed.reason == "method"
    resp = handle(Request("POST", "/v1/handover", {}, {"x-ipvsctl-token": token}, "192.0.2.10"))
    assert resp.code == 202  # the node's address with the token: `--listen $(HOST_IP):9796`
    code, doc = post(f"http://127.0.0.1:{d.http.port}/v1/handover")
    assert code == 202 and doc["phase"] == "handing_over"


def test_not_ready_is_not_handed_over(tmp_path: Path) -> None:
    """Before the first full sync there is nothing to hand over: asked again later."""
    kernel = FakeKernel()
    folder = tmp_path / "m"
    folder.mkdir()
    d = Daemon(
        DaemonOptions(
            node=NodeContext("node-a"),
            source=SourceOptions(manifests=str(folder)),
            drain=DrainOptions(state_dir=str(tmp_path / "state")),
            http=HTTPOptions(listen="127.0.0.1:0"),
        ),
        kernel,
        ManifestSource(folder, interval=0.05),
    )
    h = d.part(Handover)
    assert h is not None
    code, s = h.ask()
    assert code == 503 and s.phase is Phase.SERVING


def test_the_command_shows_the_token_of_the_daemons_state_dir(daemon: Any, tmp_path: Path) -> None:
    """As from a node address (the daemon listening on it alone): only with the token."""
    d, _, _, _ = daemon
    d.http.action_allowed = lambda req: req.headers.get("x-ipvsctl-token") == d.action_token
    url = f"http://127.0.0.1:{d.http.port}"
    r = CliRunner().invoke(app, ["handover", "--endpoint", url, "--state-dir", str(tmp_path)])
    assert r.exit_code == 1 and "only from its node" in r.output, r.output
    assert d.part(Handover).phase is Phase.SERVING
    state_dir = str(tmp_path / "state")
    r = CliRunner().invoke(
        app, ["handover", "--state-dir", state_dir], env={"IPVSCTL_ENDPOINT": url}
    )
    assert r.exit_code == 0 and r.output.startswith("handing over"), r.output

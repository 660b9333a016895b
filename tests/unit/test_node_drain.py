"""Node drain: the Node's taints and conditions as read (pure), the quiesced rule
(pure), the running part on a fake kernel (which virtual servers count, when a reading
decides), a real daemon in-process (health 503, /v1/node-quiesced, node-local), and
`ipvsctl node-drain --wait` against it."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from devkit.builders import endpoint, endpoint_slice, service
from ipvsctl.cli.app import app
from ipvsctl.cli.node_drain import Answer, describe, wait_quiesced
from ipvsctl.daemon.options import (
    DaemonOptions,
    DrainOptions,
    HTTPOptions,
    NodeDrainOptions,
    SourceOptions,
)
from ipvsctl.daemon.wiring import Daemon
from ipvsctl.healthcheck.proxy_server import ProxyHealthServer
from ipvsctl.kernel.fake import FakeKernel
from ipvsctl.kernel.port import KernelTransient
from ipvsctl.manifests import ManifestSource
from ipvsctl.model import (
    DesiredService,
    DesiredVirtualServer,
    NodeContext,
    Protocol,
    RealServerKey,
    ServiceKey,
    ServiceRef,
    VirtualServer,
    VirtualServerKind,
)
from ipvsctl.obs.metrics import Metrics
from ipvsctl.plan.node_drain import node_drain_state
from ipvsctl.reconcile.clock import ManualClock
from ipvsctl.reconcile.loop import LoopConfig
from ipvsctl.reconcile.node_drain import NodeDrain
from ipvsctl.source.node import DEFAULT_DRAINING_TAINTS, NodeInfo, leaving_reasons, parse_node
from tests.unit.test_daemon import get, wait_for, write

# --- the Node as read ---------------------------------------------------------------------


def node_obj(
    taints: Any = None, conditions: Any = None, deleting: bool = False, name: str = "node-a"
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-26T00:00:00Z"
    obj: dict[str, Any] = {"apiVersion": "v1", "kind": "Node", "metadata": meta}
    if taints is not None:
        obj["spec"] = {"taints": taints}
    if conditions is not None:
        obj["status"] = {"conditions": conditions}
    return obj


def taint(key: Any, effect: str = "NoSchedule") -> dict[str, Any]:
    return {"key": key, "effect": effect}


def cond(status: Any, type_: str = "NetworkUnavailable") -> dict[str, Any]:
    return {"type": type_, "status": status, "reason": "x", "lastHeartbeatTime": "t"}


@pytest.mark.parametrize(
    ("case", "obj", "taints", "network_unavailable", "deleting", "warnings"),
    [
        ("bare", node_obj(), set(), False, False, 0),
        (
            "taints of every effect, keys only",
            node_obj(
                [
                    taint("ToBeDeletedByClusterAutoscaler"),
                    taint("karpenter.sh/disrupted", "NoExecute"),
                    taint("x", "PreferNoSchedule"),
                ]
            ),
            {"ToBeDeletedByClusterAutoscaler", "karpenter.sh/disrupted", "x"},
            False,
            False,
            0,
        ),
        ("taints not a list", node_obj("ToBeDeletedByClusterAutoscaler"), set(), False, False, 1),
        (
            "a taint without a key, one not an object",
            node_obj([{"effect": "NoSchedule"}, "k", taint(7), taint("ok")]),
            {"ok"},
            False,
            False,
            1,
        ),
        ("network unavailable", node_obj(conditions=[cond("True")]), set(), True, False, 0),
        ("network available", node_obj(conditions=[cond("False")]), set(), False, False, 0),
        ("network unknown", node_obj(conditions=[cond("Unknown")]), set(), False, False, 0),
        ("network status garbage", node_obj(conditions=[cond(True)]), set(), False, False, 1),
        (
            "other conditions do not count",
            node_obj(conditions=[cond("True", "MemoryPressure"), cond("False", "Ready")]),
            set(),
            False,
            False,
            0,
        ),
        ("conditions not a list", node_obj(conditions={"x": 1}), set(), False, False, 1),
        ("being deleted", node_obj(deleting=True), set(), False, True, 0),
    ],
)
def test_parse_node_taints_and_conditions(
    case: str,
    obj: dict[str, Any],
    taints: set[str],
    network_unavailable: bool,
    deleting: bool,
    warnings: int,
) -> None:
    parsed = parse_node(obj)
    assert parsed.value.taints == taints
    assert parsed.value.network_unavailable is network_unavailable
    assert parsed.value.deleting is deleting
    assert len(parsed.warnings) == warnings, parsed.warnings


def test_parse_node_reads_a_bounded_number_of_taints() -> None:
    parsed = parse_node(node_obj([taint(f"k{i}") for i in range(10_000)]))
    assert len(parsed.value.taints) == 256 and len(parsed.warnings) == 1


@pytest.mark.parametrize(
    ("case", "node", "draining", "reasons"),
    [
        ("never seen: eligible", None, DEFAULT_DRAINING_TAINTS, ()),
        ("healthy", NodeInfo("n"), DEFAULT_DRAINING_TAINTS, ()),
        ("deleted", NodeInfo("n", present=False), DEFAULT_DRAINING_TAINTS, ("deleted",)),
        ("deleting", NodeInfo("n", deleting=True), DEFAULT_DRAINING_TAINTS, ("deleting",)),
        (
            "the autoscaler's taint",
            NodeInfo("n", taints=frozenset({"ToBeDeletedByClusterAutoscaler"})),
            DEFAULT_DRAINING_TAINTS,
            ("taint:ToBeDeletedByClusterAutoscaler",),
        ),
        (
            "Karpenter's taint",
            NodeInfo("n", taints=frozenset({"karpenter.sh/disrupted", "other"})),
            DEFAULT_DRAINING_TAINTS,
            ("taint:karpenter.sh/disrupted",),
        ),
        (
            "a taint not in --draining-taints",
            NodeInfo("n", taints=frozenset({"node.kubernetes.io/unschedulable"})),
            DEFAULT_DRAINING_TAINTS,
            (),
        ),
        (
            "--draining-taints of the user's own",
            NodeInfo("n", taints=frozenset({"example.com/retire", "karpenter.sh/disrupted"})),
            ("example.com/retire",),
            ("taint:example.com/retire",),
        ),
        ("--draining-taints empty", NodeInfo("n", taints=frozenset({"x"})), (), ()),
        (
            "network unavailable",
            NodeInfo("n", network_unavailable=True),
            DEFAULT_DRAINING_TAINTS,
            ("network-unavailable",),
        ),
        (
            "all at once, in order",
            NodeInfo(
                "n",
                deleting=True,
                taints=frozenset({"karpenter.sh/disrupted", "ToBeDeletedByClusterAutoscaler"}),
                network_unavailable=True,
            ),
            DEFAULT_DRAINING_TAINTS,
            (
                "deleting",
                "taint:ToBeDeletedByClusterAutoscaler",
                "taint:karpenter.sh/disrupted",
                "network-unavailable",
            ),
        ),
    ],
)
def test_leaving_reasons(
    case: str, node: NodeInfo | None, draining: tuple[str, ...], reasons: tuple[str, ...]
) -> None:
    assert leaving_reasons(node, draining) == reasons


# --- the quiesced rule ----------------------------------------------------------------------

R = ("taint:ToBeDeletedByClusterAutoscaler",)


@pytest.mark.parametrize(
    ("case", "reasons", "since", "now", "established", "read_at", "quiesced"),
    [
        ("not draining", (), None, 100.0, 0, 99.0, False),
        ("within the grace", R, 80.0, 100.0, 0, 99.0, False),
        ("grace over, no reading since", R, 50.0, 100.0, 0, 79.0, False),
        ("grace over, read after it, none", R, 50.0, 100.0, 0, 80.0, True),
        ("grace over, read after it, some", R, 50.0, 100.0, 3, 99.0, False),
        ("grace over, never read", R, 50.0, 100.0, None, None, False),
    ],
)
def test_quiesced_rule(
    case: str,
    reasons: tuple[str, ...],
    since: float | None,
    now: float,
    established: int | None,
    read_at: float | None,
    quiesced: bool,
) -> None:
    s = node_drain_state(reasons, since, now, 30.0, established, read_at)
    assert s.quiesced is quiesced
    doc = s.to_json()
    assert doc["quiesced"] is quiesced and doc["draining"] is bool(reasons)
    assert doc["unhealthy_for"] == (now - since if reasons and since is not None else 0)


# --- the running part on a fake kernel ------------------------------------------------------

NODE_IP = "192.0.2.10"
CLUSTER = ServiceKey(Protocol.TCP, "10.96.0.10", 80)
NODE_PORT = ServiceKey(Protocol.TCP, NODE_IP, 30080)
EXTERNAL = ServiceKey(Protocol.TCP, "203.0.113.10", 80)
LB = ServiceKey(Protocol.TCP, "198.51.100.10", 80)
POD = RealServerKey("10.244.1.5", 8080)
REF = ServiceRef("default", "web")
KINDS = {
    CLUSTER: VirtualServerKind.CLUSTER_IP,
    NODE_PORT: VirtualServerKind.NODE_PORT,
    EXTERNAL: VirtualServerKind.EXTERNAL_IP,
    LB: VirtualServerKind.LOAD_BALANCER,
}


def desired(*keys: ServiceKey) -> DesiredService:
    return DesiredService(
        REF, {k: DesiredVirtualServer(VirtualServer(k), KINDS[k], "http") for k in keys}
    )


class World:
    def __init__(self, lb_grace: float = 30.0) -> None:
        self.kernel = FakeKernel()
        self.clock = ManualClock()
        self.metrics = Metrics()
        self.cpu = [0.0]
        self.drain = NodeDrain(
            self.kernel,
            self.metrics,
            self.clock,
            draining_taints=DEFAULT_DRAINING_TAINTS,
            lb_grace=lb_grace,
            interval=1.0,
            idle_interval=10.0,
            cpu_clock=lambda: self.cpu[0],
        )
        for key in KINDS:
            self.kernel.add_virtual_server(VirtualServer(key), bind_address=False)
            self.kernel.add_real_server(key, POD, 1)
        self.drain.on_service(REF, None, desired(*KINDS))

    def conns(self, key: ServiceKey, active: int, inactive: int = 0) -> None:
        self.kernel.set_connections(key, POD, active, inactive)

    def step(self) -> bool:
        plan = self.drain.snapshot()
        if plan is None:
            return False
        self.drain.apply(self.drain.read(plan))
        return True

    def taint(self) -> None:
        self.drain.on_node(
            NodeInfo("node-a", taints=frozenset({"karpenter.sh/disrupted"})),
            self.clock.monotonic(),
        )


def test_counts_only_what_comes_in_from_outside_established_only() -> None:
    w = World()
    w.conns(CLUSTER, 50)  # pods' connections: their own drains' business
    w.conns(NODE_PORT, 1, inactive=7)  # TIME_WAIT and friends are not established
    w.conns(EXTERNAL, 2)
    w.conns(LB, 4)
    assert w.step()
    assert w.drain.established == 7
    assert w.metrics.value("ipvsctl_node_established_connections") == 7


def test_paced_idle_then_at_the_drain_pace_once_draining() -> None:
    w = World(lb_grace=5.0)
    assert w.step()
    reads = w.kernel.table_reads
    w.clock.advance(5.0)
    assert not w.step()  # idle: every 10 s
    w.taint()
    assert w.step()  # draining: at once
    w.clock.advance(1.0)
    assert w.step()  # and every second
    assert w.kernel.table_reads == reads + 2


def test_pace_follows_the_reads_cpu_time_not_its_wall_time() -> None:
    """On a busy node a small table's read waits for the CPU: that wait must not push the
    next reading out (the lab's guest took 20 s to see a closed connection); a read that
    costs much CPU is spaced 9x its cost."""
    w = World(lb_grace=0.0)
    w.taint()
    read = w.kernel.read_real_servers

    wall, cpu = 0.0, 0.0

    def slow(*a: Any, **kw: Any) -> Any:
        w.clock.advance(wall)
        w.cpu[0] += cpu
        return read(*a, **kw)

    w.kernel.read_real_servers = slow  # type: ignore[method-assign]
    wall, cpu = 3.0, 0.01  # waited 3 s, worked 10 ms
    assert w.step()
    w.clock.advance(1.0)
    wall, cpu = 1.0, 1.0  # then a huge table: a second of work
    assert w.step()  # at the drain pace, 1 s after (by wall time: 27 s after)
    w.clock.advance(8.0)
    assert not w.step()  # within 9x its cost after it ended
    w.clock.advance(1.5)
    assert w.step()


def test_quiesced_only_after_the_grace_and_a_reading_after_it() -> None:
    w = World(lb_grace=5.0)
    w.conns(LB, 1)
    w.taint()
    assert w.drain.state().draining and w.metrics.value("ipvsctl_node_draining") == 1
    w.step()
    assert (w.drain.state().established, w.drain.state().quiesced) == (1, False)
    w.conns(LB, 0)
    w.clock.advance(1.0)
    w.step()
    assert w.drain.state().established == 0
    assert not w.drain.state().quiesced  # the load balancer may still send some
    w.clock.advance(3.0)
    w.step()
    assert not w.drain.state().quiesced  # read 4 s in: still within the grace
    w.clock.advance(1.0)
    assert w.step()  # due at the grace's end
    assert w.drain.state().quiesced
    assert w.metrics.value("ipvsctl_node_draining_seconds") == 5.0
    # the taint goes away (the autoscaler changed its mind): healthy again, not draining
    w.drain.on_node(NodeInfo("node-a"), w.clock.monotonic())
    assert not w.drain.state().draining and not w.drain.state().quiesced


def test_a_virtual_server_that_left_the_wanted_set_counts_while_the_kernel_has_it() -> None:
    w = World(lb_grace=0.0)
    w.taint()
    w.conns(EXTERNAL, 2)
    w.drain.on_service(REF, desired(*KINDS), desired(CLUSTER, NODE_PORT, LB))
    assert w.step()
    assert w.drain.established == 2  # draining: still established through us
    w.kernel.delete_virtual_server(EXTERNAL, bind_address=False)
    w.clock.advance(1.0)
    assert w.step()
    assert EXTERNAL not in w.drain.keys and w.drain.state().quiesced
    # a Service claiming it again counts it again
    w.drain.on_service(REF, desired(CLUSTER, NODE_PORT, LB), desired(*KINDS))
    assert w.drain.keys[EXTERNAL] == 1


def test_a_table_that_cannot_be_read_never_answers_quiesced() -> None:
    w = World(lb_grace=0.0)
    w.taint()

    def broken(*a: Any, **kw: Any) -> Any:
        raise KernelTransient("no", "read_ip_vs")

    w.kernel.read_real_servers = broken  # type: ignore[method-assign]
    w.clock.advance(1.0)
    assert w.step()
    assert w.drain.state().established is None and not w.drain.state().quiesced
    assert w.metrics.value("ipvsctl_netlink_errors_total", {"operation": "read_ip_vs"}) == 1


# --- the CLI's wait ------------------------------------------------------------------------


def test_wait_prints_progress_and_ends_at_quiesced_or_the_timeout() -> None:
    t = [0.0]
    answers = iter(
        [
            Answer(None, "daemon not reachable at x: refused"),
            Answer({"draining": False, "quiesced": False, "established": 3}),
            Answer({"draining": True, "quiesced": False, "established": 3, "reasons": ["d"]}),
            Answer({"draining": True, "quiesced": True, "established": 0, "reasons": ["d"]}),
        ]
    )
    lines: list[str] = []

    def sleep(s: float) -> None:
        t[0] += s

    code = wait_quiesced(
        lambda: next(answers),
        timeout=60,
        interval=1,
        echo=lines.append,
        clock=lambda: t[0],
        sleep=sleep,
    )
    assert code == 0
    assert [line.split(":")[0].split(" (")[0] for line in lines] == [
        "waiting",
        "waiting",
        "waiting",
        "draining",
    ]
    assert lines[-1].endswith("quiesced") and "not" not in lines[-1]

    t[0] = 0.0
    lines.clear()
    stuck = {"draining": True, "quiesced": False, "established": 1, "reasons": ["d"]}
    code = wait_quiesced(
        lambda: Answer(stuck),
        timeout=30,
        interval=1,
        echo=lines.append,
        clock=lambda: t[0],
        sleep=sleep,
    )
    assert code == 1 and t[0] == 30
    assert lines[-1].startswith("ipvsctl: not quiesced after 30s")
    assert 3 <= len(lines) <= 5  # a line per 10 s unchanged, not one per poll
    assert describe(stuck).startswith("draining (d)")


def test_wait_if_draining_returns_at_once_for_a_node_not_draining() -> None:
    lines: list[str] = []
    healthy = {"draining": False, "quiesced": False, "established": 4}
    kw: dict[str, Any] = {"timeout": 60, "interval": 1, "echo": lines.append}
    assert wait_quiesced(lambda: Answer(healthy), if_draining=True, sleep=lambda s: None, **kw) == 0
    assert lines == ["not draining (health 200); established 4"]
    # without it, a node not draining yet is waited for (its taint may be on its way)
    t = [0.0]

    def sleep(s: float) -> None:
        t[0] += s

    assert wait_quiesced(lambda: Answer(healthy), clock=lambda: t[0], sleep=sleep, **kw) == 1


def test_wait_stops_at_an_error_waiting_cannot_mend() -> None:
    lines: list[str] = []
    code = wait_quiesced(
        lambda: Answer(None, "answers only its own node's clients (403)", final=True),
        timeout=60,
        interval=1,
        echo=lines.append,
        sleep=lambda s: None,
    )
    assert code == 1 and lines == ["ipvsctl: answers only its own node's clients (403)"]


# --- a real daemon ---------------------------------------------------------------------------


def nodeport_service() -> dict[str, Any]:
    return service(
        "web",
        type="NodePort",
        ports=[
            {"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080, "nodePort": 30080}
        ],
    )


@pytest.fixture
def daemon(tmp_path: Path) -> Any:
    folder = tmp_path / "m"
    folder.mkdir()
    write(folder, "web.yaml", nodeport_service(), endpoint_slice("web", [endpoint("10.244.1.5")]))
    write(folder, "node.yaml", node_obj())
    kernel = FakeKernel()
    d = Daemon(
        DaemonOptions(
            node=NodeContext("node-a", (NODE_IP,)),
            source=SourceOptions(manifests=str(folder)),
            drain=DrainOptions(state_dir=str(tmp_path / "state")),
            http=HTTPOptions(listen="127.0.0.1:0", healthz_bind_address="127.0.0.1:0"),
            node_drain=NodeDrainOptions(
                lb_grace=0.5, draining_taints=("example.com/retire", "karpenter.sh/disrupted")
            ),
        ),
        kernel,
        ManifestSource(folder, interval=0.05),
        loop_config=LoopConfig(idle_wakeup=0.05, drain_check_interval=0.05),
    )
    assert d.part(ProxyHealthServer) is not None
    d.part(ProxyHealthServer).retry_interval = 0.05
    d.start()
    try:
        wait_for(lambda: d.engine.started and d.part(ProxyHealthServer).port)
        yield d, folder, kernel
    finally:
        d.shutdown()


def node_state(d: Daemon) -> dict[str, Any]:
    code, text = get(f"http://127.0.0.1:{d.http.port}/v1/node-quiesced")
    assert code == 200, text
    return json.loads(text)


def health(d: Daemon) -> int:
    assert d.part(ProxyHealthServer) is not None
    return get(f"http://127.0.0.1:{d.part(ProxyHealthServer).port}/healthz")[0]


def test_daemon_drains_the_node_for_its_taint_and_the_hook_waits(daemon: Any) -> None:
    d, folder, kernel = daemon
    assert health(d) == 200
    assert node_state(d) | {"established": 0} == {
        "draining": False,
        "quiesced": False,
        "established": 0,
        "unhealthy_for": 0,
        "lb_grace": 0.5,
        "reasons": [],
    }
    kernel.set_connections(NODE_PORT, POD, 1)
    write(folder, "node.yaml", node_obj([taint("example.com/retire", "NoExecute")]))
    wait_for(lambda: health(d) == 503)
    wait_for(lambda: node_state(d)["established"] == 1)
    state = node_state(d)
    assert state["draining"] and not state["quiesced"]
    assert state["reasons"] == ["taint:example.com/retire"]
    assert d.metrics.value("ipvsctl_node_draining") == 1

    result: list[Any] = []
    url = f"http://127.0.0.1:{d.http.port}"
    waiter = threading.Thread(
        target=lambda: result.append(
            CliRunner().invoke(app, ["node-drain", "--wait", "--timeout", "20", "--endpoint", url])
        )
    )
    waiter.start()
    wait_for(lambda: node_state(d)["unhealthy_for"] >= 0.6)
    assert waiter.is_alive()  # one connection still established: not quiesced
    kernel.set_connections(NODE_PORT, POD, 0, inactive=1)  # it closed (TIME_WAIT)
    waiter.join(20)
    assert result and result[0].exit_code == 0, result[0].output if result else "no result"
    assert "waiting: draining (taint:example.com/retire)" in result[0].output
    assert result[0].output.rstrip().endswith("quiesced")

    r = CliRunner().invoke(app, ["node-drain", "--endpoint", url])
    assert r.exit_code == 0 and r.output.startswith("draining (taint:example.com/retire)")
    # network unavailable drains as well; the cluster autoscaler's taint is not ours here
    write(folder, "node.yaml", node_obj([taint("ToBeDeletedByClusterAutoscaler")]))
    wait_for(lambda: health(d) == 200)
    assert not node_state(d)["draining"]
    write(folder, "node.yaml", node_obj(conditions=[cond("True")]))
    wait_for(lambda: health(d) == 503)
    assert node_state(d)["reasons"] == ["network-unavailable"]


def test_node_quiesced_answers_only_the_node(daemon: Any) -> None:
    d, _, _ = daemon
    assert "/v1/node-quiesced" in d.http.local_only
    assert not d.is_local_peer("10.244.1.7")


def test_node_drain_command_errors() -> None:
    r = CliRunner().invoke(app, ["node-drain", "--endpoint", "ftp://127.0.0.1:9796"])
    assert r.exit_code == 2 and "--endpoint" in r.output
    r = CliRunner().invoke(app, ["node-drain", "--endpoint", "127.0.0.1:1"])  # HOST:PORT
    assert r.exit_code == 1 and "not reachable at http://127.0.0.1:1" in r.output
    r = CliRunner().invoke(app, ["node-drain", "--timeout", "soon"])
    assert r.exit_code == 2
    r = CliRunner().invoke(app, ["node-drain", "--endpoint", "http://127.0.0.1:1"])
    assert r.exit_code == 1 and "not reachable" in r.output

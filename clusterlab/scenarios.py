"""The scenarios. Each runs under its load (started `warmup` s before the move, stopped
`cooldown` s after its effects are over: every deleted pod gone), in the lab's current
mode, and gives one result: the summary (report.summarise), the failures with their times,
and what the scenario noted on the way (pods' lives, the load balancer's health changes,
the daemons' drain log lines, scenario-specific times).

- `rollout`: a rolling update of the 3-replica `web` Deployment (one pod per node).
- `slow-node`: one pod deleted while one node's daemon is held back (SIGSTOP): the pod's
  preStop must not return before that node caught up (SIGCONT) and stopped sending.
- `upgrade`: ipvsctl's own DaemonSet upgrade, node by node (SIGTERM, a new process on the
  same state dir); on the second node a pod is being deleted and the daemon is SIGKILLed
  mid-drain.
- `node-drain`: a node tainted for removal behind the load balancer: its health says 503,
  the load balancer takes it out, its pods are evicted, `ipvsctl node-drain --wait` (with
  ipvsctl) says when it is quiesced, and the machine goes (daemon killed, link down).
- `service-delete`: the `web` Service deleted and created again 4 s later.
- `topology`: `trafficDistribution: PreferClose` set on the live Service (every node keeps
  its own zone's pod only) and removed again.
- `scale-zero`: `web` scaled to 0 and back to 3.
- `udp-rollout`: a rolling update of a DNS-like UDP Deployment under UDP queries.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from clusterlab import kube, report
from clusterlab.cluster import WEB, Lab, wait_until
from clusterlab.control import Deployment, LivePod
from clusterlab.daemons import node_drain_wait
from clusterlab.load import Load
from devkit.labkit import sh

DRAIN_LOG = ("drain started", "real server deleted", "drain deadline from pod")


@dataclass
class Run:
    lab: Lab
    scenario: str
    mode: str
    t0: float
    load: Load
    expected: list[report.Window] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)

    def note(self, key: str, value: Any = None) -> None:
        self.notes[key] = self.lab.clock() - self.t0 if value is None else value

    def rel(self, t: float | None) -> float | None:
        return None if t is None else round(t - self.t0, 3)


@dataclass(frozen=True)
class Scenario:
    name: str
    what: str
    act: Callable[[Run], None]
    load: Callable[[Lab], Load] = lambda lab: lab.web_load()
    prepare: Callable[[Lab], None] = lambda lab: None
    restore: Callable[[Lab], None] = lambda lab: None


def next_version(dep: Deployment) -> str:
    return f"v{int(dep.version.removeprefix('v')) + 1}"


def web_vs() -> str:
    port = WEB.ports[0]
    return f"{WEB.cluster_ip}:{port.port}/{port.protocol}"


# --- the moves -----------------------------------------------------------------------------
def rollout(run: Run) -> None:
    cp = run.lab.cp
    cp.rollout(run.lab.web, next_version(run.lab.web))
    run.note("rollout_done")
    cp.wait_settled()


def slow_node(run: Run, hold: float = 10.0) -> None:
    """Node 3's daemon stopped; a pod of node 1 replaced (surge, then deleted); the daemon
    continued `hold` s after the deletion."""
    lab, cp = run.lab, run.lab.cp
    slow_node, victim_node = lab.net.nodes[-1], lab.net.nodes[0]
    slow = lab.daemon(slow_node.name)
    victim = next(p for p in cp.live(lab.web) if p.node is victim_node)
    new = cp.start_pod(lab.web, victim_node)
    cp.wait_ready(new)
    wait_until(
        lambda: lab.weights(slow_node, web_vs()).get(new.ip) == 1, 120, "the new pod on node 3"
    )
    slow.send(signal.SIGSTOP)
    run.note("daemon_stopped")
    cp.delete_pod(victim)
    run.note("pod_deleted")
    run.notes["victim"] = {"pod": victim.name, "ip": victim.ip, "node": victim_node.name}
    run.notes["slow_node"] = slow_node.name
    samples = sample_barrier(run, victim)
    time.sleep(max(0.0, hold - (run.lab.clock() - run.t0 - run.notes["pod_deleted"])))
    run.note("preStop_returned_before_continue", victim.record.prestop_end is not None)
    slow.send(signal.SIGCONT)
    run.note("daemon_continued")
    cp.wait_settled()
    samples.join(30)


def sample_barrier(run: Run, pod: LivePod) -> threading.Thread:
    """The victim's sidecar /status every 0.5 s while its preStop runs: which daemons the
    barrier still waits for, and why (kept where it changes)."""
    seen: list[dict[str, Any]] = []
    run.notes["barrier"] = seen

    def sample() -> None:
        last = None
        while pod.record.prestop_end is None and pod.record.sigterm is None:
            status = run.lab.cp.sidecar_status(pod)
            if status and status.get("state") == "running":
                waiting = status["daemons"]["not_quiesced"]
                key = (status["stage"], tuple(sorted(waiting.items())))
                if key != last:
                    last = key
                    seen.append(
                        {
                            "t": run.rel(run.lab.clock()),
                            "stage": status["stage"],
                            "not_quiesced": waiting,
                            "established": status["connections"]["established"],
                        }
                    )
            time.sleep(0.5)

    thread = threading.Thread(target=sample, daemon=True, name="barrier-sampler")
    thread.start()
    return thread


def upgrade(run: Run) -> None:
    """Each node's daemon replaced in turn (as the DaemonSet's rolling update with
    maxUnavailable 1 does: the next once this one is ready); node 2's is SIGKILLed while it
    drains a pod being deleted."""
    lab, cp = run.lab, run.lab.cp
    steps = []
    for i, node in enumerate(lab.net.nodes):
        d = lab.daemon(node.name)
        step: dict[str, Any] = {"node": node.name}
        if i == 1:
            victim = next(p for p in cp.live(lab.web) if p.node is not node)
            new = cp.start_pod(lab.web, victim.node)
            cp.wait_ready(new)
            cp.delete_pod(victim)
            step["victim"] = {"pod": victim.name, "ip": victim.ip}
            step["pod_deleted"] = run.rel(lab.clock())
            wait_until(
                lambda v=victim, n=node: not lab.weights(n, web_vs()).get(v.ip),  # type: ignore[misc]
                120,
                "node 2 draining the deleted pod",
                interval=0.2,
            )
            step["draining"] = run.rel(lab.clock())
            step["signal"] = "SIGKILL"
            d.stop(signal.SIGKILL)
        else:
            step["signal"] = "SIGTERM"
            d.stop(signal.SIGTERM)
        step["stopped"] = run.rel(lab.clock())
        d.start()
        d.wait_ready()
        step["ready"] = run.rel(lab.clock())
        steps.append(step)
    run.notes["steps"] = steps
    cp.wait_settled()


def node_drain(run: Run) -> None:
    lab, cp = run.lab, run.lab.cp
    node = lab.net.nodes[1]
    cp.taint(node.name, "ToBeDeletedByClusterAutoscaler")
    run.note("tainted")
    wait_until(lambda: not lab.balancer.is_healthy(node.name), 120, "the LB to take the node out")
    run.note("lb_out")
    run.load.stop_client(node.name)  # its client pod is evicted too
    evicted = cp.evict(node.name)
    run.note("evicted")
    for pod in evicted:  # the autoscaler waits for its pods to terminate
        pod.exited.wait(pod.dep.grace + 60)
    run.note("pods_gone")
    if run.mode == "ipvsctl":
        drain = node_drain_wait(node, lab.clock, timeout=240)
        run.notes["node_drain"] = {
            "returncode": drain.returncode,
            "started": run.rel(drain.started),
            "ended": run.rel(drain.ended),
            "lines": [(run.rel(t), line) for t, line in drain.lines],
        }
    lab.daemon(node.name).stop(signal.SIGKILL)
    sh("ip", "link", "set", f"cln{node.index}", "down")
    run.note("machine_gone")
    time.sleep(5.0)  # the load goes on without the node
    cp.wait_settled()


def restore_node(lab: Lab) -> None:
    """After node-drain (not measured): the machine comes back as a new one: an empty table,
    no state, link up, taint removed, its daemon started; then one pod per node again."""
    node = lab.net.nodes[1]
    d = lab.daemon(node.name)
    sh("ipvsadm", "-C", netns=node.netns)
    sh("nft", "delete", "table", "inet", "ipvsctl", netns=node.netns, check=False)
    sh("ip", "-n", node.netns, "link", "del", "kube-ipvs0", check=False)
    for f in d.state_dir.iterdir():
        f.unlink()
    sh("ip", "link", "set", f"cln{node.index}", "up")
    lab.cp.untaint(node.name)
    d.start()
    d.wait_ready()
    wait_until(lambda: lab.balancer.is_healthy(node.name), 120, "the node healthy again")
    rebalance(lab, lab.web)


def rebalance(lab: Lab, dep: Deployment) -> None:
    """One pod per node again (not measured): a pod on each empty node, then the extra ones
    on crowded nodes deleted."""
    cp = lab.cp
    while True:
        by_node: dict[str, list[LivePod]] = {n.name: [] for n in lab.net.nodes}
        for p in cp.live(dep):
            by_node[p.node.name].append(p)
        empty = [n for n in lab.net.nodes if not by_node[n.name] and cp.schedulable(n.name)]
        crowded = [ps for ps in by_node.values() if len(ps) > 1]
        if not empty or not crowded:
            break
        new = cp.start_pod(dep, empty[0])
        cp.wait_ready(new)
        cp.delete_pod(crowded[0][-1])
    cp.wait_settled()
    wait_until(lambda: lab.programmed(WEB), 300, "web programmed again")


def service_delete(run: Run, gone_for: float = 4.0) -> None:
    lab, cp = run.lab, run.lab.cp
    spec = cp.delete_service(WEB.name)
    deleted = lab.clock()
    run.note("deleted")
    time.sleep(gone_for)
    cp.create_service(spec)
    run.note("created")
    wait_until(lambda: lab.programmed(WEB), 120, "web back on every node", interval=0.2)
    run.note("programmed")
    run.expected.append((deleted, lab.clock()))
    time.sleep(8.0)  # streams opened before the deletion run to their end


def topology(run: Run, hold: float = 10.0) -> None:
    lab, cp = run.lab, run.lab.cp
    cp.update_service(dataclasses.replace(WEB, traffic_distribution=kube.PREFER_CLOSE))
    run.note("hints_set")

    def local_only() -> bool:
        for node in lab.net.nodes:
            local = {p.ip for p in cp.live(lab.web) if p.node is node}
            up = {ip for ip, w in lab.weights(node, web_vs()).items() if w > 0}
            if up != local:
                return False
        return True

    wait_until(local_only, 120, "every node on its own zone's pod", interval=0.2)
    run.note("hints_applied")
    time.sleep(hold)
    cp.update_service(WEB)
    run.note("hints_removed")
    wait_until(lambda: lab.programmed(WEB), 120, "every pod on every node again", interval=0.2)
    run.note("all_back")
    time.sleep(hold)


def scale_zero(run: Run, at_zero: float = 3.0) -> None:
    """The expected window: from the first pod's SIGTERM (from then on some pod no longer
    listens, and soon none does) until the new pods are on every node."""
    lab, cp = run.lab, run.lab.cp
    old = cp.live(lab.web)
    cp.scale(lab.web, 0)
    run.note("scaled_down")
    cp.wait_settled()
    run.note("all_gone")
    first_sigterm = min(p.record.sigterm for p in old if p.record.sigterm is not None)
    run.notes["first_sigterm"] = run.rel(first_sigterm)
    time.sleep(at_zero)
    cp.scale(lab.web, len(lab.net.nodes))
    cp.wait_ready(lab.web)
    wait_until(lambda: lab.programmed(WEB), 120, "the new pods on every node", interval=0.2)
    run.note("back")
    run.expected.append((first_sigterm, lab.clock()))


def udp_rollout(run: Run) -> None:
    cp = run.lab.cp
    dns = cp.deployments["dns"]
    cp.rollout(dns, next_version(dns))
    run.note("rollout_done")
    cp.wait_settled()


def prepare_dns(lab: Lab) -> None:
    lab.ensure_dns()


SCENARIOS = {
    s.name: s
    for s in (
        Scenario("rollout", "rolling update, 3 replicas over 3 nodes", rollout),
        Scenario("slow-node", "a pod deleted while one node's daemon is held back", slow_node),
        Scenario("upgrade", "ipvsctl's DaemonSet upgrade, SIGKILL mid-drain on node 2", upgrade),
        Scenario(
            "node-drain",
            "node drain behind the LB: taint, LB health, eviction, node-drain --wait",
            node_drain,
            restore=restore_node,
        ),
        Scenario("service-delete", "the Service deleted and created again", service_delete),
        Scenario("topology", "trafficDistribution set and removed on the live Service", topology),
        Scenario("scale-zero", "scaled to 0 and back to 3", scale_zero),
        Scenario(
            "udp-rollout",
            "rolling update of a DNS-like UDP Deployment",
            udp_rollout,
            load=lambda lab: lab.dns_load(),
            prepare=prepare_dns,
        ),
    )
}


# --- running one ---------------------------------------------------------------------------
def run_scenario(
    lab: Lab, name: str, mode: str, *, warmup: float = 3.0, cooldown: float = 3.0
) -> dict[str, Any]:
    scenario = SCENARIOS[name]
    lab.set_mode(mode)
    scenario.prepare(lab)
    rebalance(lab, lab.web)
    load = scenario.load(lab)
    offsets = {d.node.name: d.log_offset() for d in lab.daemons}
    cpu0 = cpu_seconds(lab)
    t0 = lab.clock()
    run = Run(lab, name, mode, t0, load)
    load.start()
    time.sleep(warmup)
    run.note("move")
    error = None
    try:
        scenario.act(run)
    except Exception as exc:  # the result says so; the lab goes on with the next one
        error = f"{type(exc).__name__}: {exc}"
    time.sleep(cooldown)
    run.note("load_stopping")
    load.stop()
    t1 = lab.clock()
    cpu1 = cpu_seconds(lab)
    summary = report.summarise(
        load.short_records(), load.stream_records(), load.udp_records(), t0, run.expected
    )
    result = {
        "scenario": name,
        "what": scenario.what,
        "mode": mode,
        "t0": t0,
        "duration": round(t1 - t0, 3),
        "error": error,
        "summary": summary.to_json(),
        "expected_windows": [[run.rel(a), run.rel(b)] for a, b in run.expected],
        "notes": run.notes,
        "pods": [
            {
                k: (run.rel(v) if isinstance(v, float) and k != "killed_connections" else v)
                for k, v in r.__dict__.items()
            }
            for r in lab.cp.records
            if (r.deleting is not None and r.deleting >= t0) or r.created >= t0
        ],
        "events": [(run.rel(t), what, detail) for t, what, detail in lab.cp.events if t >= t0],
        "lb": [
            {"t": run.rel(tr.t), "node": tr.node, "healthy": tr.healthy, "why": tr.why}
            for tr in lab.balancer.transitions
            if tr.t >= t0
        ],
        "daemon_log": daemon_log(lab, run, offsets),
        "cpu": cpu_used(cpu0, cpu1),
        "records": records(load, t0),
        "udp_failed": udp_diagnosis(lab, load, t0),
    }
    if error is None:
        scenario.restore(lab)
    return result


def cpu_seconds(lab: Lab) -> dict[str, tuple[int, float] | None]:
    """(pid, CPU seconds so far) of the harness and of every running daemon."""
    out: dict[str, tuple[int, float] | None] = {"harness": (os.getpid(), sum(os.times()[:2]))}
    for d in lab.daemons:
        out[d.node.name] = d.cpu_seconds()
    return out


def cpu_used(
    before: dict[str, tuple[int, float] | None], after: dict[str, tuple[int, float] | None]
) -> dict[str, Any]:
    """CPU seconds each process used in the scenario; a daemon restarted in it: its new
    process's, marked so."""
    out: dict[str, Any] = {}
    for k, now in after.items():
        if now is None:
            continue
        then = before.get(k)
        if then is not None and then[0] == now[0]:
            out[k] = round(now[1] - then[1], 1)
        else:
            out[k] = f"{now[1]:.1f} (new process)"
    return out


def records(load: Load, t0: float) -> dict[str, list[list[Any]]]:
    """Every outcome, compact, times relative to the scenario's start."""

    def r(t: float) -> float:
        return round(t - t0, 3)

    return {
        "short": [
            [c, r(x.start), r(x.end), x.ok, x.error, x.connect, x.pod]
            for c, x in load.short_records()
        ],
        "streams": [
            [s.client, r(s.start), r(s.end), s.outcome, s.lines, s.pod]
            for s in load.stream_records()
        ],
        "udp": [
            [u.client, u.qid, r(u.start), r(u.end), u.ok, u.pod, u.fixed_port, u.late and r(u.late)]
            for u in load.udp_records()
        ],
    }


def udp_diagnosis(lab: Lab, load: Load, t0: float) -> list[dict[str, Any]]:
    """Each unanswered query: did a pod get it (and when), did its answer come late?"""
    got = {qid: (r.pod, t) for r in lab.cp.responders for t, qid in r.received}
    out = []
    for u in load.udp_records():
        if u.ok:
            continue
        pod, t = got.get(u.qid, (None, None))
        out.append(
            {
                "client": u.client,
                "qid": u.qid,
                "sent": round(u.start - t0, 3),
                "fixed_port": u.fixed_port,
                "received_by": pod,
                "received_at": None if t is None else round(t - t0, 3),
                "late_answer_at": None if u.late is None else round(u.late - t0, 3),
            }
        )
    return out


def daemon_log(lab: Lab, run: Run, offsets: dict[str, int]) -> dict[str, list[dict[str, Any]]]:
    """Each daemon's drain lines, warnings and errors (and lines that are not JSON, such as a
    traceback) written during the scenario."""
    out = {}
    for d in lab.daemons:
        rows = []
        for rec in d.log_records(lab.clock.wall0, offsets[d.node.name]):
            if "raw" in rec:
                rows.append(rec)
            elif rec.get("msg") in DRAIN_LOG or rec.get("level") in ("warning", "error"):
                rows.append({**rec, "t": run.rel(rec.get("t"))})
        out[d.node.name] = rows
    return out

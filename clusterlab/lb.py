"""The external load balancer stand-in: IPVS in its own namespace, a virtual server on the
outside network whose real servers are every node's NodePort, and a health checker that
probes each node's kube-proxy-compatible `:10256/healthz` as a cloud load balancer of an
`externalTrafficPolicy: Cluster` Service does.

A node is taken out after `fall` failed probes in a row (a 503, a refused or timed-out
probe) and put back after `rise` good ones; taking it out sets its weight to 0, so new
connections go elsewhere and established ones go on (the "connection draining" of cloud
load balancers). Every change is kept with its time.
"""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field

from clusterlab.net import LB_VIP, ClusterNode, Network
from devkit.labkit import parse_ipvsadm, sh
from ipvsctl.kernel.netns import enter_netns

HEALTH_PORT = 10256


@dataclass(frozen=True)
class HealthPolicy:
    interval: float = 1.0
    timeout: float = 1.0
    rise: int = 2
    fall: int = 2


def next_health(healthy: bool, streak: int, ok: bool, policy: HealthPolicy) -> tuple[bool, int]:
    """One probe's result applied: (healthy, how many probes in a row disagreed with it)."""
    if ok == healthy:
        return healthy, 0
    streak += 1
    if streak >= (policy.rise if ok else policy.fall):
        return ok, 0
    return healthy, streak


@dataclass
class Transition:
    t: float
    node: str
    healthy: bool
    why: str


@dataclass
class LoadBalancer:
    net: Network
    node_port: int
    clock: Callable[[], float]
    port: int = 80
    policy: HealthPolicy = field(default_factory=HealthPolicy)
    transitions: list[Transition] = field(default_factory=list)

    def __post_init__(self) -> None:
        assert self.net.lb is not None
        self.netns = self.net.lb.name
        self.healthy = {n.name: False for n in self.net.nodes}  # until proven, as a real one
        self._streak = dict.fromkeys(self.healthy, 0)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        vs = f"{LB_VIP}:{self.port}"
        cmds = [f"-A -t {vs} -s rr"] + [
            f"-a -t {vs} -r {n.ip}:{self.node_port} -m -w 0" for n in self.net.nodes
        ]
        sh("ipvsadm", "-R", netns=self.netns, stdin="\n".join(cmds) + "\n")
        self._thread = threading.Thread(target=self._run, daemon=True, name="lb-checker")

    @property
    def address(self) -> str:
        return LB_VIP

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def weights(self) -> dict[str, int]:
        """The load balancer's kernel table: node name -> weight."""
        table = parse_ipvsadm(sh("ipvsadm", "-Ln", netns=self.netns))
        rss = table[f"{LB_VIP}:{self.port}/TCP"].real_servers
        return {
            n.name: rss[f"{n.ip}:{self.node_port}"].weight
            for n in self.net.nodes
            if f"{n.ip}:{self.node_port}" in rss
        }

    def all_healthy(self) -> bool:
        with self._lock:
            return all(self.healthy.values())

    def is_healthy(self, node: str) -> bool:
        with self._lock:
            return self.healthy[node]

    def _probe(self, node: ClusterNode) -> tuple[bool, str]:
        url = f"http://{node.ip}:{HEALTH_PORT}/healthz"
        try:
            with urllib.request.urlopen(url, timeout=self.policy.timeout) as r:
                return r.status == 200, str(r.status)
        except urllib.error.HTTPError as e:
            return False, str(e.code)
        except OSError as e:
            return False, type(e).__name__

    def _run(self) -> None:
        enter_netns(self.netns)  # probes come from the load balancer's own network
        while not self._stop.is_set():
            started = time.monotonic()
            for node in self.net.nodes:
                ok, why = self._probe(node)
                with self._lock:
                    was = self.healthy[node.name]
                    now, self._streak[node.name] = next_health(
                        was, self._streak[node.name], ok, self.policy
                    )
                    self.healthy[node.name] = now
                if now != was:
                    sh(
                        "ipvsadm", "-e", "-t", f"{LB_VIP}:{self.port}",
                        "-r", f"{node.ip}:{self.node_port}", "-m", "-w", "1" if now else "0",
                        netns=self.netns,
                    )  # fmt: skip
                    self.transitions.append(Transition(self.clock(), node.name, now, why))
            self._stop.wait(max(0.0, self.policy.interval - (time.monotonic() - started)))

"""The whole lab, put together: the networks, the API server (on the bridge, so every node's
daemon reaches it), one `ipvsctl run` per node, the control plane, the load balancer, and
the Deployments and Services the scenarios work on.

Modes: `ipvsctl` is ipvsctl as shipped (its drains, and the shutdown-manager's preStop on
every pod); `nodrain` is the contrast, a proxy without graceful termination: the daemons
run with `--drain-timeout 0 --service-drain-timeout 0`, every Service carries
`ipvsctl.io/drain-timeout: "0"` (the flag alone leaves a terminating endpoint draining for
its pod's life: CONTRACT.md, Draining, deadline rule 2; the annotation comes first), and
pods have no preStop (SIGTERM at once). Switching restarts every daemon on its state dir.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from clusterlab import kube
from clusterlab.control import Clock, ControlPlane, Deployment
from clusterlab.daemons import NODRAIN_ARGS, NodeDaemon
from clusterlab.lb import LoadBalancer
from clusterlab.load import Load, Streams, UdpQueries
from clusterlab.net import API_IP, ClusterNode, Network
from devkit.fakeapi.server import FakeAPIServer
from devkit.labkit import parse_ipvsadm, sh

MODES = ("ipvsctl", "nodrain")
NODRAIN_ANNOTATIONS = {"ipvsctl.io/drain-timeout": "0"}
WEB_VIP, WEB_PORT, NODE_PORT = "10.96.0.10", 80, 30080
DNS_VIP, DNS_PORT = "10.96.0.53", 53
WEB = kube.ServiceSpec(
    "web",
    "web",
    WEB_VIP,
    (kube.PortSpec("http", WEB_PORT, 8080, node_port=NODE_PORT),),
    type="NodePort",
)
DNS = kube.ServiceSpec("dns", "dns", DNS_VIP, (kube.PortSpec("dns", DNS_PORT, 5353, "UDP"),))


def wait_until(
    predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.5
) -> Any:
    """Poll until truthy; generous timeouts (the guest is emulated), never an assertion of
    time."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


class Lab:
    def __init__(self, out: Path, nodes: int = 3, lb_grace: float = 4.0) -> None:
        self.out = out
        self.clock = Clock()
        self.mode: str | None = None
        self.net = Network(nodes)
        self.api: FakeAPIServer | None = None
        self.control: ControlPlane | None = None
        self.lb: LoadBalancer | None = None
        self.daemons: list[NodeDaemon] = []
        try:
            self.api = FakeAPIServer(host=API_IP).start()
            (out / "logs").mkdir(parents=True, exist_ok=True)
            state = Path(tempfile.mkdtemp(prefix="clusterlab-state-"))  # local, not the 9p share
            self.daemons = [
                NodeDaemon(
                    n,
                    self.api.url,
                    state / n.name,
                    out / "logs" / f"ipvsctl-{n.name}.log",
                    self.clock,
                    lb_grace=lb_grace,
                )
                for n in self.net.nodes
            ]
            self.control = ControlPlane(self.api, self.net, self.clock, self.daemon_urls)
            self.lb = LoadBalancer(self.net, NODE_PORT, self.clock)
        except BaseException:
            self.close()
            raise

    # --- parts ---------------------------------------------------------------------------
    @property
    def cp(self) -> ControlPlane:
        assert self.control is not None
        return self.control

    @property
    def balancer(self) -> LoadBalancer:
        assert self.lb is not None
        return self.lb

    def daemon_urls(self) -> list[str]:
        return [d.url for d in self.daemons]

    def daemon(self, node: str) -> NodeDaemon:
        return next(d for d in self.daemons if d.node.name == node)

    @property
    def web(self) -> Deployment:
        return self.cp.deployments["web"]

    # --- set-up --------------------------------------------------------------------------
    def start(self, mode: str = "ipvsctl") -> None:
        """The daemons (their start takes longest: begun first), the web Deployment (3 pods,
        one per node) and its NodePort Service, and the load balancer seeing every node
        healthy."""
        self._start_daemons(mode)
        self.cp.create_service(WEB)
        self.cp.add_deployment("web", "http", len(self.net.nodes))
        self._ready(mode)
        self.balancer.start()
        wait_until(self.balancer.all_healthy, 300, "the load balancer to see every node healthy")

    def set_mode(self, mode: str, restart: bool = True) -> None:
        """Every daemon restarted with the mode's flags (on its state dir), if it changes.

        `restart=False` (make test's contrast, where three daemon starts cost minutes under
        emulation) switches only the Services' annotation and the pods' preStop: the
        daemons keep their flags, and draining is off all the same for these Services, whose
        `ipvsctl.io/drain-timeout` comes first in the deadline order (CONTRACT.md, Draining)."""
        if self.mode == mode:
            return
        if not restart:
            self._switch_cluster(mode)
            self.mode = mode
            self.cp.note("mode", f"{mode} (daemons not restarted)")
            return
        for d in self.daemons:
            if d.running():
                d.stop()
        self._start_daemons(mode)
        self._ready(mode)
        wait_until(self.balancer.all_healthy, 300, "every node healthy again")

    def _start_daemons(self, mode: str) -> None:
        self._switch_cluster(mode)
        for d in self.daemons:
            d.extra_args = () if mode == "ipvsctl" else NODRAIN_ARGS
            d.start()

    def _switch_cluster(self, mode: str) -> None:
        """The mode's part outside the daemons: the Services' annotation, the preStop."""
        if mode not in MODES:
            raise ValueError(f"mode {mode!r}: one of {', '.join(MODES)}")
        self.cp.set_service_annotations({} if mode == "ipvsctl" else NODRAIN_ANNOTATIONS)
        self.cp.barrier = mode == "ipvsctl"

    def _ready(self, mode: str) -> None:
        for d in self.daemons:
            d.wait_ready()
        self.mode = mode
        self.cp.note("mode", mode)
        wait_until(lambda: self.programmed(WEB), 300, "web programmed on every node")

    def ensure_dns(self) -> Deployment:
        if "dns" not in self.cp.deployments:
            self.cp.create_service(DNS)
            self.cp.add_deployment("dns", "udp", len(self.net.nodes))
            wait_until(lambda: self.programmed(DNS), 300, "dns programmed on every node")
        return self.cp.deployments["dns"]

    # --- witnesses -----------------------------------------------------------------------
    def table(self, node: ClusterNode) -> dict[str, Any]:
        return parse_ipvsadm(sh("ipvsadm", "-Ln", netns=node.netns))

    def weights(self, node: ClusterNode, vs: str) -> dict[str, int]:
        """`ipvsadm -Ln` on a node: real server address -> weight for virtual server `vs`
        (e.g. "10.96.0.10:80/TCP"); {} when it is not there."""
        svc = self.table(node).get(vs)
        return (
            {} if svc is None else {k.split(":")[0]: r.weight for k, r in svc.real_servers.items()}
        )

    def programmed(self, spec: kube.ServiceSpec) -> bool:
        """Every node has the Service's cluster IP (and NodePort) with exactly the serving
        pods of its Deployment at weight 1."""
        dep = self.cp.deployments.get(spec.selector)
        want = {p.ip for p in self.cp.live(dep)} if dep is not None else set()
        port = spec.ports[0]
        for node in self.net.nodes:
            addresses = [f"{spec.cluster_ip}:{port.port}/{port.protocol}"]
            if port.node_port is not None:
                addresses.append(f"{node.ip}:{port.node_port}/{port.protocol}")
            table = self.table(node)
            for vs in addresses:
                svc = table.get(vs)
                if svc is None:
                    return False
                up = {k.split(":")[0] for k, r in svc.real_servers.items() if r.weight > 0}
                if up != want:
                    return False
        return True

    # --- load ------------------------------------------------------------------------------
    def web_load(self, rate: float = 1.0, streams: int = 2, length: float = 8.0) -> Load:
        """Short requests and streams from the client pod of every node (to the cluster IP)
        and from outside (to the load balancer; twice the streams, so that some run
        through every node)."""
        load = Load()
        targets = [
            (n.name, n.client.netns.name, WEB_VIP, WEB_PORT)
            for n in self.net.nodes
            if n.client is not None
        ]
        assert self.net.outside is not None
        targets.append(("outside", self.net.outside.name, self.balancer.address, 80))
        for name, netns, address, port in targets:
            load.add_short(name, netns, address, port, self.clock, rate)
            count = streams * (2 if name == "outside" else 1)
            load.streams.append(
                Streams(name, netns, address, port, self.clock, count=count, length=length)
            )
        return load

    def dns_load(self, rate: float = 8.0) -> Load:
        load = Load()
        for n in self.net.nodes:
            assert n.client is not None
            load.udp.append(
                UdpQueries(n.name, n.client.netns.name, DNS_VIP, DNS_PORT, self.clock, rate=rate)
            )
        return load

    # --- teardown --------------------------------------------------------------------------
    def close(self) -> None:
        if self.lb is not None:
            self.lb.stop()
        for d in self.daemons:
            if d.running():
                d.stop()
        if self.control is not None:
            self.control.close()
        if self.api is not None:
            self.api.stop()
        self.net.close()

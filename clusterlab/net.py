"""The cluster's networks inside one VM.

```
 root netns (the harness, the API server)          outside
 clbr0 192.168.50.1/24 ─┬─ node-1 eth0 .11          client 198.51.100.2
                        ├─ node-2 eth0 .12             │
                        ├─ node-3 eth0 .13          LB ext0 198.51.100.1, VIP 198.51.100.10
                        └─ LB eth0 .254  ───────────── (IPVS, health checks on :10256)
```

- A node is a labkit.Node (its own netns: IPVS table, conntrack, nftables), joined to the
  bridge by a veth (`eth0`, 192.168.50.1N/24), its pods on veths as labkit.Pod makes them
  (a /32 each, gateway 169.254.1.1), its pod CIDR 10.244.N.0/24 routed to it by every other
  node (routed pod CIDRs, no overlay); its default route is the load balancer, so answers to
  outside clients go back through it.
- The harness's own netns reaches the nodes on the bridge (their daemons, the API server at
  192.168.50.1) and the pods through the same routes.
- Every node has a client pod (10.244.N.100) from which load starts; the outside network
  has one client behind the load balancer (lb.py).
"""

from __future__ import annotations

import contextlib
import itertools
from dataclasses import dataclass, field

from devkit.labkit import Netns, Node, Pod, sh

BRIDGE = "clbr0"
API_IP = "192.168.50.1"
LB_NODE_IP = "192.168.50.254"
LB_OUTSIDE_IP = "198.51.100.1"
OUTSIDE_CLIENT_IP = "198.51.100.2"
LB_VIP = "198.51.100.10"
CLUSTER_CIDR = "10.244.0.0/16"
ZONES = ("zone-a", "zone-b", "zone-c", "zone-d", "zone-e")


@dataclass
class ClusterNode:
    """One node: its netns (`lab`), address, zone and pod CIDR, and its client pod."""

    index: int
    lab: Node
    client: Pod | None = None
    _next_ip: itertools.count[int] = field(default_factory=lambda: itertools.count(10))

    @property
    def name(self) -> str:
        return f"node-{self.index}"

    @property
    def netns(self) -> str:
        return self.lab.name

    @property
    def ip(self) -> str:
        return f"192.168.50.{10 + self.index}"

    @property
    def zone(self) -> str:
        return ZONES[(self.index - 1) % len(ZONES)]

    @property
    def pod_cidr(self) -> str:
        return f"10.244.{self.index}.0/24"

    def pod_ip(self) -> str:
        """A fresh pod address in this node's CIDR (never reused in one run: a reused address
        would make an old connection's entries look like the new pod's)."""
        n = next(self._next_ip)
        if n == 100:  # the client pod's
            n = next(self._next_ip)
        if n > 254:
            raise RuntimeError(f"{self.name}: out of pod addresses")
        return f"10.244.{self.index}.{n}"

    def make_pod(self, name: str, ip: str) -> Pod:
        """A pod netns joined to this node (no servers: the caller starts its app)."""
        return self.lab.make_pod(ip, name=name, tcp=())


class Network:
    """The bridge, `count` nodes with routed pod CIDRs and client pods, and the outside
    namespaces (the load balancer's and its client's). `close()` removes all of it."""

    def __init__(self, count: int = 3) -> None:
        self.nodes: list[ClusterNode] = []
        self.lb: Netns | None = None
        self.outside: Netns | None = None
        self._links: list[str] = []
        try:
            self._build(count)
        except BaseException:
            self.close()
            raise

    def _build(self, count: int) -> None:
        sh("modprobe", "bridge", check=False)  # usually loaded on demand
        sh("ip", "link", "del", BRIDGE, check=False)  # a previous run's, if it died
        root = [
            f"link add {BRIDGE} type bridge",
            f"addr add {API_IP}/24 dev {BRIDGE}",
            f"link set {BRIDGE} up",
        ]
        self._links.append(BRIDGE)
        for i in range(1, count + 1):
            node = ClusterNode(i, Node(kernel=False))
            self.nodes.append(node)
            root += [
                f"link add cln{i} type veth peer name eth0 netns {node.netns}",
                f"link set cln{i} master {BRIDGE} up",
                f"route add {node.pod_cidr} via {node.ip}",
            ]
        self.lb = Netns("cllb")
        self.outside = Netns("clext")
        root += [
            f"link add cllb0 type veth peer name eth0 netns {self.lb.name}",
            f"link set cllb0 master {BRIDGE} up",
        ]
        sh("ip", "-batch", "-", stdin="\n".join(root) + "\n")
        for node in self.nodes:
            cmds = [
                f"addr add {node.ip}/24 dev eth0",
                "link set eth0 up",
                f"route add default via {LB_NODE_IP}",
            ]
            cmds += [
                f"route add {other.pod_cidr} via {other.ip}"
                for other in self.nodes
                if other is not node
            ]
            node.lab.netns.ip_batch(cmds)
            node.client = node.make_pod("client", f"10.244.{node.index}.100")
        # the load balancer: one leg on the node network, one outside, the VIP outside
        sh(
            "ip", "-n", self.lb.name, "link", "add", "ext0", "type", "veth",
            "peer", "name", "eth0", "netns", self.outside.name,
        )  # fmt: skip
        self.lb.ip_batch(
            [
                f"addr add {LB_NODE_IP}/24 dev eth0",
                "link set eth0 up",
                f"addr add {LB_OUTSIDE_IP}/24 dev ext0",
                f"addr add {LB_VIP}/32 dev ext0",
                "link set ext0 up",
            ]
        )
        self.lb.sysctl("net.ipv4.ip_forward", "1")
        self.outside.ip_batch(
            [
                f"addr add {OUTSIDE_CLIENT_IP}/24 dev eth0",
                "link set eth0 up",
                f"route add default via {LB_OUTSIDE_IP}",
            ]
        )

    def node(self, name: str) -> ClusterNode:
        return next(n for n in self.nodes if n.name == name)

    def close(self) -> None:
        for node in self.nodes:
            with contextlib.suppress(Exception):
                node.lab.close()
        for ns in (self.lb, self.outside):
            if ns is not None:
                ns.delete()
        for link in ("cllb0", *(f"cln{n.index}" for n in self.nodes), BRIDGE):
            sh("ip", "link", "del", link, check=False)

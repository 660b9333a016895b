"""Lab pieces for the netfilter tests (masquerade, hairpin, NodePorts from outside), on top
of labkit's node and pods:

- `Outside`: a host off the node, in its own netns, joined to the node by a veth pair on a
  small LAN (node 192.168.50.1, host 192.168.50.2, fd50::1 / fd50::2): it reaches NodePorts
  on the node's LAN address, and external/load-balancer IPs and the service range through a
  route via the node. Its answers come back through the node: the node is its only route.
- `serve_peers(pod, tcp=..., udp=...)`: backends that tell who they are *and the peer
  address they saw* ("<pod> <ip>"), so tests can check what masquerading did to the source
  address; `ask(client, address, port, proto)` -> (pod, peer).
- `run_daemon(...)`: the real daemon in-process (engine, manifests source, netfilter sync,
  health servers; its HTTP servers on the test process's loopback) against a lab node:
  IPVS through NetlinkKernel(netns), nft through `ip netns exec`, health-check sockets
  opened inside the node's namespace.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from devkit.labkit import Connection, Netns, Node, Pod, open_connection, sh
from ipvsctl.daemon.options import (
    DrainOptions,
    HTTPOptions,
    NetfilterOptions,
    NodeDrainOptions,
    SourceOptions,
)
from ipvsctl.kernel.netns import run_in_netns

NODE_LAN = "192.168.50.1"
OUTSIDE_IP = "192.168.50.2"
NODE_LAN6 = "fd50::1"
OUTSIDE_IP6 = "fd50::2"


def serve_peers(pod: Pod, tcp: tuple[int, ...] = (8080,), udp: tuple[int, ...] = ()) -> None:
    """Backends in `pod` that answer "<pod> <peer address>" (closed with the pod)."""
    for proto, ports in (("tcp", tcp), ("udp", udp)):
        for port in ports:
            pod.serve(proto, port, report_peer=True)


def ask(
    client: Pod | Client, address: str, port: int, proto: str = "tcp", attempts: int = 5
) -> tuple[str, str]:
    """(answering pod, peer address it saw) over TCP or UDP (UDP retried: it may drop)."""
    if proto == "tcp":
        with client.connect(address, port) as conn:
            pod, _, peer = conn.pod.partition(" ")
            assert conn.echo("hello"), "connection does not carry data both ways"
            return pod, peer
    for _ in range(attempts):
        answer = client.udp(address, port)
        if answer:
            pod, _, peer = answer.partition(" ")
            return pod, peer
    raise AssertionError(f"no UDP answer from {address}:{port} in {attempts} attempts")


class Client:
    """A TCP/UDP client in some network namespace (labkit's Pod client methods, for hosts
    that are not pods)."""

    def __init__(self, netns: Netns, name: str) -> None:
        self.netns, self.name = netns, name

    def connect(self, address: str, port: int, timeout: float = 20.0) -> Connection:
        return open_connection(self.netns, address, port, timeout=timeout)

    def udp(self, address: str, port: int, timeout: float = 3.0) -> str | None:
        s = self.netns.socket(
            socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_DGRAM
        )
        try:
            s.settimeout(timeout)
            s.sendto(b"ping", (address, port))
            return s.recv(2048).decode()
        except TimeoutError:
            return None
        finally:
            s.close()


class HostClient(Client):
    """A client in the node's own network namespace: host-network traffic."""

    def __init__(self, node: Node) -> None:
        super().__init__(node.netns, "host")


class Outside(Client):
    """A host outside the node (not a pod): routed to the node over a LAN veth pair."""

    def __init__(self, node: Node, name: str = "outside") -> None:
        super().__init__(Netns(f"{node.name}-{name}"), name)
        self.ip, self.ip6 = OUTSIDE_IP, OUTSIDE_IP6
        sh(
            "ip",
            "-n",
            node.name,
            "link",
            "add",
            "lan0",
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            self.netns.name,
        )
        node.netns.ip_batch(
            [
                f"addr add {NODE_LAN}/24 dev lan0",
                f"addr add {NODE_LAN6}/64 dev lan0 nodad",
                "link set lan0 up",
            ]
        )
        self.netns.ip_batch(
            [
                f"addr add {OUTSIDE_IP}/24 dev eth0",
                f"addr add {OUTSIDE_IP6}/64 dev eth0 nodad",
                "link set eth0 up",
                f"route add default via {NODE_LAN} dev eth0",
                f"route add default via {NODE_LAN6} dev eth0",
            ]
        )

    def close(self) -> None:
        self.netns.delete()


def write_manifests(folder: Path, name: str, *objs: dict[str, Any]) -> None:
    """Atomically (the manifests source polls the folder)."""
    tmp = folder / f".{name}.tmp"
    tmp.write_text(yaml.safe_dump_all(objs))
    tmp.rename(folder / name)


def health_socket_factory(netns: str):
    """Listening sockets for healthCheckNodePorts, opened inside the node's namespace."""
    from ipvsctl.healthcheck.server import listen_any

    def make(port: int) -> socket.socket:
        return run_in_netns(netns, lambda: listen_any(port))

    return make


@contextlib.contextmanager
def run_daemon(
    node: Node,
    manifests: Path,
    state_dir: Path,
    *,
    node_ips: tuple[str, ...] = (NODE_LAN, NODE_LAN6),
    cluster_cidrs: tuple[str, ...] = ("10.244.0.0/16",),
    masquerade_all: bool = False,
    healthz_bind_address: str = "",
    lb_grace: float = 30.0,
) -> Iterator[Any]:
    """The daemon, in-process, programming `node`; stopped (table left in place) on exit."""
    from ipvsctl.daemon.options import DaemonOptions
    from ipvsctl.daemon.wiring import Daemon
    from ipvsctl.manifests import ManifestSource
    from ipvsctl.model import NodeContext
    from ipvsctl.netfilter.nft import Nft

    opts = DaemonOptions(
        node=NodeContext("node-a", node_ips),
        source=SourceOptions(manifests=str(manifests)),
        drain=DrainOptions(state_dir=str(state_dir), check_interval=0.2),
        http=HTTPOptions(listen="127.0.0.1:0", healthz_bind_address=healthz_bind_address),
        netfilter=NetfilterOptions(cluster_cidrs=cluster_cidrs, masquerade_all=masquerade_all),
        node_drain=NodeDrainOptions(lb_grace=lb_grace),
    )
    d = Daemon(
        opts,
        node.kernel,
        ManifestSource(manifests, interval=0.2),
        nft=Nft(netns=node.name),
        health_ports=health_socket_factory(node.name),
    )
    d.start()
    try:
        yield d
    finally:
        if not d.stop.is_set():  # a test may have stopped it already
            d.shutdown()

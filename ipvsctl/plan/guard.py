"""What a Service may never make of this node (CONTRACT.md "Node safety"), by the node's
context. Pure. The addresses that are never a virtual server on any node (loopback,
link-local, ...) are refused earlier, in source/convert.py, as field warnings.

- One Service may make at most `max_virtual_servers` virtual servers: 450 ports x 450
  externalIPs is a 38 KB object and 202,500 virtual servers on every node (433 MiB, a 17 s
  sync under the loop lock). Counted from the object's lists before anything is built.
- The API server's own address as an external or load-balancer IP: bound on kube-ipvs0, it
  would send the daemon's own API traffic into IPVS (it could never see the Service go).
- A node address at a port outside the NodePort range: `externalIPs: [<node IP>]` at port
  22 would capture sshd, 10250 the kubelet. Any address of the node counts (`host_ips`:
  docker0's, a second NIC's), not only those NodePorts listen on (`node_ips`, which
  --node-ip or nodePortAddresses may narrow).
"""

from __future__ import annotations

from ipvsctl.model import NodeContext, VirtualServerKind, family_of
from ipvsctl.model.objects import ServiceInfo


def virtual_server_count(svc: ServiceInfo, node: NodeContext) -> int:
    """How many virtual servers the Service would make at most (before duplicates and
    refused addresses are taken out): O(its ports), whatever the product."""
    if svc.type == "ExternalName":
        return 0
    per_port = len(svc.cluster_ips) + len(svc.external_ips)
    if svc.type == "LoadBalancer":
        per_port += len(svc.load_balancer_ips)
    total = per_port * len(svc.ports)
    if svc.type in ("NodePort", "LoadBalancer"):
        node_ips = sum(1 for ip in node.node_ips if family_of(ip) in svc.families)
        total += node_ips * sum(1 for p in svc.ports if p.node_port)
    return total


def too_many(svc: ServiceInfo, node: NodeContext) -> str | None:
    """Why the Service is refused whole, or None."""
    n = virtual_server_count(svc, node)
    if n <= node.max_virtual_servers:
        return None
    return (
        f"would make {n} virtual servers, more than --max-virtual-servers-per-service "
        f"{node.max_virtual_servers}: refused whole"
    )


def is_node_address(address: str, node: NodeContext) -> bool:
    """An address of this node: a NodePort address, or any other it holds."""
    return address in node.host_ips or address in node.node_ips


def refused_address(
    kind: VirtualServerKind, address: str, port: int, node: NodeContext
) -> str | None:
    """Why this one virtual server is never made on this node, or None."""
    if kind in (VirtualServerKind.EXTERNAL_IP, VirtualServerKind.LOAD_BALANCER) and (
        address in node.apiserver_ips
    ):
        return f"{kind.value} {address} is the API server's address"
    if port not in node.node_port_range and is_node_address(address, node):
        return (
            f"{kind.value} {address}:{port} is a node address at a port outside the NodePort range"
        )
    return None

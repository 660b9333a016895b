"""This node's addresses (the default for --node-ip): global-scope addresses of every
interface but loopback and the VIP dummy interface."""

from __future__ import annotations

import ipaddress


def node_addresses(exclude_interfaces: tuple[str, ...] = ("kube-ipvs0",)) -> list[str]:
    from pyroute2 import IPRoute  # the adapter boundary: pyroute2 only under kernel/

    out: list[str] = []
    with IPRoute() as ipr:
        names = {link["index"]: link.get_attr("IFLA_IFNAME") for link in ipr.get_links()}
        for addr in ipr.get_addr():
            if addr["scope"] != 0 or names.get(addr["index"]) in (*exclude_interfaces, "lo"):
                continue
            ip = addr.get_attr("IFA_ADDRESS")
            if ip and not ipaddress.ip_address(ip).is_link_local:
                out.append(ipaddress.ip_address(ip).compressed)
    return sorted(set(out))


# Where Kubernetes service proxies put their virtual IPs: kube-proxy's (IPVS mode) and
# kube-router's dummy interfaces.
PROXY_INTERFACES = ("kube-ipvs0", "kube-dummy-if")


def interface_addresses(names: tuple[str, ...] = PROXY_INTERFACES) -> list[str]:
    """Every address on the named interfaces that exist (compressed form, sorted)."""
    from pyroute2 import IPRoute

    out: set[str] = set()
    with IPRoute() as ipr:
        wanted = {
            link["index"] for link in ipr.get_links() if link.get_attr("IFLA_IFNAME") in names
        }
        for addr in ipr.get_addr():
            ip = addr.get_attr("IFA_ADDRESS")
            if addr["index"] in wanted and ip:
                out.add(ipaddress.ip_address(ip).compressed)
    return sorted(out)

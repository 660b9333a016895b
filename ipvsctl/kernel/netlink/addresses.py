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

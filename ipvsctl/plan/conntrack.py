"""Which conntrack entries to delete (pure): those of a removed UDP/SCTP real server
(`real_server_entries`), and the stale ones (`stale_entries`, kube-proxy's
CleanStaleEntries for IPVS).

A removed real server's entries are those sent to its virtual server (original
destination: the virtual server's address and port) and answered by it (reply source: its
address and port), as kube-proxy's filter for a removed endpoint: deleting them moves the
clients to a live backend at their next datagram. The daemon deletes them with the real
server (NetlinkKernel.flush_conntrack).

A UDP (or SCTP) conntrack entry whose original destination is a Service frontend of this
node (cluster IP, external or load-balancer IP, node address + NodePort: the virtual
servers' own keys) and whose reply source is not one of the Service's serving endpoints
is stale: it was made while no virtual server for it existed (the reply source is
then the VIP itself), or it outlived its endpoint (a daemon restart, a missed flush). A
client that keeps its source port keeps riding such an entry: IPVS still schedules its
datagrams, but the entry's NAT was settled at its first packet, so the node's masquerade
never applies to them (seen on a 6.1 kernel). Deleting it lets the next datagram start a
fresh entry.

As in kube-proxy, a frontend with no serving endpoint is left alone (there is nowhere
better to send its clients), and serving means the Service's serving endpoints whatever
the traffic policy or topology picked: a policy change does not cut existing flows. The
reply source is compared by address only, as kube-proxy does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ipvsctl.model import (
    DesiredService,
    DesiredVirtualServer,
    Protocol,
    RealServerKey,
    ServiceKey,
)
from ipvsctl.model.conntrack import ConntrackEntry

SWEPT_PROTOCOLS = (Protocol.UDP, Protocol.SCTP)

Frontend = tuple[Protocol, str, int]  # protocol, address, port of a virtual server


@dataclass(frozen=True, slots=True)
class SweepTable:
    """Swept frontends -> the addresses of their serving endpoints (never empty)."""

    frontends: Mapping[Frontend, frozenset[str]]

    def dumps(self) -> list[tuple[Protocol, bool]]:
        """(protocol, ipv6) of the conntrack dumps the sweep needs: none for a family or
        protocol without a swept frontend."""
        return sorted({(p, ":" in address) for p, address, _ in self.frontends})


def _service_serving(svc: DesiredService) -> frozenset[str]:
    return frozenset(address for address, e in svc.endpoints.items() if e.serving)


def _serving(service_serving: frozenset[str], dvs: DesiredVirtualServer) -> frozenset[str]:
    # The real servers too: what IPVS was told is served, whatever the slices say now.
    return service_serving | {rs.address for rs in dvs.real_servers}


def sweep_table(
    services: Iterable[DesiredService], protocols: Iterable[Protocol] = SWEPT_PROTOCOLS
) -> SweepTable:
    wanted = frozenset(protocols)
    frontends: dict[Frontend, frozenset[str]] = {}
    for svc in services:
        service_serving: frozenset[str] | None = None
        for key, dvs in svc.virtual_servers.items():
            if key.protocol not in wanted:
                continue
            if service_serving is None:
                service_serving = _service_serving(svc)
            serving = _serving(service_serving, dvs)
            if not serving:
                continue
            frontend = (key.protocol, key.address, key.port)
            # two Services claiming one frontend: either's endpoints are fine
            frontends[frontend] = frontends.get(frontend, frozenset()) | serving
    return SweepTable(frontends)


def real_server_entries(
    entries: Iterable[ConntrackEntry], key: ServiceKey, rs: RealServerKey
) -> list[ConntrackEntry]:
    """The entries of connections virtual server `key` sent to real server `rs`, sorted."""
    return sorted(
        e
        for e in entries
        if e.protocol == key.protocol
        and e.orig_dst == key.address
        and e.orig_dport == key.port
        and e.reply_src == rs.address
        and e.reply_sport == rs.port
    )


def stale_entries(entries: Iterable[ConntrackEntry], table: SweepTable) -> list[ConntrackEntry]:
    """The entries to delete, sorted."""
    stale = []
    for e in entries:
        serving = table.frontends.get((e.protocol, e.orig_dst, e.orig_dport))
        if serving is not None and e.reply_src not in serving:
            stale.append(e)
    return sorted(stale)


def newly_served(
    old: DesiredService | None,
    new: DesiredService | None,
    protocols: Iterable[Protocol] = SWEPT_PROTOCOLS,
) -> bool:
    """A swept frontend of `new` has serving endpoints and had none (or did not exist) in
    `old`: the moment clients stuck on an entry made meanwhile start being lost. O(the
    Service)."""
    if new is None:
        return False
    wanted = frozenset(protocols)
    keys = [k for k in new.virtual_servers if k.protocol in wanted]
    if not keys:
        return False
    new_serving = _service_serving(new)
    old_serving = _service_serving(old) if old is not None else frozenset()
    for key in keys:
        if not _serving(new_serving, new.virtual_servers[key]):
            continue
        before = old.virtual_servers.get(key) if old is not None else None
        if before is None or not _serving(old_serving, before):
            return True
    return False

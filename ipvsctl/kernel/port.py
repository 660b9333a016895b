"""The IPVS kernel interface the engine programs, and the errors every implementation raises.

Implementations translate their own errors (NetlinkError, ...) into these at the boundary,
so nothing above `kernel/` ever sees a foreign exception.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from ipvsctl.model import (
    ConnScan,
    RealServerKey,
    RealServerStatus,
    ServiceKey,
    ServiceStats,
    VirtualServer,
)

if TYPE_CHECKING:
    from ipvsctl.model import Protocol as TransportProtocol
    from ipvsctl.model.conntrack import ConntrackEntry


class KernelError(Exception):
    """Base of every kernel error; `operation` names the call that failed."""

    def __init__(self, message: str, operation: str = "") -> None:
        super().__init__(message)
        self.operation = operation


class KernelNotFound(KernelError):
    """The virtual or real server does not exist (ENOENT/ESRCH)."""


class KernelExists(KernelError):
    """The virtual or real server already exists (EEXIST)."""


class KernelTransient(KernelError):
    """Any other failure; the operation may succeed when retried."""


class KernelUnavailable(KernelError):
    """IPVS is not in the kernel (module missing): fatal at start-up."""


class KernelPermissionDenied(KernelError):
    """No CAP_NET_ADMIN: fatal at start-up."""


class IPVSKernel(Protocol):
    """What the engine needs from IPVS. All methods are synchronous and idempotent-safe:
    callers handle KernelExists/KernelNotFound themselves."""

    def list_virtual_servers(self) -> list[VirtualServer]:
        """Every virtual server in the table (one dump), in no particular order."""
        ...

    def list_real_servers(self, key: ServiceKey) -> list[RealServerStatus]:
        """The real servers of one virtual server with weights and connection counts (one
        dump). KernelNotFound if the virtual server does not exist."""
        ...

    def read_real_servers(
        self,
        keys: Collection[ServiceKey],
        only: Mapping[ServiceKey, Collection[RealServerKey]] | None = None,
    ) -> dict[ServiceKey, list[RealServerStatus] | None]:
        """The real servers of many virtual servers in one read (/proc/net/ip_vs), with
        weights and counts: None for a virtual server that is not in the kernel; a key left
        out could not be read this time (ask again later). With `only`, a virtual server's
        list holds just those of its real servers that are in the kernel (a drain check
        needs no others: parsing them was most of its read)."""
        ...

    def dump_real_servers(
        self,
        keys: Sequence[ServiceKey],
        only: Mapping[ServiceKey, Collection[RealServerKey]] | None = None,
    ) -> dict[ServiceKey, list[RealServerStatus] | KernelError | None]:
        """The real servers of these virtual servers, one dump each, back to back (its cost
        grows with the keys, where read_real_servers' grows with the whole table): None for
        a virtual server that is not in the kernel, the KernelError of one whose dump
        failed (the others are still read). `only` as in read_real_servers."""
        ...

    def read_connections(self, pairs: Collection[tuple[ServiceKey, RealServerKey]]) -> ConnScan:
        """TCP connections of these (virtual, real server) pairs by state, one streamed read
        of /proc/net/ip_vs_conn. KernelUnavailable when the kernel offers no such file."""
        ...

    def add_virtual_server(self, vs: VirtualServer, bind_address: bool) -> None:
        """Create the virtual server; with bind_address, also put its address on the dummy
        interface (idempotent)."""
        ...

    def update_virtual_server(self, vs: VirtualServer) -> None:
        """Change scheduler/persistence in place (never delete and re-add)."""
        ...

    def delete_virtual_server(self, key: ServiceKey, bind_address: bool) -> None:
        """Delete the virtual server; with bind_address, drop its address from the dummy
        interface once no other virtual server uses it."""
        ...

    def add_real_server(self, key: ServiceKey, rs: RealServerKey, weight: int) -> None:
        """Add a real server with NAT (masquerade) forwarding."""
        ...

    def set_real_server_weight(self, key: ServiceKey, rs: RealServerKey, weight: int) -> None: ...

    def delete_real_server(self, key: ServiceKey, rs: RealServerKey) -> None: ...

    def flush_conntrack(self, key: ServiceKey, rs: RealServerKey) -> None:
        """Remove conntrack entries of connections from this virtual to this real server
        (UDP/SCTP removal), so clients move to a live backend."""
        ...


@runtime_checkable
class RealServerBatch(Protocol):
    """Many real servers of one virtual server added in one exchange with the kernel (the
    netlink adapter: one send for a Service's endpoints, where an add each costs two
    system calls). Separate from IPVSKernel: a kernel without it gets an add each."""

    def add_real_servers(
        self, key: ServiceKey, real_servers: Sequence[RealServerKey], weight: int
    ) -> list[KernelError | None]:
        """add_real_server for each, in order: per real server its error, None for one
        added. Raises a KernelError only when none is known added."""
        ...


def add_each(
    kernel: IPVSKernel, key: ServiceKey, real_servers: Sequence[RealServerKey], weight: int
) -> list[KernelError | None]:
    """RealServerBatch.add_real_servers as one add_real_server call each."""
    out: list[KernelError | None] = []
    for rs in real_servers:
        try:
            kernel.add_real_server(key, rs, weight)
            out.append(None)
        except KernelError as exc:
            out.append(exc)
    return out


@runtime_checkable
class ServiceStatsReader(Protocol):
    """The kernel's per-virtual-server traffic counters, for the per-Service traffic
    metrics (reconcile/service_traffic.py). Separate from IPVSKernel: the engine never
    reads them."""

    def read_service_stats(self) -> dict[ServiceKey, ServiceStats]:
        """Every virtual server's counters in one service dump (no per-Service call)."""
        ...


class ConntrackTable(Protocol):
    """The conntrack table, for the stale-entry sweep (reconcile/conntrack_sweeper.py).
    Separate from IPVSKernel; on netlink (kernel/netlink/conntrack.py) the same adapter
    makes NetlinkKernel.flush_conntrack."""

    def list_conntrack(
        self, protocol: TransportProtocol, ipv6: bool, port: int | None = None
    ) -> list[ConntrackEntry]:
        """Every entry of one protocol and family (with `port`, of that original
        destination port): one dump, filtered in the kernel. KernelUnavailable when the
        kernel has no conntrack to dump."""
        ...

    def delete_conntrack(self, entries: Collection[ConntrackEntry]) -> int:
        """Delete these entries (by their original tuple); returns how many were deleted
        (one gone meanwhile is not an error)."""
        ...


class HostAddresses(Protocol):
    """The node's own addresses as the kernel has them, followed while running (netlink:
    kernel/netlink/address_watch.py). `version` grows with every change; the two reads
    are the state as of that version, O(1) each, from any thread."""

    version: int

    def host_addresses(self) -> frozenset[str]:
        """Every address of the node but the proxies' dummy interfaces' (Node safety)."""
        ...

    def node_addresses(self) -> list[str]:
        """The default NodePort addresses (global scope, not lo, not the VIP interface)."""
        ...

"""NetlinkKernel: the IPVSKernel port on the running kernel, composed from the modules of
this package (netlink) and procfs's readers (the connection counts), with the port's
semantics: a virtual server's address is bound before it is added and dropped with its
last user. `configure_host()` is start-up (procfs's sysctls and the IPVS timeouts).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Collection, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext

from ipvsctl.kernel import table
from ipvsctl.kernel.netlink.codec import IPVSTimeouts
from ipvsctl.kernel.netlink.conntrack import NetlinkConntrack
from ipvsctl.kernel.netlink.interface import DEFAULT_INTERFACE, AddressIndex, DummyInterface
from ipvsctl.kernel.netlink.ipvs_calls import IPVSCalls
from ipvsctl.kernel.netlink.sockets import Sockets
from ipvsctl.kernel.netns import netns_path
from ipvsctl.kernel.port import (
    ConntrackTable,
    IPVSKernel,
    KernelError,
    KernelExists,
    KernelNotFound,
    KernelUnavailable,
    RealServerBatch,
    ServiceStatsReader,
)
from ipvsctl.kernel.procfs import ipvs as procfs
from ipvsctl.kernel.procfs import sysctl
from ipvsctl.model import (
    ConnScan,
    RealServerKey,
    RealServerStatus,
    ServiceKey,
    ServiceStats,
    VirtualServer,
    VirtualServerStatus,
)
from ipvsctl.model.conntrack import ConntrackEntry
from ipvsctl.obs.logging import fields
from ipvsctl.plan.conntrack import real_server_entries

log = logging.getLogger("ipvsctl.kernel")


class NetlinkKernel:
    """IPVSKernel on the running kernel (or in network namespace `netns`).

    The constructor checks that IPVS is there and usable: KernelUnavailable without IPVS
    (or without the named netns), KernelPermissionDenied without CAP_NET_ADMIN. With
    create_interface (the daemon), the dummy interface is created if missing. `sockets`
    opens pyroute2's sockets (devkit's netlink model passes its own); `conntrack` is the
    table flush_conntrack lists and deletes in (default: over netlink, in `netns`);
    `on_answers_lost(n)` is told when a batch of adds lost n answers (each add reported
    failed: ipvs_calls.py). Deletions run with expire_nodest_conn at 1 (`expire`, default
    on the running kernel: procfs's ExpireOnDelete), so they cut what they always cut while
    the node keeps 0 between them (a foreign flush keeps its connections).

    Any thread may call it: each calling thread gets its own netlink sockets on first use,
    kept until close(). Call it from a few long-lived threads, not from one thread per
    request.
    """

    def __init__(
        self,
        interface: str = DEFAULT_INTERFACE,
        *,
        netns: str | None = None,
        create_interface: bool = True,
        sockets: Sockets | None = None,
        conntrack: ConntrackTable | None = None,
        on_answers_lost: Callable[[int], object] | None = None,
        expire: sysctl.ExpireOnDelete | None = None,
    ) -> None:
        self.interface = interface
        self.netns = netns
        if netns is not None and not os.path.exists(netns_path(netns)):
            raise KernelUnavailable(f"network namespace {netns} not found", "open")
        self._sockets = sockets if sockets is not None else Sockets(netns)
        self._calls = IPVSCalls(self._sockets, on_answers_lost)
        self._link = DummyInterface(self._sockets, interface)
        self._index = AddressIndex()
        self._conntrack = conntrack if conntrack is not None else NetlinkConntrack(netns)
        if expire is None and sockets is None:  # the running kernel's, not devkit's model
            expire = sysctl.ExpireOnDelete(netns=netns, proc_sys=sysctl.writable_proc_sys(netns))
        self._expire = expire
        self._sockets.ipvs()  # fail now, with a clear message, rather than at the first sync
        if create_interface:
            self.ensure_interface()

    def close(self) -> None:
        self._sockets.close()
        if self._expire is not None:
            self._expire.close()

    def _expiring(self) -> AbstractContextManager[None]:
        return self._expire.around() if self._expire is not None else nullcontext()

    def __enter__(self) -> NetlinkKernel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- IPVSKernel -----------------------------------------------------------------------
    def list_virtual_servers(self) -> list[VirtualServer]:
        found = self._calls.list_virtual_servers()
        self._index.refresh(vs.key for vs in found)  # every full dump refreshes the index
        return found

    def list_real_servers(self, key: ServiceKey) -> list[RealServerStatus]:
        return self._calls.list_real_servers(key)

    def read_real_servers(
        self,
        keys: Collection[ServiceKey],
        only: Mapping[ServiceKey, Collection[RealServerKey]] | None = None,
    ) -> dict[ServiceKey, list[RealServerStatus] | None]:
        scan = procfs.read_real_servers(keys, only, netns=self.netns)
        out: dict[ServiceKey, list[RealServerStatus] | None] = {}
        for k in keys:
            if k in scan.unreadable:
                continue
            found = scan.real_servers.get(k)
            if found is None:
                # Not in the file: gone, or skipped. A read of /proc/net/ip_vs in pages can
                # miss an entry (seen on 6.1 with 300 virtual servers, none changing), so
                # "gone" is asked of the kernel for this one alone (rare: O(the missing)).
                try:
                    listed = self._calls.list_real_servers(k)
                except KernelNotFound:
                    out[k] = None
                    continue
                except KernelError:
                    continue  # unreadable: the caller reads it as unknown, not gone
                wanted = None if only is None else frozenset(only.get(k, ()))
                found = [s for s in listed if wanted is None or s.key in wanted]
            out[k] = found
        return out

    def dump_real_servers(
        self,
        keys: Sequence[ServiceKey],
        only: Mapping[ServiceKey, Collection[RealServerKey]] | None = None,
    ) -> dict[ServiceKey, list[RealServerStatus] | KernelError | None]:
        return self._calls.dump_real_servers(keys, only)

    def read_connections(self, pairs: Collection[tuple[ServiceKey, RealServerKey]]) -> ConnScan:
        return procfs.read_connections(pairs, netns=self.netns)

    def add_virtual_server(self, vs: VirtualServer, bind_address: bool) -> None:
        # address first (as kube-proxy): the virtual server answers as soon as it exists
        if bind_address:
            self.bind_address(vs.key.address)
        try:
            self._calls.add_service(vs)
        except KernelExists:
            self._index.record(vs.key, True)
            raise
        except KernelError:
            if bind_address:
                self._unbind_if_unused_quietly(vs.key.address)
            raise
        self._index.record(vs.key, True)

    def update_virtual_server(self, vs: VirtualServer) -> None:
        self._calls.set_service(vs)

    def delete_virtual_server(self, key: ServiceKey, bind_address: bool) -> None:
        try:
            with self._expiring():
                self._calls.delete_service(key)
        except KernelNotFound:
            self._index.record(key, False)
            # already gone: still drop an address nothing uses any more (after a restart)
            if bind_address:
                self.unbind_address_if_unused(key.address)
            raise
        self._index.record(key, False)
        if bind_address:
            self.unbind_address_if_unused(key.address)

    def add_real_server(self, key: ServiceKey, rs: RealServerKey, weight: int) -> None:
        self._calls.add_dest(key, rs, weight)

    def add_real_servers(
        self, key: ServiceKey, real_servers: Sequence[RealServerKey], weight: int
    ) -> list[KernelError | None]:
        """RealServerBatch: the adds in one send (ipvs_calls.py)."""
        return self._calls.add_dests(key, real_servers, weight)

    def set_real_server_weight(self, key: ServiceKey, rs: RealServerKey, weight: int) -> None:
        self._calls.set_dest(key, rs, weight)

    def delete_real_server(self, key: ServiceKey, rs: RealServerKey) -> None:
        with self._expiring():
            self._calls.delete_dest(key, rs)

    def flush_conntrack(self, key: ServiceKey, rs: RealServerKey) -> None:
        """Delete the conntrack entries sent to the virtual server and answered by this real
        server (plan/conntrack.py's rule), through the conntrack table's adapter. Nothing to
        do (and no error) when conntrack is not in use."""
        deleted = self._conntrack.delete_conntrack(self.conntrack_entries(key, rs))
        log.debug("conntrack entries deleted", extra=fields(vs=key, rs=rs, deleted=deleted))

    # --- more than IPVSKernel -------------------------------------------------------------
    def read_service_stats(self) -> dict[ServiceKey, ServiceStats]:
        """ServiceStatsReader: every virtual server's traffic counters, one dump."""
        return self._calls.read_service_stats()

    def dump(self) -> str:
        """The table in FakeKernel.dump()'s format, so lab tests can compare the two."""
        return table.dump(self)

    def get_timeouts(self) -> IPVSTimeouts:
        return self._calls.get_timeouts()

    def set_timeouts(self, tcp: int = 0, tcpfin: int = 0, udp: int = 0) -> None:
        """Set the IPVS connection timeouts in seconds; 0 leaves that one as it is."""
        self._calls.set_timeouts(tcp, tcpfin, udp)

    # dummy interface and its addresses
    def ensure_interface(self) -> int:
        """The dummy interface's index, creating the interface if it is missing."""
        return self._link.ensure()

    def bound_addresses(self) -> list[str]:
        """The addresses on the dummy interface (compressed form, sorted): the daemon owns
        the virtual servers on these."""
        return self._link.addresses()

    def interface_present(self) -> bool:
        """Whether the dummy interface exists (one rtnetlink lookup; the table guard's)."""
        return self._link.present()

    def bind_address(self, address: str) -> None:
        """Put address/32 (/128) on the dummy interface; nothing if it is there already."""
        self._link.bind(address)

    def unbind_address(self, address: str) -> None:
        """Remove address from the dummy interface; nothing if it is not there."""
        self._link.unbind(address)

    def address_in_use(self, address: str) -> bool:
        """Whether any virtual server in the kernel (any protocol or port) has this address,
        from the index (interface.AddressIndex), read from the kernel at first use."""
        if not self._index.loaded():
            self.list_virtual_servers()
        return self._index.in_use(address)

    def unbind_address_if_unused(self, address: str) -> bool:
        """Remove address from the dummy interface unless a virtual server still uses it;
        True if it was removed (or was not there)."""
        if self.address_in_use(address):
            return False
        self.unbind_address(address)
        return True

    def _unbind_if_unused_quietly(self, address: str) -> None:
        try:
            self.unbind_address_if_unused(address)
        except KernelError:  # a rollback: the original error matters more
            log.debug("address rollback failed", exc_info=True)

    # conntrack
    def conntrack_entries(self, key: ServiceKey, rs: RealServerKey) -> list[ConntrackEntry]:
        """The conntrack entries flush_conntrack deletes: one dump of the virtual server's
        protocol, family and port. A failure is the flush's (its operation in the error and
        the metric)."""
        try:
            entries = self._conntrack.list_conntrack(key.protocol, key.family == 6, key.port)
        except KernelError as exc:
            raise type(exc)(f"flush_conntrack {key} -> {rs}: {exc}", "flush_conntrack") from exc
        return real_server_entries(entries, key, rs)


# --- start-up and CLI helpers ---------------------------------------------------------------
def configure_host(
    tcp_timeout: int = 0,
    tcpfin_timeout: int = 0,
    udp_timeout: int = 0,
    *,
    kernel: NetlinkKernel | None = None,
    netns: str | None = None,
    strict_arp: bool = False,
) -> dict[str, str]:
    """Start-up host set-up: the IPVS sysctls (sysctl.wanted_sysctls, with strict ARP as
    kube-proxy's `ipvs.strictARP`) and the IPVS timeouts (0 leaves one as it is). Returns
    what changed, for the start-up log line."""
    changed = sysctl.apply_sysctls(
        sysctl.wanted_sysctls(strict_arp=strict_arp), netns=kernel.netns if kernel else netns
    )
    if tcp_timeout or tcpfin_timeout or udp_timeout:
        own = kernel is None
        k = kernel or NetlinkKernel(netns=netns, create_interface=False)
        try:
            before = k.get_timeouts()
            k.set_timeouts(tcp_timeout, tcpfin_timeout, udp_timeout)
            after = k.get_timeouts()
        finally:
            if own:
                k.close()
        for name in ("tcp", "tcpfin", "udp"):
            if getattr(before, name) != getattr(after, name):
                changed[f"ipvs.timeout.{name}"] = str(getattr(after, name))
    return changed


def read_host_statuses(netns: str | None = None) -> list[VirtualServerStatus]:
    """This host's (or netns's) whole IPVS table, every virtual server with its real
    servers, for `ipvsctl status`, through a kernel opened for it; touches nothing (no
    interface)."""
    with NetlinkKernel(netns=netns, create_interface=False) as kernel:
        return table.read_statuses(kernel)


_: type[IPVSKernel] = NetlinkKernel  # NetlinkKernel satisfies the interface
_stats: type[ServiceStatsReader] = NetlinkKernel
_batch: type[RealServerBatch] = NetlinkKernel

"""An in-memory IPVS with the kernel's error behaviour, an op log and a sorted dump.

Used by unit tests and by `ipvsctl plan`-style dry runs; the lab tests run the same
scenarios against the real kernel.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from ipvsctl.kernel.port import (
    ConntrackTable,
    IPVSKernel,
    KernelError,
    KernelExists,
    KernelNotFound,
    KernelUnavailable,
    RealServerBatch,
    add_each,
)
from ipvsctl.kernel.procfs.codec import kernel_address, scan_connections
from ipvsctl.kernel.table import format_table
from ipvsctl.kernel.wrappers import (
    FaultyKernel,
    add_rs_line,
    add_vs_line,
    del_rs_line,
    del_vs_line,
    flush_conntrack_line,
    set_rs_line,
    set_vs_line,
)
from ipvsctl.model import (
    ConnScan,
    Protocol,
    RealServerKey,
    RealServerStatus,
    ServiceKey,
    ServiceStats,
    VirtualServer,
    VirtualServerStatus,
)
from ipvsctl.model.conntrack import ConntrackEntry
from ipvsctl.model.ipvs import IPVS_SCHEDULERS
from ipvsctl.plan.conntrack import real_server_entries

__all__ = ["FakeKernel", "FaultyKernel"]  # FaultyKernel: wrappers.py


_NO_TRAFFIC = ServiceStats()  # frozen: one shared by every new virtual server


# slots: 100,000 of them in the benchmarks' table, a third the size of __dict__ objects
@dataclass(slots=True)
class _Dest:
    weight: int
    active: int = 0
    inactive: int = 0


@dataclass(slots=True)
class _Service:
    vs: VirtualServer
    dests: dict[RealServerKey, _Dest] = field(default_factory=dict)
    stats: ServiceStats = _NO_TRAFFIC  # replaced on traffic; gone with the service


class FakeKernel:
    """A stateful fake: state by ServiceKey, errors like the kernel's, every call logged."""

    def __init__(self) -> None:
        self.services: dict[ServiceKey, _Service] = {}
        self.bound: dict[str, int] = {}  # address on the dummy interface -> users
        self.ops: list[str] = []  # mutating calls, in order
        self.dumps = 0  # list_real_servers calls
        self.conntrack_flushes: list[tuple[ServiceKey, RealServerKey]] = []
        self.table_reads = 0  # read_real_servers calls
        # Connection entries as ip_vs_conn lines (`add_connection`); None: no such file.
        self.conn_lines: list[str] | None = []
        self.conn_reads = 0
        # The conntrack table (ConntrackTable); None: conntrack unavailable.
        self.conntrack: set[ConntrackEntry] | None = set()
        self.conntrack_dumps: list[tuple[Protocol, bool]] = []
        self.stats_reads = 0  # read_service_stats calls

    # --- test helpers -------------------------------------------------------------
    def set_connections(
        self, key: ServiceKey, rs: RealServerKey, active: int, inactive: int = 0
    ) -> None:
        dest = self.services[key].dests[rs]
        dest.active, dest.inactive = active, inactive

    def add_connection(
        self,
        key: ServiceKey,
        rs: RealServerKey,
        state: str,
        client_port: int = 40000,
        client: str | None = None,
    ) -> None:
        """One connection entry as the kernel's ip_vs_conn prints it (client_port 0: a
        persistence template). Counts are not changed: seed them with set_connections."""
        assert self.conn_lines is not None
        client = client or ("10.0.0.100" if ":" not in key.address else "fd01::100")
        self.conn_lines.append(
            f"{key.protocol.value:<3} {kernel_address(client)} {client_port:04X} "
            f"{kernel_address(key.address)} {key.port:04X} {kernel_address(rs.address)} "
            f"{rs.port:04X} {state:<11} {60:>7}\n"
        )

    def weight(self, key: ServiceKey, rs: RealServerKey) -> int | None:
        svc = self.services.get(key)
        dest = svc.dests.get(rs) if svc else None
        return dest.weight if dest else None

    def dump(self) -> str:
        """One sorted line per virtual and real server, like `ipvsadm -Ln` made stable
        (table.format_table: the real kernel's dump() prints the same)."""
        return format_table(
            VirtualServerStatus(
                self.services[key].vs,
                tuple(
                    RealServerStatus(rs, d.weight, d.active, d.inactive)
                    for rs, d in sorted(self.services[key].dests.items())
                ),
            )
            for key in sorted(self.services)
        )

    def take_ops(self) -> list[str]:
        ops, self.ops = self.ops, []
        return ops

    # --- IPVSKernel ---------------------------------------------------------------
    def list_virtual_servers(self) -> list[VirtualServer]:
        # in no particular order, as the kernel's dump (its hash order): here, insertion
        return [svc.vs for svc in self.services.values()]

    def list_real_servers(self, key: ServiceKey) -> list[RealServerStatus]:
        self.dumps += 1
        svc = self._service(key, "list_real_servers")
        return [
            RealServerStatus(rs, d.weight, d.active, d.inactive)
            for rs, d in sorted(svc.dests.items())
        ]

    def read_real_servers(
        self,
        keys: Collection[ServiceKey],
        only: Mapping[ServiceKey, Collection[RealServerKey]] | None = None,
    ) -> dict[ServiceKey, list[RealServerStatus] | None]:
        self.table_reads += 1
        return {
            k: [
                RealServerStatus(rs, d.weight, d.active, d.inactive)
                for rs, d in sorted(self.services[k].dests.items())
                if only is None or rs in only.get(k, ())
            ]
            if k in self.services
            else None
            for k in keys
        }

    def dump_real_servers(
        self,
        keys: Sequence[ServiceKey],
        only: Mapping[ServiceKey, Collection[RealServerKey]] | None = None,
    ) -> dict[ServiceKey, list[RealServerStatus] | KernelError | None]:
        out: dict[ServiceKey, list[RealServerStatus] | KernelError | None] = {}
        for k in keys:  # one dump each, as the kernel answers them (counted in `dumps`)
            try:
                found = self.list_real_servers(k)
            except KernelNotFound:
                out[k] = None
            except KernelError as exc:
                out[k] = exc
            else:
                out[k] = [s for s in found if only is None or s.key in only.get(k, ())]
        return out

    def read_connections(self, pairs: Collection[tuple[ServiceKey, RealServerKey]]) -> ConnScan:
        self.conn_reads += 1
        if self.conn_lines is None:
            raise KernelUnavailable("no /proc/net/ip_vs_conn", "read_ip_vs_conn")
        header = "Pro FromIP   FPrt ToIP     TPrt DestIP   DPrt State       Expires PEName PEData\n"
        return scan_connections([header, *self.conn_lines], pairs)

    def add_traffic(self, key: ServiceKey, traffic: ServiceStats) -> None:
        """Count traffic through a virtual server, as the kernel's counters would."""
        svc = self.services[key]
        svc.stats = svc.stats + traffic

    def read_service_stats(self) -> dict[ServiceKey, ServiceStats]:
        self.stats_reads += 1
        return {k: svc.stats for k, svc in self.services.items()}

    def add_virtual_server(self, vs: VirtualServer, bind_address: bool) -> None:
        if vs.scheduler not in IPVS_SCHEDULERS:
            raise KernelNotFound(f"unknown scheduler {vs.scheduler}", "add_virtual_server")
        if vs.key in self.services:
            raise KernelExists(f"{vs.key} exists", "add_virtual_server")
        self.services[vs.key] = _Service(vs)
        if bind_address:
            self.bound[vs.key.address] = self.bound.get(vs.key.address, 0) + 1
        self.ops.append(add_vs_line(vs))

    def update_virtual_server(self, vs: VirtualServer) -> None:
        if vs.scheduler not in IPVS_SCHEDULERS:
            raise KernelNotFound(f"unknown scheduler {vs.scheduler}", "update_virtual_server")
        self._service(vs.key, "update_virtual_server").vs = vs
        self.ops.append(set_vs_line(vs))

    def delete_virtual_server(self, key: ServiceKey, bind_address: bool) -> None:
        self._service(key, "delete_virtual_server")
        del self.services[key]
        if bind_address and key.address in self.bound:
            self.bound[key.address] -= 1
            if self.bound[key.address] <= 0:
                del self.bound[key.address]
        self.ops.append(del_vs_line(key))

    def add_real_server(self, key: ServiceKey, rs: RealServerKey, weight: int) -> None:
        svc = self._service(key, "add_real_server")
        if rs in svc.dests:
            raise KernelExists(f"{key} -> {rs} exists", "add_real_server")
        svc.dests[rs] = _Dest(weight)
        self.ops.append(add_rs_line(key, rs, weight))

    def add_real_servers(
        self, key: ServiceKey, real_servers: Sequence[RealServerKey], weight: int
    ) -> list[KernelError | None]:
        """RealServerBatch, as the netlink adapter's: an add each, each one's error."""
        return add_each(self, key, real_servers, weight)

    def set_real_server_weight(self, key: ServiceKey, rs: RealServerKey, weight: int) -> None:
        self._dest(key, rs, "set_real_server_weight").weight = weight
        self.ops.append(set_rs_line(key, rs, weight))

    def delete_real_server(self, key: ServiceKey, rs: RealServerKey) -> None:
        self._dest(key, rs, "delete_real_server")
        del self.services[key].dests[rs]
        self.ops.append(del_rs_line(key, rs))

    def flush_conntrack(self, key: ServiceKey, rs: RealServerKey) -> None:
        """As NetlinkKernel's: the real server's entries (plan/conntrack.py's rule) go."""
        self.conntrack_flushes.append((key, rs))
        self.ops.append(flush_conntrack_line(key, rs))
        if self.conntrack is not None:
            self.conntrack.difference_update(real_server_entries(self.conntrack, key, rs))

    # --- ConntrackTable -----------------------------------------------------------
    def list_conntrack(
        self, protocol: Protocol, ipv6: bool, port: int | None = None
    ) -> list[ConntrackEntry]:
        if self.conntrack is None:
            raise KernelUnavailable("no conntrack", "list_conntrack")
        self.conntrack_dumps.append((protocol, ipv6))
        return sorted(
            e
            for e in self.conntrack
            if e.protocol == protocol and e.ipv6 == ipv6 and (port is None or e.orig_dport == port)
        )

    def delete_conntrack(self, entries: Collection[ConntrackEntry]) -> int:
        if self.conntrack is None:
            raise KernelUnavailable("no conntrack", "delete_conntrack")
        found = [e for e in entries if e in self.conntrack]
        self.conntrack.difference_update(found)
        self.ops.extend(f"del-conntrack {e}" for e in sorted(found))
        return len(found)

    # --- internals ----------------------------------------------------------------
    def _service(self, key: ServiceKey, op: str) -> _Service:
        try:
            return self.services[key]
        except KeyError:
            raise KernelNotFound(f"no virtual server {key}", op) from None

    def _dest(self, key: ServiceKey, rs: RealServerKey, op: str) -> _Dest:
        try:
            return self._service(key, op).dests[rs]
        except KeyError:
            raise KernelNotFound(f"no real server {key} -> {rs}", op) from None


_: type[IPVSKernel] = FakeKernel  # FakeKernel satisfies the interface
_ct: type[ConntrackTable] = FakeKernel  # and the conntrack table the sweep reads
_batch: type[RealServerBatch] = FakeKernel  # and the batched adds the engine uses

"""IPVS state as the kernel holds it: virtual servers and their real servers."""

from __future__ import annotations

from dataclasses import dataclass, field

from ipvsctl.model.keys import RealServerKey, ServiceKey

# The scheduler flags, as the kernel's IP_VS_SVC_F_SCHED1..3 bits (ipvsadm's flag-1..3:
# sh-fallback/mh-fallback, sh-port/mh-port, flag-3 unused by today's schedulers).
SCHED_FLAG_1, SCHED_FLAG_2, SCHED_FLAG_3 = 0x08, 0x10, 0x20
SCHED_FLAGS_MASK = SCHED_FLAG_1 | SCHED_FLAG_2 | SCHED_FLAG_3
# The kernel's IPVS schedulers (ip_vs_*.c), by the names ipvsadm and the netlink API take.
IPVS_SCHEDULERS = frozenset(
    {"rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq", "fo", "ovf", "mh", "twos"}
)


# What ipvsadm calls the flags of the schedulers that read them.
_FLAG_WORDS = {"sh": ("sh-fallback", "sh-port"), "mh": ("mh-fallback", "mh-port")}


def sched_flag_words(scheduler: str, flags: int) -> list[str]:
    """The flags by ipvsadm's names for sh and mh (`mh-port`), flag-N otherwise."""
    words = _FLAG_WORDS.get(scheduler)
    names = sched_flag_names(flags)
    if words is None:
        return names
    return [words[int(n[-1]) - 1] if n[-1] in "12" else n for n in names]


def sched_flag_names(flags: int) -> list[str]:
    return [
        f"flag-{n}"
        for n, bit in enumerate((SCHED_FLAG_1, SCHED_FLAG_2, SCHED_FLAG_3), 1)
        if flags & bit
    ]


@dataclass(frozen=True, slots=True)
class VirtualServer:
    """The attributes of a virtual server that ipvsctl programs."""

    key: ServiceKey
    scheduler: str = "rr"
    persistent_timeout: int = 0  # seconds; 0 = no persistence
    sched_flags: int = 0  # SCHED_FLAG_* bits

    def __str__(self) -> str:
        persist = f" persistent {self.persistent_timeout}" if self.persistent_timeout else ""
        flags = f" {','.join(sched_flag_names(self.sched_flags))}" if self.sched_flags else ""
        return f"{self.key} {self.scheduler}{persist}{flags}"


@dataclass(frozen=True, slots=True)
class ServiceStats:
    """A virtual server's traffic counters as the kernel keeps them (struct ip_vs_kstats):
    connections scheduled, packets and bytes in (client to virtual server) and out. They
    start at 0 when the virtual server is created and go back to 0 if it is re-created."""

    conns: int = 0
    in_packets: int = 0
    out_packets: int = 0
    in_bytes: int = 0
    out_bytes: int = 0

    def __add__(self, other: ServiceStats) -> ServiceStats:
        return ServiceStats(
            self.conns + other.conns,
            self.in_packets + other.in_packets,
            self.out_packets + other.out_packets,
            self.in_bytes + other.in_bytes,
            self.out_bytes + other.out_bytes,
        )


@dataclass(frozen=True, slots=True)
class RealServerStatus:
    """One real server as read back from the kernel."""

    key: RealServerKey
    weight: int
    active_conns: int = 0
    inactive_conns: int = 0

    @property
    def connections(self) -> int:
        return self.active_conns + self.inactive_conns


@dataclass(frozen=True, slots=True)
class VirtualServerStatus:
    """One virtual server as read back from the kernel, with its real servers."""

    vs: VirtualServer
    real_servers: tuple[RealServerStatus, ...] = ()


@dataclass(slots=True)
class AppliedVirtualServer:
    """What ipvsctl last programmed (or found) for one virtual server: mutable bookkeeping."""

    vs: VirtualServer
    bind_address: bool
    weights: dict[RealServerKey, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ConnCounts:
    """A real server's TCP connections by what they can still do (`/proc/net/ip_vs_conn`):
    established carry data, closing (SYN, FIN_WAIT, CLOSE_WAIT, LAST_ACK) may still carry
    some, closed (TIME_WAIT, CLOSE) carry none and never hold a drain."""

    established: int = 0
    closing: int = 0
    closed: int = 0

    @property
    def open(self) -> int:
        return self.established + self.closing

    def to_json(self) -> dict[str, int]:
        return {"established": self.established, "closing": self.closing, "closed": self.closed}


# A (virtual server, real server) pair, as the connection table is read for it.
ConnKey = tuple[ServiceKey, RealServerKey]


@dataclass(slots=True)
class ConnScan:
    """What one pass over ip_vs_conn found for the wanted (virtual, real server) pairs, and
    the work it took (the lab asserts on these, not on time)."""

    counts: dict[ConnKey, ConnCounts] = field(default_factory=dict)
    lines: int = 0  # lines read
    matched: int = 0  # lines whose DestIP:DPrt is a wanted real server's (parsed)
    slow: int = 0  # lines not in the canonical layout (parsed to be sure)
    bad: int = 0  # lines naming a wanted real server that did not parse
    unattributed: int = 0  # TCP lines that parse neither way: could be anyone's

    @property
    def trustworthy(self) -> bool:
        """No line that might belong to a wanted real server went unread."""
        return self.unattributed == 0


@dataclass(slots=True)
class Restored:
    """One restore of what another program removed from the node's table (the table
    guard's, reconcile/table_guard.py): what came back (`ipvs`, `interface`), how many
    virtual servers, real servers and addresses, and how many could not."""

    what: list[str] = field(default_factory=list)
    virtual_servers: int = 0
    real_servers: int = 0
    addresses: int = 0
    failed: int = 0

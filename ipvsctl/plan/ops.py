"""Kernel operations, as values. The planner returns them; the reconciler applies them in
the fixed order they are produced: add VS, add/restore RS, drain VS, drain RS, retime
drains, delete RS, delete VS."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from ipvsctl.model import (
    DrainEntry,
    RealServerKey,
    ServiceKey,
    ServiceRef,
    VirtualServer,
    VirtualServerKind,
)


class DeletionReason(StrEnum):
    """Label values of ipvsctl_real_server_deletions_total."""

    DRAINED = "drained"  # connections reached zero
    DEADLINE = "deadline"  # deadline passed with connections left
    UDP = "udp"  # connectionless (UDP/SCTP): deleted at once
    POD_GONE = "pod_gone"  # its endpoint left every slice after being terminating
    # its virtual server was deleted at once with it (--service-drain-timeout 0, or found
    # with nothing that wants it at start-up)
    SERVICE_DELETED = "service_deleted"


@dataclass(frozen=True, slots=True)
class AddVirtualServer:
    vs: VirtualServer
    kind: VirtualServerKind
    service: ServiceRef | None

    def __str__(self) -> str:
        return f"add-vs {self.vs}"


@dataclass(frozen=True, slots=True)
class UpdateVirtualServer:
    vs: VirtualServer

    def __str__(self) -> str:
        return f"set-vs {self.vs}"


@dataclass(frozen=True, slots=True)
class DeleteVirtualServer:
    key: ServiceKey
    bind_address: bool
    real_servers: int  # how many it had, for the deletion counter

    def __str__(self) -> str:
        return f"del-vs {self.key}"


@dataclass(frozen=True, slots=True)
class DrainVirtualServer:
    """The virtual server left the wanted set of `service` but stays, address bound, until
    its last real server goes (each drained by a `DrainRealServer` or `RetimeDrain` with
    `vs_draining`). No kernel call of its own."""

    key: ServiceKey
    service: ServiceRef

    def __str__(self) -> str:
        return f"drain-vs {self.key} service {self.service}"


@dataclass(frozen=True, slots=True)
class AddRealServer:
    vs: ServiceKey
    rs: RealServerKey

    def __str__(self) -> str:
        return f"add-rs {self.vs} -> {self.rs}"


@dataclass(frozen=True, slots=True)
class RestoreRealServer:
    """Weight back to 1 in place (never delete and re-add: that resets its connections)."""

    vs: ServiceKey
    rs: RealServerKey

    def __str__(self) -> str:
        return f"restore-rs {self.vs} -> {self.rs}"


@dataclass(frozen=True, slots=True)
class DrainRealServer:
    """Weight 0 and into the drain queue."""

    entry: DrainEntry

    def __str__(self) -> str:
        e = self.entry
        return f"drain-rs {e.vs} -> {e.rs} reason {e.reason} deadline-from {e.deadline_source}"


@dataclass(frozen=True, slots=True)
class RetimeDrain:
    """A draining real server's bound changed (its endpoint left its slices, the
    annotation changed, ...): the queue takes the new entry; no kernel call."""

    entry: DrainEntry

    def __str__(self) -> str:
        e = self.entry
        return f"retime-rs {e.vs} -> {e.rs} reason {e.reason} deadline-from {e.deadline_source}"


@dataclass(frozen=True, slots=True)
class DeleteRealServer:
    vs: ServiceKey
    rs: RealServerKey
    reason: DeletionReason
    flush_conntrack: bool = False

    def __str__(self) -> str:
        flush = " +conntrack" if self.flush_conntrack else ""
        return f"del-rs {self.vs} -> {self.rs} reason {self.reason}{flush}"


@dataclass(frozen=True, slots=True)
class ForgetDrain:
    """A queued real server is already gone from the kernel: drop it from the queue."""

    vs: ServiceKey
    rs: RealServerKey

    def __str__(self) -> str:
        return f"forget-rs {self.vs} -> {self.rs}"


Op = (
    AddVirtualServer
    | UpdateVirtualServer
    | DeleteVirtualServer
    | DrainVirtualServer
    | AddRealServer
    | RestoreRealServer
    | DrainRealServer
    | RetimeDrain
    | DeleteRealServer
    | ForgetDrain
)

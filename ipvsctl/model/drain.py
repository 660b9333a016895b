"""The drain queue's entries: real servers at weight 0 waiting for their connections to end."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from ipvsctl.model.keys import PodRef, Protocol, RealServerKey, ServiceKey, ServiceRef


class DrainReason(StrEnum):
    """Why a real server is draining (shown in status)."""

    TERMINATING = "terminating"  # its endpoint is terminating (pod being deleted)
    # its endpoint is present but not used: not ready (and no KEP-1669 fallback), or left
    # out by a traffic policy or topology (another node's endpoint under Local, another zone)
    NOT_READY = "not_ready"
    REMOVED = "removed"  # its endpoint left the EndpointSlices
    ADOPTED = "adopted"  # found at weight 0 in the kernel at start-up, nothing wants it
    # its virtual server left the wanted set (Service deleted, port or address removed, type
    # changed): the virtual server drains with it
    VIRTUAL_SERVER_REMOVED = "vs_removed"


class DeadlineSource(StrEnum):
    """What bounds a drain (CONTRACT.md "Draining", the deadline order)."""

    ANNOTATION = "annotation"  # ipvsctl.io/drain-timeout on the Service, from `since`
    # Its endpoint is still listed as terminating: no deadline of its own (`deadline` is
    # infinite); its pod's lifetime bounds it. (A state file of the version that read pods
    # wrote this value with the pod's deletionTimestamp; it loads as this meaning.)
    POD = "pod"
    POD_GONE = "pod_gone"  # it left every slice after being terminating: a short grace
    DEFAULT = "default"  # --drain-timeout, from `since`
    # Its virtual server left the wanted set: the Service's last annotation, else
    # --service-drain-timeout, from when it left (kept if an earlier bound applied); fixed.
    VIRTUAL_SERVER = "virtual_server"


class VirtualServerDrainEvent(StrEnum):
    """What happened to a virtual server that left the wanted set (for the listeners that
    keep something per virtual server, such as the nftables elements)."""

    DRAINING = "draining"  # it stays until its last real server goes
    TAKEN_OVER = "taken_over"  # a Service claimed it again: live, its own listeners follow
    GONE = "gone"  # deleted with its last real server (or found gone)


NO_DEADLINE = math.inf  # the deadline of a drain its pod's lifetime bounds


@dataclass(frozen=True, slots=True)
class DrainEntry:
    vs: ServiceKey
    rs: RealServerKey
    service: ServiceRef | None
    reason: DrainReason
    since: float  # wall-clock seconds (survives restarts)
    deadline: float  # wall-clock seconds; NO_DEADLINE while its pod's lifetime bounds it
    deadline_source: DeadlineSource
    pod: PodRef | None = None  # the endpoint's targetRef (name and uid) when it had one
    # Its virtual server drains too (it left the wanted set of `service`): the virtual
    # server goes with its last real server. Every entry of such a virtual server has it.
    vs_draining: bool = False

    @property
    def key(self) -> tuple[ServiceKey, RealServerKey]:
        return (self.vs, self.rs)

    @property
    def has_deadline(self) -> bool:
        return self.deadline != NO_DEADLINE

    def with_deadline(self, deadline: float, source: DeadlineSource) -> DrainEntry:
        return replace(self, deadline=deadline, deadline_source=source)

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "protocol": self.vs.protocol.value,
            "vip": self.vs.address,
            "vport": self.vs.port,
            "address": self.rs.address,
            "port": self.rs.port,
            "service": str(self.service) if self.service else None,
            "reason": self.reason.value,
            "since": self.since,
            "deadline": self.deadline if self.has_deadline else None,
            "deadline_source": self.deadline_source.value,
            "pod": str(self.pod) if self.pod else None,
            "pod_uid": self.pod.uid if self.pod and self.pod.uid else None,
        }
        if self.vs_draining:  # only then: the files of earlier versions stay as they were
            d["vs_draining"] = True
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> DrainEntry:
        """Inverse of to_json; raises KeyError/ValueError on a malformed record."""
        return cls(
            vs=ServiceKey(Protocol(d["protocol"]), str(d["vip"]), int(d["vport"])),
            rs=RealServerKey(str(d["address"]), int(d["port"])),
            service=ServiceRef.parse(d["service"]) if d.get("service") else None,
            reason=DrainReason(d["reason"]),
            since=float(d["since"]),
            deadline=NO_DEADLINE if d.get("deadline") is None else float(d["deadline"]),
            deadline_source=DeadlineSource(d["deadline_source"]),
            pod=PodRef.parse(d["pod"], d.get("pod_uid") or "") if d.get("pod") else None,
            vs_draining=d.get("vs_draining") is True,
        )


@dataclass(frozen=True, slots=True)
class ConnectionsCut:
    """A deadline deleted a draining real server that still had established connections
    (CONTRACT.md "Events"): what the `ConnectionsCut` Event on its pod says."""

    pod: PodRef  # the endpoint's targetRef
    service: ServiceRef | None
    vs: ServiceKey
    rs: RealServerKey
    connections: int  # established (the kernel's ActiveConn) when it was deleted
    drained_for: float  # seconds from the drain's start to the deletion

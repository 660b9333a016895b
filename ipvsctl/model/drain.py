"""The drain queue's entries: real servers at weight 0 waiting for their connections to end."""

from __future__ import annotations

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


class DeadlineSource(StrEnum):
    ANNOTATION = "annotation"  # ipvsctl.io/drain-timeout on the Service
    POD = "pod"  # the pod's metadata.deletionTimestamp
    DEFAULT = "default"  # --drain-timeout


@dataclass(frozen=True, slots=True)
class DrainEntry:
    vs: ServiceKey
    rs: RealServerKey
    service: ServiceRef | None
    reason: DrainReason
    since: float  # wall-clock seconds (survives restarts)
    deadline: float  # wall-clock seconds
    deadline_source: DeadlineSource
    pod: PodRef | None = None

    @property
    def key(self) -> tuple[ServiceKey, RealServerKey]:
        return (self.vs, self.rs)

    def with_deadline(self, deadline: float, source: DeadlineSource) -> DrainEntry:
        return replace(self, deadline=deadline, deadline_source=source)

    def to_json(self) -> dict[str, Any]:
        return {
            "protocol": self.vs.protocol.value,
            "vip": self.vs.address,
            "vport": self.vs.port,
            "address": self.rs.address,
            "port": self.rs.port,
            "service": str(self.service) if self.service else None,
            "reason": self.reason.value,
            "since": self.since,
            "deadline": self.deadline,
            "deadline_source": self.deadline_source.value,
            "pod": str(self.pod) if self.pod else None,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> DrainEntry:
        """Inverse of to_json; raises KeyError/ValueError on a malformed record."""
        return cls(
            vs=ServiceKey(Protocol(d["protocol"]), str(d["vip"]), int(d["vport"])),
            rs=RealServerKey(str(d["address"]), int(d["port"])),
            service=ServiceRef.parse(d["service"]) if d.get("service") else None,
            reason=DrainReason(d["reason"]),
            since=float(d["since"]),
            deadline=float(d["deadline"]),
            deadline_source=DeadlineSource(d["deadline_source"]),
            pod=PodRef.parse(d["pod"]) if d.get("pod") else None,
        )

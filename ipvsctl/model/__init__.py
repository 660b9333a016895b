"""Plain values shared by every layer: IPVS keys, Kubernetes references, desired state.

No I/O and no third-party imports live here.
"""

from ipvsctl.model.desired import (
    DesiredService,
    DesiredVirtualServer,
    EndpointHints,
    EndpointInfo,
    NodeContext,
    VirtualServerKind,
)
from ipvsctl.model.drain import (
    NO_DEADLINE,
    ConnectionsCut,
    DeadlineSource,
    DrainEntry,
    DrainReason,
    VirtualServerDrainEvent,
)
from ipvsctl.model.ipvs import (
    AppliedVirtualServer,
    ConnCounts,
    ConnKey,
    ConnScan,
    RealServerStatus,
    Restored,
    ServiceStats,
    VirtualServer,
    VirtualServerStatus,
)
from ipvsctl.model.keys import (
    PodRef,
    Protocol,
    RealServerKey,
    ServiceKey,
    ServiceRef,
    family_of,
    normalize_ip,
)
from ipvsctl.model.queue import DrainQueue

__all__ = [
    "NO_DEADLINE",
    "AppliedVirtualServer",
    "ConnCounts",
    "ConnKey",
    "ConnScan",
    "ConnectionsCut",
    "DeadlineSource",
    "DesiredService",
    "DesiredVirtualServer",
    "DrainEntry",
    "DrainQueue",
    "DrainReason",
    "EndpointHints",
    "EndpointInfo",
    "NodeContext",
    "PodRef",
    "Protocol",
    "RealServerKey",
    "RealServerStatus",
    "Restored",
    "ServiceKey",
    "ServiceRef",
    "ServiceStats",
    "VirtualServer",
    "VirtualServerDrainEvent",
    "VirtualServerKind",
    "VirtualServerStatus",
    "family_of",
    "normalize_ip",
]

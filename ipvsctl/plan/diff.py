"""diff_service: the kernel operations that take one Service from what was applied to what
is desired. Pure: all inputs are values, the output is a list of ops in apply order."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ipvsctl.model import (
    AppliedVirtualServer,
    DeadlineSource,
    DesiredService,
    DrainEntry,
    DrainReason,
    EndpointInfo,
    PodRef,
    RealServerKey,
    ServiceKey,
    ServiceRef,
)
from ipvsctl.plan.ops import (
    AddRealServer,
    AddVirtualServer,
    DeleteRealServer,
    DeleteVirtualServer,
    DeletionReason,
    DrainRealServer,
    Op,
    RestoreRealServer,
    UpdateVirtualServer,
)


@dataclass(frozen=True, slots=True)
class DrainPolicy:
    """What a new drain entry's deadline depends on."""

    now: float  # wall clock
    default_timeout: float  # --drain-timeout
    pod_deadlines: Mapping[PodRef, float]  # pod -> metadata.deletionTimestamp


def drain_entry(
    vs: ServiceKey,
    rs: RealServerKey,
    service: ServiceRef | None,
    drain_timeout: float | None,
    meta: EndpointInfo | None,
    still_listed: bool,
    policy: DrainPolicy,
) -> DrainEntry:
    """CONTRACT.md "Draining": the annotation, else the pod's deletion deadline when the
    endpoint is terminating and its pod is known, else --drain-timeout."""
    pod = meta.pod if meta else None
    if meta is not None and meta.terminating:
        reason = DrainReason.TERMINATING
    elif still_listed:
        reason = DrainReason.NOT_READY
    else:
        reason = DrainReason.REMOVED
    if drain_timeout is not None:
        deadline, source = policy.now + drain_timeout, DeadlineSource.ANNOTATION
    elif reason is DrainReason.TERMINATING and pod is not None and pod in policy.pod_deadlines:
        deadline, source = policy.pod_deadlines[pod], DeadlineSource.POD
    else:
        deadline, source = policy.now + policy.default_timeout, DeadlineSource.DEFAULT
    return DrainEntry(vs, rs, service, reason, policy.now, deadline, source, pod)


def diff_service(
    ref: ServiceRef,
    desired: DesiredService | None,
    applied: Mapping[ServiceKey, AppliedVirtualServer],
    draining: Mapping[ServiceKey, Mapping[RealServerKey, DrainEntry]],
    policy: DrainPolicy,
    previous_endpoints: Mapping[str, EndpointInfo] | None = None,
) -> list[Op]:
    """Ops for one Service. `applied` holds only this Service's virtual servers; `draining`
    is the queue indexed by virtual server; `previous_endpoints` is what was known of
    endpoints before this change (a removed endpoint's pod is only known from there)."""
    wanted = desired.virtual_servers if desired else {}
    endpoints = desired.endpoints if desired else {}
    drain_timeout = desired.drain_timeout if desired else None
    previous_endpoints = previous_endpoints or {}

    add_vs: list[Op] = []
    add_rs: list[Op] = []
    drain: list[Op] = []
    delete_rs: list[Op] = []
    delete_vs: list[Op] = []

    for key in sorted(wanted.keys() | applied.keys()):
        want = wanted.get(key)
        have = applied.get(key)
        if want is None:
            assert have is not None
            delete_vs.append(DeleteVirtualServer(key, have.bind_address, len(have.weights)))
            continue
        if have is None:
            add_vs.append(AddVirtualServer(want.vs, want.kind, ref))
            add_rs.extend(AddRealServer(key, rs) for rs in sorted(want.real_servers))
            continue
        if have.vs != want.vs:
            add_vs.append(UpdateVirtualServer(want.vs))
        queued = draining.get(key, {})
        for rs in sorted(want.real_servers):
            weight = have.weights.get(rs)
            if weight is None:
                add_rs.append(AddRealServer(key, rs))
            elif weight != 1 or rs in queued:
                add_rs.append(RestoreRealServer(key, rs))
        for rs in sorted(have.weights.keys() - want.real_servers):
            if rs in queued:
                continue  # already draining; the drain check decides when it goes
            if key.protocol.connectionless:
                delete_rs.append(DeleteRealServer(key, rs, DeletionReason.UDP, True))
                continue
            meta = endpoints.get(rs.address)
            still_listed = meta is not None
            if meta is None:
                meta = previous_endpoints.get(rs.address)
            drain.append(
                DrainRealServer(
                    drain_entry(key, rs, ref, drain_timeout, meta, still_listed, policy)
                )
            )
    return add_vs + add_rs + drain + delete_rs + delete_vs

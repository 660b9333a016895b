"""diff_service: the kernel operations that take one Service from what was applied to what
is desired. Pure: all inputs are values, the output is a list of ops in apply order."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace

from ipvsctl.model import (
    NO_DEADLINE,
    AppliedVirtualServer,
    DeadlineSource,
    DesiredService,
    DrainEntry,
    DrainReason,
    EndpointInfo,
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
    DrainVirtualServer,
    Op,
    RestoreRealServer,
    RetimeDrain,
    UpdateVirtualServer,
)

# CONTRACT.md "Draining", rule 3: "a few seconds". The EndpointSlice controller's re-pack
# writes the two slices within one sync (milliseconds apart); watch delivery and a
# daemon's loop add at most a second or two.
POD_GONE_GRACE = 5.0


@dataclass(frozen=True, slots=True)
class DrainPolicy:
    """What a drain's deadline depends on besides its endpoint."""

    now: float  # wall clock
    default_timeout: float  # --drain-timeout
    # An endpoint that left every slice after being terminating goes this long after it
    # left: long enough that a slice re-pack (the endpoint deleted from one slice, added to
    # another, in two events) is not mistaken for its pod being gone.
    pod_gone_grace: float = POD_GONE_GRACE
    # --service-drain-timeout: the longest drain of a virtual server that leaves the wanted
    # set (the Service's annotation first); 0: deleted at once. The engine's default is 0
    # (its tests about deletion stay as they were); the CLI's is 30 (CONTRACT.md).
    service_drain_timeout: float = 0.0


def same_endpoint(entry: DrainEntry, listed: EndpointInfo) -> bool:
    """Whether the endpoint listed at a draining real server's address is the one that
    drains (by its targetRef's name and uid; without a targetRef, the address is all there
    is to go by)."""
    if entry.pod is None or listed.pod is None:
        return True
    return entry.pod.same_pod(listed.pod)


def drain_bound(
    entry: DrainEntry,
    drain_timeout: float | None,
    listed: EndpointInfo | None,
    policy: DrainPolicy,
) -> DrainEntry:
    """CONTRACT.md "Draining", the deadline order, for a drain as its endpoint is listed
    now (`listed`: the endpoint at its address in the Service's slices, None if none):
    1. the annotation (`drain_timeout`), from when the drain began;
    2. its endpoint still listed as terminating: no deadline (its pod's lifetime bounds it);
    3. it was terminating and is listed no more (or another pod has its address): the pod
       is gone, `pod_gone_grace` from when that was first seen;
    4. else --drain-timeout from when the drain began.
    A drain its virtual server's removal bounded (`DeadlineSource.VIRTUAL_SERVER`) keeps
    that bound, whoever takes the virtual server over. Returns `entry` itself when nothing
    changes."""
    if entry.deadline_source is DeadlineSource.VIRTUAL_SERVER:
        return entry
    listed_here = listed is not None and same_endpoint(entry, listed)
    reason = entry.reason
    if listed_here and listed is not None and listed.terminating:
        reason = DrainReason.TERMINATING  # a not-ready endpoint whose pod is now deleted
    if drain_timeout is not None:
        deadline, source = entry.since + drain_timeout, DeadlineSource.ANNOTATION
    elif listed_here and reason is DrainReason.TERMINATING:
        deadline, source = NO_DEADLINE, DeadlineSource.POD
    elif reason is DrainReason.TERMINATING and not listed_here:
        deadline, source = policy.now + policy.pod_gone_grace, DeadlineSource.POD_GONE
    else:
        deadline, source = entry.since + policy.default_timeout, DeadlineSource.DEFAULT
    if source is entry.deadline_source:
        # A deadline once set stays (the queue keeps its deadlines across a restart with
        # another --drain-timeout; the grace runs from when the pod was first seen gone).
        deadline = entry.deadline
    if (deadline, source, reason) == (entry.deadline, entry.deadline_source, entry.reason):
        return entry
    return replace(entry, reason=reason, deadline=deadline, deadline_source=source)


def drain_entry(
    vs: ServiceKey,
    rs: RealServerKey,
    service: ServiceRef | None,
    drain_timeout: float | None,
    meta: EndpointInfo | None,
    still_listed: bool,
    policy: DrainPolicy,
) -> DrainEntry:
    """A new drain: `meta` is its endpoint as listed now (`still_listed`) or as it was
    last listed; its bound is `drain_bound`'s."""
    if meta is not None and meta.terminating:
        reason = DrainReason.TERMINATING
    elif still_listed:
        reason = DrainReason.NOT_READY
    else:
        reason = DrainReason.REMOVED
    entry = DrainEntry(
        vs,
        rs,
        service,
        reason,
        policy.now,
        policy.now + policy.default_timeout,
        DeadlineSource.DEFAULT,
        meta.pod if meta else None,
    )
    return drain_bound(entry, drain_timeout, meta if still_listed else None, policy)


def virtual_server_drain(
    entry: DrainEntry | None,
    vs: ServiceKey,
    rs: RealServerKey,
    service: ServiceRef,
    bound: float,
    meta: EndpointInfo | None,
    policy: DrainPolicy,
) -> DrainEntry:
    """A real server of a virtual server that left the wanted set (CONTRACT.md "Draining"):
    bounded by `bound` (the Service's last annotation, else --service-drain-timeout) from
    now; one already draining (`entry`, from a rollout) keeps its deadline if earlier."""
    deadline = policy.now + bound
    if entry is None:
        return DrainEntry(
            vs,
            rs,
            service,
            DrainReason.VIRTUAL_SERVER_REMOVED,
            policy.now,
            deadline,
            DeadlineSource.VIRTUAL_SERVER,
            meta.pod if meta else None,
            vs_draining=True,
        )
    if entry.deadline <= deadline:
        return replace(entry, service=entry.service or service, vs_draining=True)
    return replace(
        entry,
        service=entry.service or service,
        deadline=deadline,
        deadline_source=DeadlineSource.VIRTUAL_SERVER,
        vs_draining=True,
    )


def diff_service(
    ref: ServiceRef,
    desired: DesiredService | None,
    applied: Mapping[ServiceKey, AppliedVirtualServer],
    draining: Mapping[ServiceKey, Mapping[RealServerKey, DrainEntry]],
    policy: DrainPolicy,
    previous_endpoints: Mapping[str, EndpointInfo] | None = None,
    draining_vs: Collection[ServiceKey] = (),
    previous_drain_timeout: float | None = None,
) -> list[Op]:
    """Ops for one Service. `applied` holds only this Service's virtual servers; `draining`
    is the queue indexed by virtual server; `previous_endpoints` is what was known of
    endpoints before this change (a removed endpoint's pod is only known from there).
    A real server already draining keeps draining; its bound follows its endpoint
    (`drain_bound`: a `RetimeDrain` when it changes).
    `draining_vs`: those of `applied` that already drain (they left the wanted set
    earlier); `previous_drain_timeout`: the annotation the Service had before this change
    (a deleted Service's virtual servers drain by it)."""
    wanted = desired.virtual_servers if desired else {}
    endpoints = desired.endpoints if desired else {}
    drain_timeout = desired.drain_timeout if desired else None
    previous_endpoints = previous_endpoints or {}
    vs_bound = drain_timeout if desired else previous_drain_timeout
    if vs_bound is None:
        vs_bound = policy.service_drain_timeout

    add_vs: list[Op] = []
    add_rs: list[Op] = []
    drain_vs: list[Op] = []
    drain: list[Op] = []
    retime: list[Op] = []
    delete_rs: list[Op] = []
    delete_vs: list[Op] = []

    for key in sorted(wanted.keys() | applied.keys()):
        want = wanted.get(key)
        have = applied.get(key)
        if want is None:
            assert have is not None
            queued = draining.get(key, {})
            if key not in draining_vs and (policy.service_drain_timeout <= 0 or not have.weights):
                delete_vs.append(DeleteVirtualServer(key, have.bind_address, len(have.weights)))
                continue
            if not have.weights:  # a draining virtual server goes with its last real server
                delete_vs.append(DeleteVirtualServer(key, have.bind_address, 0))
                continue
            if key.protocol.connectionless:  # as its real servers: at once, conntrack too
                delete_rs.extend(
                    DeleteRealServer(key, rs, DeletionReason.UDP, True)
                    for rs in sorted(have.weights)
                )
                delete_vs.append(DeleteVirtualServer(key, have.bind_address, 0))
                continue
            if key not in draining_vs:
                drain_vs.append(DrainVirtualServer(key, ref))
            for rs in sorted(have.weights):
                entry = queued.get(rs)
                if entry is not None and entry.vs_draining:
                    continue  # its bound was set when the virtual server began to drain
                meta = endpoints.get(rs.address) or previous_endpoints.get(rs.address)
                new = virtual_server_drain(entry, key, rs, ref, vs_bound, meta, policy)
                if entry is None:
                    drain.append(DrainRealServer(new))
                elif new != entry:
                    retime.append(RetimeDrain(new))
            continue
        if have is None:
            add_vs.append(AddVirtualServer(want.vs, want.kind, ref))
            # real_servers is kept in RealServerKey's order (plan/desired.py): no sort here
            add_rs.extend(AddRealServer(key, rs) for rs in want.real_servers)
            continue
        if have.vs != want.vs:
            add_vs.append(UpdateVirtualServer(want.vs))
        queued = draining.get(key, {})
        for rs in want.real_servers:
            weight = have.weights.get(rs)
            if weight is None:
                add_rs.append(AddRealServer(key, rs))
            elif weight != 1 or rs in queued:
                add_rs.append(RestoreRealServer(key, rs))
        for rs in sorted(have.weights.keys() - want.real_servers):
            entry = queued.get(rs)
            if entry is not None:  # already draining: the drain check decides when it goes
                new = drain_bound(entry, drain_timeout, endpoints.get(rs.address), policy)
                if new is not entry:
                    retime.append(RetimeDrain(new))
                continue
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
    return add_vs + add_rs + drain_vs + drain + retime + delete_rs + delete_vs

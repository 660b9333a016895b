"""Start-up adoption: what the kernel holds becomes the applied state before the first diff.

As Cilium's ResetAndRestore, a restart takes over the table in place rather than rebuilding
it, so no connection is disturbed: every virtual server a Service wants is adopted with its
real servers as they are; real servers at weight 0 that no Service wants are adopted into
the drain queue (with their persisted deadline when the state file has one), never deleted
abruptly. An owned virtual server nobody wants (its Service deleted, a port or address
removed while the daemon was down, or its state file lost) drains as a deleted Service's
when it has real servers (CONTRACT.md "Draining": a restart never cuts a connection a
running daemon would have let finish), under a stand-in Service (`orphan_service`); only
empty ones, or all with `--service-drain-timeout 0`, are returned as orphans for the caller
to delete. The first diff then works from this state like any other.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, replace

from ipvsctl.kernel.port import IPVSKernel
from ipvsctl.kernel.table import read_real_servers
from ipvsctl.model import (
    DeadlineSource,
    DesiredService,
    DrainEntry,
    DrainReason,
    RealServerKey,
    RealServerStatus,
    ServiceKey,
    ServiceRef,
    VirtualServer,
)
from ipvsctl.obs.logging import fields
from ipvsctl.plan.desired import binds_address
from ipvsctl.plan.ownership import orphan_service
from ipvsctl.reconcile.applied import AppliedState
from ipvsctl.reconcile.termination import Terminations

log = logging.getLogger("ipvsctl.engine")

Observed = dict[ServiceKey, tuple[VirtualServer, list[RealServerStatus]]]


@dataclass(frozen=True, slots=True)
class Orphan:
    key: ServiceKey
    real_servers: int


def read_ours(
    kernel: IPVSKernel,
    wanted: Collection[ServiceKey],
    owned: Callable[[ServiceKey], bool],
    may_take_over: Callable[[ServiceKey], bool] = lambda key: True,
) -> Observed:
    """The kernel's virtual servers that are ours, with their real servers: what sits on our
    addresses, and what we want that another Kubernetes proxy made (kube-router's VIPs live
    on its own interface; taking them over in place keeps their connections). Anything
    else in the table is left alone: a wanted one of another tool's is found again by the
    first add, and skipped as a conflict."""
    ours = [
        vs
        for vs in kernel.list_virtual_servers()
        if owned(vs.key) or (vs.key in wanted and may_take_over(vs.key))
    ]
    # one /proc/net/ip_vs read (a restart over 10,000 Services made 10,000 dumps)
    dests = read_real_servers(kernel, [vs.key for vs in ours])
    return {vs.key: (vs, dests[vs.key]) for vs in ours if vs.key in dests}


def adopt(
    observed: Observed,
    built: Mapping[ServiceRef, DesiredService | None],
    state: AppliedState,
    drains: Terminations,
    *,
    restored: Iterable[DrainEntry],
    now: float,
    drain_timeout: float,
    node_ips: Collection[str],
    service_drain_timeout: float = 0.0,
) -> list[Orphan]:
    """Fill `state` and `drains` from the kernel. `built` is every Service's desired state
    (conflicts resolved); its owners are already recorded in `state.owner`. Returns the
    orphans to delete at once."""
    wanted_rs: dict[ServiceKey, frozenset[RealServerKey]] = {}
    for ref, desired in built.items():
        if desired is None:
            continue
        for key, dvs in desired.virtual_servers.items():
            wanted_rs[key] = frozenset(dvs.real_servers)  # tested per destination below
            if key in observed:
                vs, dests = observed[key]
                state.add(
                    ref,
                    vs,
                    binds_address(dvs.kind, key.address, node_ips),
                    {d.key: d.weight for d in dests},
                )

    by_key = {e.key: e for e in restored}
    live = set(wanted_rs)
    # Virtual servers that were draining (their Service deleted, a port or address gone):
    # adopted as the deleted Service's, never orphans; a Service that claims one now has
    # it already (above), and its real servers drain on as any others.
    draining: dict[ServiceKey, ServiceRef] = {}
    for e in by_key.values():
        if e.vs_draining and e.service is not None and e.vs in observed and e.vs not in live:
            draining.setdefault(e.vs, e.service)
    for key, service in sorted(draining.items()):
        vs, dests = observed[key]
        state.add(service, vs, key.address not in node_ips, {d.key: d.weight for d in dests})
        log.info("draining virtual server adopted", extra=fields(service=service, vs=key))
    # Orphans with real servers drain too, each under its stand-in Service: the first diff
    # (its Service is deleted) turns its live real servers to weight 0 with the bound of
    # a deleted Service's, from now.
    if service_drain_timeout > 0:
        for key in sorted(observed.keys() - wanted_rs.keys() - draining.keys()):
            vs, dests = observed[key]
            if not dests:
                continue
            service = orphan_service(key)
            draining[key] = service
            state.add(service, vs, key.address not in node_ips, {d.key: d.weight for d in dests})
            drains.drain_virtual_server(key, service)
            log.warning(
                "virtual server nobody wants drains",
                extra=fields(vs=key, real_servers=len(dests), bound=service_drain_timeout),
            )
    wanted_rs.update((key, frozenset()) for key in draining)
    for key, (_vs, dests) in observed.items():
        for d in dests:
            if d.weight != 0 or d.key in wanted_rs.get(key, frozenset()):
                continue
            entry = by_key.get((key, d.key))
            if entry is not None and entry.vs_draining and key not in draining:
                entry = replace(entry, vs_draining=False)  # taken over while we were away
            if entry is None:
                entry = DrainEntry(
                    key,
                    d.key,
                    state.owner.get(key),
                    DrainReason.ADOPTED,
                    now,
                    now + drain_timeout,
                    DeadlineSource.DEFAULT,
                )
            drains.add(entry)
            log.info(
                "drain adopted",
                extra=fields(
                    vs=key,
                    rs=d.key,
                    reason=entry.reason,
                    deadline_in=round(entry.deadline - now, 3) if entry.has_deadline else None,
                    deadline_from=entry.deadline_source,
                ),
            )
    return [
        Orphan(key, len(observed[key][1])) for key in sorted(observed.keys() - wanted_rs.keys())
    ]

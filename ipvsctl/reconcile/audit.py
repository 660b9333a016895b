"""The drift audit: re-read the kernel slowly and put right what differs from what was
applied (another tool, an operator with ipvsadm, a kernel that lost an entry).

Spread over steps (`batch` virtual servers each) so a large table never causes a burst. A
step is a background read (`paced.py`), the reads off the loop's lock: `snapshot` (under
the lock: what to read), `read` (kernel reads only), `apply` (under the lock). A reading
taken while anything
was applied is dropped whole (it could show a change in flight as drift); the same step is
read again next time. Repairs are made by marking the Service dirty (its next sync diffs
against the corrected applied state); an applied virtual server gone from the kernel is put
back first by the table guard's restore (`put_back`), as applied, draining real servers and
all. An owned virtual server nobody wants drains as a
deleted Service's when it has real servers (under its stand-in Service, as at start-up:
`adopt.py`), and is deleted when it has none or with `--service-drain-timeout 0`.

A round's start compares every virtual server with the applied state; that comparison is
made in the read too, off the lock, on the live state (optimistically, as a seqlock reader:
the loop may change the state meanwhile, and then `changed` moved and the reading is
dropped at `apply`), so the lock is held for the differences only, not for a walk of 10,000
virtual servers (up to ~30 ms at 1,000 under emulation). The read gives way to the loop's
events every few dozen virtual servers (`give_way`, `events_first.py`): a change does not
wait for the walk.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from itertools import islice

from ipvsctl.kernel.port import IPVSKernel, KernelError, KernelNotFound
from ipvsctl.model import RealServerKey, ServiceKey, ServiceRef, VirtualServer
from ipvsctl.model.keys import service_order
from ipvsctl.obs.logging import fields
from ipvsctl.obs.metrics import Metrics
from ipvsctl.plan.ownership import orphan_service
from ipvsctl.reconcile.applied import AppliedState
from ipvsctl.reconcile.apply import Applier
from ipvsctl.reconcile.termination import Terminations

log = logging.getLogger("ipvsctl.engine")

# Items between two give-way points: ~20-60 us of the read's Python each on the host.
LISTED_PER_GIVE_WAY = 256  # kernel virtual servers put in the reading's map
SERVICES_PER_GIVE_WAY = 32  # Services whose applied virtual servers are compared


@dataclass(frozen=True, slots=True)
class AuditPlan:
    changed: tuple[int, int]  # Auditor.changed() when planned
    full: bool  # a new round: the virtual servers are read too
    keys: list[ServiceKey]  # virtual servers whose real servers are read


@dataclass(frozen=True, slots=True)
class VirtualServerDrift:
    """The virtual servers the kernel holds against those applied (found off the lock)."""

    missing: list[tuple[ServiceRef, ServiceKey]]  # applied, not in the kernel
    changed: list[tuple[ServiceRef, ServiceKey, VirtualServer]]  # as the kernel holds it
    unknown: list[VirtualServer]  # in the kernel, ours, applied for no Service


@dataclass(slots=True)
class AuditReading:
    plan: AuditPlan
    virtual_servers: dict[ServiceKey, VirtualServer] | None = None  # None: not read
    real_servers: dict[ServiceKey, dict[RealServerKey, int]] = field(default_factory=dict)
    # None: not compared (not a round start, not read, or the state moved under the walk)
    drift: VirtualServerDrift | None = None
    # A round start's keys to read, last first, listed with the walk (off the lock)
    cursor: list[ServiceKey] | None = None


@dataclass(slots=True)
class Findings:
    found: int = 0  # differences
    dirty: set[ServiceRef] = field(default_factory=set)  # Services to sync again


class Auditor:
    def __init__(
        self,
        kernel: IPVSKernel,
        state: AppliedState,
        drains: Terminations,
        applier: Applier,
        metrics: Metrics,
        owned: Callable[[ServiceKey], bool],
        *,
        batch: int,
        ready: Callable[[], bool],
        on_repair: Callable[[set[ServiceRef]], None],
        put_back: Callable[[list[ServiceKey]], Collection[ServiceKey]],
        give_way: Callable[[], None] = lambda: None,
        service_drain_timeout: Callable[[], float] = lambda: 0.0,
        node_ips: Callable[[], Collection[str]] = lambda: (),
    ) -> None:
        self.kernel = kernel
        self.state = state
        self.drains = drains
        self.applier = applier
        self.metrics = metrics
        self.owned = owned
        self.batch = batch  # virtual servers whose real servers a step reads
        self.ready = ready  # the first sync is done: there is an applied state to audit
        self.on_repair = on_repair  # differences found: these Services to sync again
        self.give_way = give_way  # called in the read's loops: events first
        self.service_drain_timeout = service_drain_timeout  # an orphan's bound; 0: deleted
        self.node_ips = node_ips  # an orphan's address on one of these stays bound
        # Applied virtual servers gone from the kernel: the table guard's restore (another
        # program flushed the table; the dump saw it first), returning those put back.
        self.put_back = put_back
        self._cursor: list[ServiceKey] = []  # the round's keys still to read, last first
        # Applied virtual servers compared with a kernel dump, ever: the walk's work, which
        # belongs off the loop's lock (the cost tests read it around each part of a step).
        self.compared = 0

    def changed(self) -> tuple[int, int]:
        """Moves whenever what was applied (or the queue) may have changed."""
        return (self.state.mutations, self.drains.queue.version)

    def snapshot(self) -> AuditPlan | None:
        if not self.ready():
            return None
        batch = self.batch
        if not self._cursor:  # a new round: the virtual servers, then the first batch
            # No order is needed, only every key once per round: no sort under the loop's
            # lock (sorting 10,000 keys twice per round was 70 ms holding it).
            return AuditPlan(self.changed(), True, list(islice(self.state.owner, batch)))
        return AuditPlan(self.changed(), False, self._cursor[-batch:][::-1])

    def read(self, plan: AuditPlan) -> AuditReading:
        reading = AuditReading(plan)
        if plan.full:
            try:
                listed = self.kernel.list_virtual_servers()
            except KernelError as exc:
                self.metrics.netlink_errors.labels(exc.operation or "list_virtual_servers").inc()
            else:
                reading.virtual_servers = in_kernel = {}
                for i in range(0, len(listed), LISTED_PER_GIVE_WAY):
                    self.give_way()
                    in_kernel.update({vs.key: vs for vs in listed[i : i + LISTED_PER_GIVE_WAY]})
                reading.drift = self._compare(in_kernel)
                if reading.drift is not None:
                    reading.cursor = self._round_keys()
                    if reading.cursor is None:
                        reading.drift = None  # the state moved: read the round's start again
        for key in plan.keys:
            self.give_way()
            try:
                reading.real_servers[key] = {
                    s.key: s.weight for s in self.kernel.list_real_servers(key)
                }
            except KernelNotFound:
                pass  # the virtual server check of the next round sees it
            except KernelError as exc:
                self.metrics.netlink_errors.labels(exc.operation or "list_real_servers").inc()
        return reading

    def apply(self, reading: AuditReading) -> Findings:
        out = Findings()
        if reading.plan.changed != self.changed():
            return out
        if reading.plan.full:
            if reading.virtual_servers is not None and reading.drift is None:
                return out  # the walk met a change: read the round's start again
            if reading.drift is not None:
                self._repair(reading.drift, out)
            # listed in the read, the state unchanged since (else dropped above); under the
            # lock only when the dump failed
            self._cursor = (
                reading.cursor if reading.cursor is not None else list(self.state.owner)[::-1]
            )
        for key in reading.plan.keys:
            if self._cursor and self._cursor[-1] == key:
                self._cursor.pop()
            observed = reading.real_servers.get(key)
            if observed is not None:
                self._real_servers(key, observed, out)
        if out.found:
            self.state.mutations += 1
            self.on_repair(out.dirty)
        return out

    def _compare(self, in_kernel: dict[ServiceKey, VirtualServer]) -> VirtualServerDrift | None:
        """Off the lock, on the live state: what differs. None when the loop changed the
        state under the walk (the dicts then refuse to iterate); any other change shows
        in `changed()` and drops the reading at apply."""
        missing: list[tuple[ServiceRef, ServiceKey]] = []
        changed: list[tuple[ServiceRef, ServiceKey, VirtualServer]] = []
        give_way = self.give_way
        try:
            for n, (ref, states) in enumerate(self.state.by_service.items()):
                if not n % SERVICES_PER_GIVE_WAY:
                    give_way()  # the loop may change the state meanwhile: see above
                self.compared += len(states)
                for key, applied in states.items():
                    vs = in_kernel.get(key)
                    if vs is None:
                        missing.append((ref, key))
                    elif vs != applied.vs:
                        changed.append((ref, key, vs))
            # A loop, not `keys() - keys()`: a set difference of 20,000 keys is one C call
            # (~2-4 ms holding the GIL); lookups only, so the loop's changes cannot break it.
            owner, owned = self.state.owner, self.owned
            unknown = []
            for n, key in enumerate(in_kernel):
                if not n % LISTED_PER_GIVE_WAY:
                    give_way()
                if key not in owner and owned(key):
                    unknown.append(in_kernel[key])
        except RuntimeError:  # "dictionary changed size during iteration"
            return None
        unknown.sort(key=lambda vs: service_order(vs.key))
        return VirtualServerDrift(missing, changed, unknown)

    def _round_keys(self) -> list[ServiceKey] | None:
        """Off the lock: every applied key, last first (a round's cursor); None when the loop
        changed the owners meanwhile."""
        try:
            return list(self.state.owner)[::-1]
        except RuntimeError:  # "dictionary changed size during iteration"
            return None

    def _repair(self, drift: VirtualServerDrift, out: Findings) -> None:
        """Under the lock, the state unchanged since the walk: O(the differences)."""
        back = self.put_back([key for _, key in drift.missing]) if drift.missing else ()
        for ref, key in drift.missing:
            self._drift(out, "virtual_server_missing", ref, key)
            if key in back:
                continue  # as applied: real servers at their weights, drains kept
            if key in self.drains.draining_virtual_servers:
                # A draining one gone: nothing is left to drain or to put back.
                self.applier.forget_vs(ref, key, 0)
                continue
            self.state.forget(ref, key, keep_owner=True)
            self.drains.remove_vs(key)
        for ref, key, vs in drift.changed:
            applied = self.state.get(ref, key)
            if applied is not None:
                self._drift(out, "virtual_server_changed", ref, key)
                applied.vs = vs
        for vs in drift.unknown:
            self._drift(out, "virtual_server_unknown", None, vs.key)
            self._orphan(vs, out)

    def _real_servers(
        self, key: ServiceKey, observed: dict[RealServerKey, int], out: Findings
    ) -> None:
        ref = self.state.owner.get(key)
        applied = self.state.get(ref, key) if ref else None
        if applied is None:
            return
        queued = self.drains.queue.for_vs(key)
        for rs in sorted(applied.weights.keys() | observed.keys()):
            if rs in queued:
                if rs not in observed:
                    self.drains.remove(key, rs)
                    self.state.set_weight(applied, rs, None)
                    self.applier.finish_vs_drain(ref, key)
                continue  # draining real servers are the drain check's business
            if applied.weights.get(rs) != observed.get(rs):
                self._drift(out, "real_server_changed", ref, key, rs)
                self.state.set_weight(applied, rs, observed.get(rs))

    def _drift(
        self,
        out: Findings,
        kind: str,
        ref: ServiceRef | None,
        key: ServiceKey,
        rs: RealServerKey | None = None,
    ) -> None:
        self.metrics.drift_repairs.labels(kind).inc()
        log.warning("kernel drift repaired", extra=fields(kind=kind, service=ref, vs=key, rs=rs))
        out.found += 1
        if ref is not None:
            out.dirty.add(ref)

    def _orphan(self, vs: VirtualServer, out: Findings) -> None:
        """An owned virtual server no Service holds (its start-up deletion failed, a tool
        made it, or its Service went while nothing applied it): one read of its real
        servers under the lock, as at start-up; with real servers it drains as a deleted
        Service's (its stand-in's sync turns them to weight 0), else it goes."""
        key = vs.key
        try:
            dests = self.kernel.list_real_servers(key)
        except KernelNotFound:
            return  # gone meanwhile
        except KernelError:
            dests = []  # the deletion that follows reports the kernel's trouble
        bound = self.service_drain_timeout()
        if dests and bound > 0:
            service = orphan_service(key)
            bind = key.address not in self.node_ips()
            self.state.add(service, vs, bind, {d.key: d.weight for d in dests})
            self.drains.drain_virtual_server(key, service)
            out.dirty.add(service)
            log.warning(
                "virtual server nobody wants drains",
                extra=fields(vs=key, real_servers=len(dests), bound=bound),
            )
            return
        self.applier.delete_orphan(key, len(dests))

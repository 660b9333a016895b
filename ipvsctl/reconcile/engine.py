"""The engine: source events in, kernel operations out, one Service at a time.

A thin facade over parts split by the state each owns, bottom to top (imports go down only):

    applied      AppliedState: the applied table, owners, weights, the by-IP index
    termination  Terminations: the drain queue and what drain checks last read of it
    apply        Applier: one function per op, kernel call + applied-state update
    adopt        start-up adoption (the kernel's table becomes the applied state)
    drain_check  DrainCheck: the drain check, a background read (`paced.py`)
    audit        Auditor: the drift audit, a background read too
    contention   Contention: claims on contested virtual servers (rule: plan/conflicts.py)
    intake       Intake: the object store and what each event makes dirty
    feed         ChangeFeed: what the engine tells the rest of the daemon, given to it built

The engine's own surface is `handle` (an event), `sync` and `set_node_ips`; the drain
check and the audit are run by the loop's paced runners, and everything else reads the
engine through a read-only `EngineView` (view.py). It owns only the sync itself: which
Services are dirty, building each one's desired state, diffing it against what was applied
for it alone and applying the ops. Single-threaded by design (the loop owns it; the HTTP
thread reads under the loop's lock).

Nothing is pruned and nothing touches the kernel before the first full list of Services and
EndpointSlices has arrived (`ready`): a restart must never program a half-known cluster.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ipvsctl.kernel.port import IPVSKernel
from ipvsctl.model import (
    DesiredService,
    DrainEntry,
    NodeContext,
    ServiceKey,
    ServiceRef,
)
from ipvsctl.obs.logging import fields
from ipvsctl.obs.metrics import Metrics
from ipvsctl.plan.capacity import Capacity, entries, refusal
from ipvsctl.plan.capacity import rank as capacity_rank
from ipvsctl.plan.desired import build_desired_service
from ipvsctl.plan.diff import POD_GONE_GRACE, DrainPolicy, diff_service
from ipvsctl.plan.guard import too_many
from ipvsctl.plan.handover import Held, narrow, release_ops
from ipvsctl.reconcile import adopt
from ipvsctl.reconcile.applied import AppliedState
from ipvsctl.reconcile.apply import Applier, Then
from ipvsctl.reconcile.audit import Auditor
from ipvsctl.reconcile.clock import Clock, SystemClock
from ipvsctl.reconcile.contention import Contention, LiveOwners
from ipvsctl.reconcile.drain_check import DrainCheck
from ipvsctl.reconcile.drain_reader import DrainReader
from ipvsctl.reconcile.feed import ChangeFeed
from ipvsctl.reconcile.intake import Intake
from ipvsctl.reconcile.table_guard import TableGuard, VirtualInterface
from ipvsctl.reconcile.termination import Terminations
from ipvsctl.source.events import SourceEvent

log = logging.getLogger("ipvsctl.engine")

__all__ = ["Engine", "EngineConfig", "SyncResult"]

FOREIGN_RETRY = 60.0  # seconds before a Service tries again a key another tool held


@dataclass(frozen=True, slots=True)
class EngineConfig:
    node: NodeContext
    drain_timeout: float = 30.0  # --drain-timeout
    # --service-drain-timeout: a virtual server that leaves the wanted set drains this long
    # at most (the Service's annotation first). 0 here, deleted at once, so that the
    # engine's tests about deletion say what they test; the CLI's default is 30.
    service_drain_timeout: float = 0.0
    # How long after a terminating endpoint left every slice its real server goes (a slice
    # re-pack is a delete and an add in two events, within this).
    pod_gone_grace: float = POD_GONE_GRACE
    # Virtual servers re-read per audit step (one step a second): a slow safety net that
    # must never delay events (200 took most of each second under emulation).
    audit_batch: int = 20
    # The source sends this node's Node (a Replace of kind Node, maybe empty): the first
    # sync waits for it, so topology hints are applied from the start.
    wait_for_node: bool = False


@dataclass(slots=True)
class SyncResult:
    services: int = 0  # Services synced
    ops: int = 0  # kernel operations applied
    # A kernel operation failed: these stay dirty and are retried with backoff.
    failed: set[ServiceRef] = field(default_factory=set)
    # Synced without error but left dirty for another pass (the kernel held an entry the
    # applied state did not know, or a key they wait for was released late): not a
    # failure, the next pass is due at once.
    resync: set[ServiceRef] = field(default_factory=set)

    @property
    def pending(self) -> set[ServiceRef]:
        """Everything still dirty after this sync: failed or waiting for another pass."""
        return self.failed | self.resync


class Engine:
    def __init__(
        self,
        kernel: IPVSKernel,
        config: EngineConfig,
        *,
        clock: Clock | None = None,
        metrics: Metrics | None = None,
        owned: Callable[[ServiceKey], bool] = lambda key: True,
        restored_queue: Iterable[DrainEntry] = (),
        may_take_over: Callable[[ServiceKey], bool] = lambda key: True,
        feed: ChangeFeed | None = None,
    ) -> None:
        self.kernel = kernel
        self.config = config
        self.clock = clock or SystemClock()
        self.metrics = metrics or Metrics()
        self.owned = owned
        self.may_take_over = may_take_over
        # Virtual servers Services want that another tool holds (left alone), with when
        # that was found: a Service's rebuild a minute later tries the key again.
        self.foreign: dict[ServiceKey, tuple[ServiceRef | None, float]] = {}
        self.dirty: set[ServiceRef] = set()
        # The audit found Services to sync again (outside any event): the loop syncs now.
        self.repaired = False
        self.started = False
        self._restored = list(restored_queue)
        # What the rest of the daemon hears (feed.py): a Service's changes once they are in
        # the kernel, a virtual server's drain, this node's Node, connections a drain cut.
        self.feed = feed if feed is not None else ChangeFeed()
        # For kube-proxy's health server: monotonic arrival of the oldest event not yet in
        # the kernel (None: all applied), wall time of the last complete sync (None: none
        # yet). Plain attributes, read by the HTTP thread without the lock.
        self.pending_since: float | None = None
        self.last_updated: float | None = None
        # A handover (plan/handover.py): what ipvsctl held when it was asked, the most a
        # Service may have from then on (None: serving); `idle` once everything went.
        self.held: Held | None = None
        self.idle = False

        # The background reads call this in their loops; the loop sets its own
        # (`EventsFirst.give_way`: a reader steps aside while an event waits).
        self.give_way: Callable[[], None] = lambda: None
        self.state = AppliedState(self.clock)
        self.drains = Terminations()
        self.contention = Contention(self.metrics)
        # How much of the node's table each Service may have (rule: plan/capacity.py)
        self.capacity = Capacity(config.node.max_table_entries)
        self.intake = Intake(config.node, self.metrics, started=self.clock.wall())
        # The background reads (`paced.py`), run by the loop's paced runners (the guard's
        # by its feature). The guard's restores are heard on the feed.
        self.guard = TableGuard(
            kernel,
            self.state,
            interface=kernel if isinstance(kernel, VirtualInterface) else None,
            ready=lambda: self.started,
            on_restore=self.feed.table_restored,
            on_recurring=self.feed.restores_recurring,
            clock=self.clock.monotonic,
        )
        self.applier = Applier(
            kernel,
            self.state,
            self.drains,
            self.metrics,
            self.clock,
            node_ips=lambda: self.config.node.node_ips,
            on_released=self._released,
            may_take_over=lambda key: self.may_take_over(key),
            on_foreign=self._foreign,
            on_retry=self._repaired_one,
            feed=self.feed,
            put_back_if_gone=self.guard.put_back_if_gone,
        )
        self.audit = Auditor(
            kernel,
            self.state,
            self.drains,
            self.applier,
            self.metrics,
            owned=lambda key: self.owned(key),
            batch=config.audit_batch,
            ready=lambda: self.started and not self.idle,
            on_repair=self._repaired,
            give_way=lambda: self.give_way(),
            service_drain_timeout=lambda: self.config.service_drain_timeout,
            node_ips=lambda: self.config.node.node_ips,
            put_back=self.guard.put_back,
        )
        self.drain_check = DrainCheck(
            self.drains,
            DrainReader(
                kernel,
                self.metrics,
                self.clock,
                give_way=lambda: self.give_way(),
                virtual_servers=lambda: self.state.n_vs,
            ),
            self.applier,
            self.state,
            self.clock,
            ready=lambda: self.started and not self.idle,
        )
        self._metrics_gauges()

    # --- events -------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        """The first full list of Services and EndpointSlices has arrived."""
        return self.intake.ready(self.config.wait_for_node)

    def handle(self, event: SourceEvent) -> None:
        if self.idle:  # handed over: nothing to keep up to date until a restart
            return
        services, node = self.intake.handle(event)
        self.dirty |= services
        if services and self.pending_since is None:
            self.pending_since = event.arrivals[0]
        if node:
            self._set_node(*self.intake.node_changed(self.config.node))
            self.feed.node_changed(self.intake.store.node, event.received)

    def set_host_ips(self, ips: frozenset[str]) -> bool:
        """The node's own addresses changed (any interface, not only the NodePort ones):
        mark dirty only the Services with an external or load-balancer IP among those that
        came or went (Node safety: a node address at a port outside the NodePort range is
        never a virtual server). Returns whether anything changed."""
        changed = self.intake.set_host_ips(ips, self.config.node)
        if changed is not None:
            self._set_node(*changed)
        return changed is not None

    def slices_watched(self, watching: bool) -> None:
        """The source's EndpointSlice watch opened or broke. Any thread: it only replaces
        one value the drain check reads (`Terminations.slices_watched`)."""
        self.drains.slices_watched(watching, self.clock.wall(), self.config.pod_gone_grace)

    def set_node_ips(self, ips: Iterable[str]) -> bool:
        """The node's addresses changed (kube-proxy re-reads them every sync): swap the
        NodeContext and mark dirty only the Services with a nodePort; the next sync adds
        their virtual servers on new addresses and deletes those on removed ones.
        Returns whether anything changed."""
        changed = self.intake.set_node_ips(ips, self.config.node)
        if changed is not None:
            self._set_node(*changed)
        return changed is not None

    def _set_node(self, node: NodeContext, dirty: set[ServiceRef]) -> None:
        if node != self.config.node:
            self.config = dataclasses.replace(self.config, node=node)
        self.dirty |= dirty

    def _foreign(self, ref: ServiceRef | None, key: ServiceKey) -> None:
        """The add found the key held by another tool: logged and counted once (until the
        key is ours or unwanted), skipped by the Service (`_not_foreign`)."""
        if key not in self.foreign:
            self.metrics.foreign_virtual_servers.inc()
            log.warning(
                "virtual server held by another tool, left alone",
                extra=fields(service=ref, vs=key),
            )
        self.foreign[key] = (ref, self.clock.monotonic())
        if self.state.get(ref, key) is None:  # never applied: not the Service's to audit
            self.state.owner.pop(key, None)

    def _not_foreign(self, desired: DesiredService) -> DesiredService:
        """The Service without the virtual servers another tool holds; once a minute a
        rebuild lets one through, to try it again (the tool may have let go)."""
        if not self.foreign:
            return desired
        now = self.clock.monotonic()
        skip = set()
        for key in desired.virtual_servers:
            mark = self.foreign.get(key)
            if mark is None:
                continue
            if now - mark[1] >= FOREIGN_RETRY:
                self.foreign[key] = (mark[0], now)  # one try, then a minute again
            else:
                skip.add(key)
        if not skip:
            return desired
        kept = {k: v for k, v in desired.virtual_servers.items() if k not in skip}
        return dataclasses.replace(desired, virtual_servers=kept)

    def _released(self, key: ServiceKey) -> None:
        self.dirty |= self.contention.released(key)

    def _repaired(self, refs: set[ServiceRef]) -> None:
        self.dirty |= refs
        self.repaired = True

    def _repaired_one(self, ref: ServiceRef) -> None:
        self._repaired({ref})

    # --- sync ---------------------------------------------------------------------------
    def sync(self) -> SyncResult:
        """Bring the kernel in line for every changed Service (all of them, the first
        time). Failed Services stay dirty; the caller retries with backoff."""
        if not self.ready or self.idle:
            return SyncResult()
        self.repaired = False
        if not self.started:
            return self._initial_sync()
        result = SyncResult()
        t0 = self.clock.monotonic()
        self._rounds(result, 3)
        self._finish_sync(result, t0)
        return result

    def _rounds(self, result: SyncResult, rounds: int) -> None:
        """Sync the dirty Services. One can make others dirty while syncing (it released or
        lost a virtual server another one waits for, or must be diffed again): those go
        in a further round of the same sync."""
        for _ in range(rounds):
            todo, self.dirty = self.dirty - result.failed, set()
            if not todo:
                break
            for ref in sorted(todo):
                self._sync_service(ref, result)
        self.dirty |= result.failed
        result.resync = self.dirty - result.failed

    def _finish_sync(self, result: SyncResult, t0: float) -> None:
        if result.services:
            self.metrics.sync_duration.observe(self.clock.monotonic() - t0)
        if not result.pending:
            self.metrics.last_sync_timestamp.set(self.clock.wall())
            self.last_updated = self.clock.wall()
            self.pending_since = None

    def _build(self, ref: ServiceRef) -> DesiredService | None:
        """The Service's virtual servers, all it claims (conflicts not yet resolved)."""
        return self._claim(ref, *self._build_unclaimed(ref))

    def _build_unclaimed(
        self, ref: ServiceRef, settle: bool = True
    ) -> tuple[DesiredService | None, list[str]]:
        """The Service as built, its size recorded against the node's table (with
        `settle`, the Services whose admission that changed are made dirty)."""
        svc = self.intake.store.services.get(ref)
        refused: list[str] = []
        desired = (
            None
            if svc is None
            else build_desired_service(
                svc, self.intake.store.slices_of(ref), self.config.node, refused
            )
        )
        size = entries(desired) if desired is not None and svc is not None else 0
        at = capacity_rank(svc.created, ref) if svc is not None else None
        # Services let in or shut out by this change: rebuilt in this or the next pass
        self.dirty |= self.capacity.update(ref, at, size, settle=settle)
        return desired, refused

    def _claim(
        self, ref: ServiceRef, desired: DesiredService | None, refused: list[str]
    ) -> DesiredService | None:
        """What the Service may have of the table (refused whole when it does not fit:
        then it claims nothing, so it takes no key from another Service either)."""
        svc = self.intake.store.services.get(ref)
        whole = too_many(svc, self.config.node) if svc is not None else None
        if desired is not None and self.capacity.refuses(ref):
            whole = refusal(self.capacity.limit)
            refused.append(whole)
            desired = dataclasses.replace(desired, virtual_servers={}, health_check_node_port=None)
        self.intake.refused(ref, refused, whole)
        # Services that won or lost a key by this change: rebuilt in this or the next pass
        self.dirty |= self.contention.claim(ref, desired, svc.created if svc else None)
        return desired

    def _sync_service(
        self,
        ref: ServiceRef,
        result: SyncResult,
        prebuilt: dict[ServiceRef, DesiredService | None] | None = None,
    ) -> None:
        if prebuilt and ref in prebuilt:
            new = prebuilt.pop(ref)
        else:
            new = self._build(ref)
            if new is not None:
                new = self._not_foreign(self.contention.resolve(new, self._live_owners))
        if new is not None and self.held is not None:
            new = narrow(new, self.held)  # handing over: nothing new
        draining_vs = self.drains.draining_virtual_servers
        if new is not None and draining_vs:
            # A draining virtual server is no live claim: the Service that claims its key
            # takes it over in place (never a delete and re-add). O(the Service's keys).
            for key in [k for k in new.virtual_servers if k in draining_vs]:
                self.applier.take_over(ref, key)
        old = self.state.desired.get(ref)
        applied = self.state.by_service.get(ref, {})
        ops = diff_service(
            ref,
            new,
            applied,
            {k: self.drains.queue.for_vs(k) for k in applied},
            DrainPolicy(
                self.clock.wall(),
                self.config.drain_timeout,
                self.config.pod_gone_grace,
                self.config.service_drain_timeout,
            ),
            previous_endpoints=old.endpoints if old else None,
            draining_vs=[k for k in applied if k in draining_vs] if draining_vs else (),
            previous_drain_timeout=old.drain_timeout if old else None,
        )
        outcome = self.applier.apply(ref, ops)
        result.ops += outcome.ops
        result.services += 1
        if outcome.then is Then.RETRY:
            result.failed.add(ref)
            return
        if new is None:
            kept = self.state.by_service.get(ref, {})
            self.state.forget_service(ref, [k for k in kept if k in draining_vs])
        else:
            self.state.desired[ref] = new
        if self.foreign and outcome.then is Then.DONE:  # marks of keys now ours, or unwanted
            for key in [k for k, (r, _) in self.foreign.items() if r == ref]:
                if new is None or self.state.get(ref, key) is not None:
                    del self.foreign[key]
        if new != old:
            self.feed.service_changed(ref, old, new)
        now = self.clock.monotonic()
        for t in self.intake.arrivals.pop(ref, ()):
            self.metrics.event_to_kernel.observe(max(0.0, now - t))
        triggers = self.intake.triggers.pop(ref, None)
        if triggers:
            self._observe_programming(triggers)
        if outcome.then is Then.DIFF_AGAIN:
            self.dirty.add(ref)

    def _observe_programming(self, triggers: list[float]) -> None:
        """kube-proxy's network programming SLI: from each change's trigger time (the
        EndpointSlice controller's clock) to now. A time later than now (a skewed or
        hostile clock) is counted, never observed as a negative latency."""
        wall = self.clock.wall()
        for t in triggers:
            if t > wall:
                self.metrics.network_programming_skipped.labels("future").inc()
            else:
                self.metrics.network_programming.observe(wall - t)

    @property
    def _live_owners(self) -> LiveOwners:
        return LiveOwners(self.state.owner, self.drains.draining_virtual_servers)

    # --- handover (plan/handover.py) -----------------------------------------------------
    def hold(self, held: Held) -> None:
        """A handover was asked: from now on a Service gets at most what `held` has (a
        Service already in line with the kernel has nothing to narrow: no resync)."""
        self.held = held

    def release_all(self) -> tuple[int, int]:
        """The handover's last step: every virtual server ipvsctl holds deleted (with the
        addresses it bound; their drains go with them), every Service heard as having none;
        then the engine is idle (events, syncs, audits and drain checks do nothing) until
        the daemon restarts. Returns (virtual servers deleted, failed): with failures it
        stays as it is, to be called again."""
        gone = failed = 0
        for ref, ops in release_ops(self.state.by_service):
            for op in ops:  # each on its own: one failure does not keep the others
                if self.applier.apply(ref, [op]).failed:
                    failed += 1
                else:
                    gone += 1
        if failed:
            return gone, failed
        for ref, old in sorted(self.state.desired.items()):
            self.feed.service_changed(ref, old, None)
        self.state.desired.clear()
        self.state.by_service.clear()
        self.dirty.clear()
        self.pending_since = None
        self.idle = True
        self.feed.handed_over()
        return gone, 0

    # --- start-up -----------------------------------------------------------------------
    def _initial_sync(self) -> SyncResult:
        """The first sync: adopt what the kernel holds (`adopt.py`: owned virtual servers
        nobody wants drain; only empty ones are deleted here), then diff every Service
        against the adopted state. Wanted real servers found at weight 0 go back to 1
        (kubernetes#92019)."""
        t0 = self.clock.monotonic()
        # every Service's size first, then every claim, so that neither who fits in the
        # table nor who wins a key depends on the order of building
        refs = sorted(self.intake.store.services)
        unclaimed = {ref: self._build_unclaimed(ref, settle=False) for ref in refs}
        self.capacity.settle()
        claimed = {ref: self._claim(ref, *unclaimed.pop(ref)) for ref in refs}
        built: dict[ServiceRef, DesiredService | None] = {}
        for ref, desired in claimed.items():
            if desired is not None:
                desired = self.contention.resolve(desired, self._live_owners)
                for key in desired.virtual_servers:
                    self.state.owner[key] = ref
            built[ref] = desired
        wanted = self.state.owner.keys() | {e.vs for e in self._restored if e.vs_draining}
        observed = adopt.read_ours(self.kernel, wanted, self.owned, self.may_take_over)
        orphans = adopt.adopt(
            observed,
            built,
            self.state,
            self.drains,
            restored=self._restored,
            now=self.clock.wall(),
            drain_timeout=self.config.drain_timeout,
            node_ips=self.config.node.node_ips,
            service_drain_timeout=self.config.service_drain_timeout,
        )
        self._restored = []
        # Deleted Services whose virtual servers still drain: synced too (each diff then
        # drains what is left live of them, or deletes one left empty).
        draining_refs = set(self.drains.draining_virtual_servers.values())

        result = SyncResult()
        for orphan in orphans:
            if self.applier.delete_orphan(orphan.key, orphan.real_servers):
                result.ops += 1
        todo, self.dirty = self.dirty | set(self.intake.store.services) | draining_refs, set()
        for ref in sorted(todo):
            self._sync_service(ref, result, built)
        self._rounds(result, 2)  # what the first pass made dirty (Then.DIFF_AGAIN)
        # Only now, and not when the sync raised: `started` is /readyz ("the first full
        # list is in the kernel") and what /v1/quiesced calls ready, and other threads read
        # it without the lock.
        self.started = True
        self._finish_sync(result, t0)
        log.info(
            "initial sync done",
            extra=fields(
                services=len(self.intake.store.services),
                virtual_servers=self.state.n_vs,
                real_servers=self.state.n_rs,
                draining=len(self.drains),
                ops=result.ops,
                failed=len(result.failed),
                seconds=round(self.clock.monotonic() - t0, 3),
            ),
        )
        return result

    # --- metrics ------------------------------------------------------------------------
    def _metrics_gauges(self) -> None:
        m, state, drains = self.metrics, self.state, self.drains
        m.virtual_servers.set_function(lambda: state.n_vs)
        m.drain_queue_length.set_function(lambda: len(drains))
        m.real_servers.labels("draining").set_function(lambda: len(drains))
        m.real_servers.labels("active").set_function(lambda: max(0, state.n_rs - len(drains)))
        capacity = self.capacity
        m.table_entries.set_function(lambda: capacity.used)
        m.table_entries_limit.set(capacity.limit)
        m.table_refused_services.set_function(lambda: len(capacity.refused))

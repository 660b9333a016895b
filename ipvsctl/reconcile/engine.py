"""The engine: source events in, kernel operations out, one Service at a time.

Single-threaded by design (the loop owns it; the HTTP thread reads status under the loop's
lock). Every event path costs O(the Services it touches): the store reports which Services
changed, each is rebuilt and diffed against what was applied for it alone.

Nothing is pruned and nothing touches the kernel before the first full list of Services and
EndpointSlices has arrived (`ready`): a restart must never program a half-known cluster.
"""

from __future__ import annotations

import contextlib
import dataclasses
import heapq
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ipvsctl.kernel.port import (
    IPVSKernel,
    KernelError,
    KernelExists,
    KernelNotFound,
)
from ipvsctl.model import (
    AppliedVirtualServer,
    ConnCounts,
    DeadlineSource,
    DesiredService,
    DrainEntry,
    DrainQueue,
    DrainReason,
    NodeContext,
    PodRef,
    RealServerKey,
    RealServerStatus,
    ServiceKey,
    ServiceRef,
    VirtualServer,
    VirtualServerKind,
)
from ipvsctl.obs.logging import fields
from ipvsctl.obs.metrics import Metrics
from ipvsctl.plan.conflicts import Claims, rank
from ipvsctl.plan.desired import build_desired_service
from ipvsctl.plan.diff import DrainPolicy, diff_service
from ipvsctl.plan.drain import check_drains
from ipvsctl.plan.ops import (
    AddRealServer,
    AddVirtualServer,
    DeleteRealServer,
    DeleteVirtualServer,
    DeletionReason,
    DrainRealServer,
    ForgetDrain,
    Op,
    RestoreRealServer,
    UpdateVirtualServer,
)
from ipvsctl.reconcile.clock import Clock, SystemClock
from ipvsctl.reconcile.drain_reader import DrainReader, DrainReading, DrainSnapshot
from ipvsctl.source.events import ObjectKind, SourceEvent
from ipvsctl.source.store import ObjectStore, Problem

log = logging.getLogger("ipvsctl.engine")

QUIESCED_MEMORY = 3600.0  # seconds an IP's "weight 0 since" is remembered
# Node IPs removed while running, remembered so their NodePort virtual servers still count
# as ours (`node_ips_known`); bounded because IPv6 temporary addresses rotate for ever.
FORMER_NODE_IPS = 256


ServiceListener = Callable[[ServiceRef, DesiredService | None, DesiredService | None], None]


@dataclass(frozen=True, slots=True)
class EngineConfig:
    node: NodeContext
    drain_timeout: float = 30.0  # --drain-timeout
    # Virtual servers re-read per audit step (one step a second): a slow safety net that
    # must never delay events (200 took most of each second under emulation).
    audit_batch: int = 20
    # The source sends this node's Node (a Replace of kind Node, maybe empty): the first
    # sync waits for it, so topology hints are applied from the start.
    wait_for_node: bool = False


@dataclass(frozen=True, slots=True)
class AuditPlan:
    changed: tuple[int, int]  # Engine._changed() when planned
    full: bool  # a new round: the virtual servers are read too
    keys: list[ServiceKey]  # virtual servers whose real servers are read


@dataclass(slots=True)
class AuditReading:
    plan: AuditPlan
    virtual_servers: dict[ServiceKey, VirtualServer] | None = None  # None: not read
    real_servers: dict[ServiceKey, dict[RealServerKey, int]] = field(default_factory=dict)


@dataclass(slots=True)
class SyncResult:
    services: int = 0  # Services synced
    ops: int = 0  # kernel operations applied
    failed: set[ServiceRef] = field(default_factory=set)


class Engine:
    def __init__(
        self,
        kernel: IPVSKernel,
        config: EngineConfig,
        *,
        clock: Clock | None = None,
        metrics: Metrics | None = None,
        owned: Callable[[ServiceKey], bool] = lambda key: True,
        request_pod: Callable[[PodRef], None] = lambda ref: None,
        restored_queue: Iterable[DrainEntry] = (),
    ) -> None:
        self.kernel = kernel
        self.config = config
        self.clock = clock or SystemClock()
        self.metrics = metrics or Metrics()
        self.owned = owned
        self.request_pod = request_pod
        self.store = ObjectStore(config.node.default_scheduler,
                                 node_name=config.node.node_name,
                                 service_proxy_name=config.node.service_proxy_name)
        self.queue = DrainQueue()
        self.applied: dict[ServiceRef, dict[ServiceKey, AppliedVirtualServer]] = {}
        self.desired: dict[ServiceRef, DesiredService] = {}
        self.vs_owner: dict[ServiceKey, ServiceRef] = {}
        self.dirty: set[ServiceRef] = set()
        self.started = False
        self._restored = list(restored_queue)
        # Called after a Service's changes reached the kernel: (ref, old, new). Netfilter
        # rules and health checks follow Services through this, O(the Service) each.
        self.service_listeners: list[ServiceListener] = []
        self._arrivals: dict[ServiceRef, list[float]] = {}
        self._pods_requested: set[PodRef] = set()
        self._conflicts: dict[ServiceKey, set[ServiceRef]] = {}
        self.claims = Claims()  # who claims which virtual server; plan/conflicts.py's rule
        self._losing: dict[ServiceRef, frozenset[ServiceKey]] = {}
        self._n_vs = 0
        self._n_rs = 0
        self._failing: set[ServiceRef] = set()
        self._live_by_ip: dict[str, int] = {}
        # Connection counts of draining real servers as the last drain check read them.
        self._drain_counts: dict[tuple[ServiceKey, RealServerKey], tuple[int, int]] = {}
        # Their connections by state, when the connection table was read for them.
        self._drain_conns: dict[tuple[ServiceKey, RealServerKey], ConnCounts] = {}
        self.drain_reader = DrainReader(kernel, self.metrics, self.clock)
        self._quiesced_since: dict[str, float] = {}
        self._quiesced_expiry: list[tuple[float, str]] = []
        self._audit_cursor: list[ServiceKey] = []
        self._mutations = 0  # bumped by every applied op: audit readings check it
        # Services with a nodePort: the only ones a node address change touches.
        self._node_port_services: set[ServiceRef] = set()
        self._former_node_ips: dict[str, None] = {}  # insertion-ordered, oldest first
        self._node_ips_known = frozenset(config.node.node_ips)
        # Services with a slice carrying topology hints: the only ones a zone change touches.
        self._hinted_services: set[ServiceRef] = set()
        # For kube-proxy's health server: monotonic arrival of the oldest event not yet in
        # the kernel (None: all applied), wall time of the last complete sync (None: none
        # yet). Plain attributes, read by the HTTP thread without the lock.
        self.pending_since: float | None = None
        self.last_updated: float | None = None
        self._metrics_gauges()

    # --- events -------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        """The first full list of Services and EndpointSlices has arrived."""
        synced = self.store.synced
        return ({ObjectKind.SERVICE, ObjectKind.ENDPOINT_SLICE} <= synced
                and (ObjectKind.NODE in synced or not self.config.wait_for_node))

    def handle(self, event: SourceEvent) -> None:
        change = self.store.apply(event)
        for problem in change.problems:
            self._report_problem(problem)
        for ref in change.services:
            self.dirty.add(ref)
            self._arrivals.setdefault(ref, []).append(event.received)
            self._index_node_ports(ref)
            self._index_hints(ref)
        if change.services and self.pending_since is None:
            self.pending_since = event.received
        if change.node:
            self._node_changed()
        deadlines = self.store.pod_deadlines()
        for pod in change.pods:
            self._pods_requested.discard(pod)
            deadline = deadlines.get(pod)
            if deadline is None:
                continue
            for entry in self.queue.apply_pod_deadline(pod, deadline):
                log.info("drain deadline from pod", extra=fields(
                    vs=entry.vs, rs=entry.rs, pod=pod, deadline=round(deadline, 3)))

    def _index_node_ports(self, ref: ServiceRef) -> None:
        svc = self.store.services.get(ref)
        if (svc is not None and svc.type in ("NodePort", "LoadBalancer")
                and any(p.node_port for p in svc.ports)):
            self._node_port_services.add(ref)
        else:
            self._node_port_services.discard(ref)

    def _index_hints(self, ref: ServiceRef) -> None:
        by_name = self.store.slices_by_service.get(ref)
        if by_name and any(sl.has_hints for sl in by_name.values()):
            self._hinted_services.add(ref)
        else:
            self._hinted_services.discard(ref)

    def _node_changed(self) -> None:
        """This node's Node changed: a new zone marks dirty only the Services whose slices
        carry topology hints (node hints follow the node name, which never changes)."""
        node = self.store.node
        zone = node.zone if node is not None else None
        log.info("node object", extra=fields(
            node=self.config.node.node_name, known=node is not None and node.present,
            zone=zone, eligible=node.eligible if node is not None else None))
        if zone == self.config.node.zone:
            return
        self.config = dataclasses.replace(
            self.config, node=dataclasses.replace(self.config.node, zone=zone))
        self.dirty |= self._hinted_services
        log.info("node zone changed", extra=fields(
            zone=zone, services=len(self._hinted_services)))

    def set_node_ips(self, ips: Iterable[str]) -> bool:
        """The node's addresses changed (kube-proxy re-reads them every sync): swap the
        NodeContext and mark dirty only the Services with a nodePort; the next sync adds
        their virtual servers on new addresses and deletes those on removed ones.
        Returns whether anything changed."""
        new = tuple(dict.fromkeys(ips))
        old = self.config.node.node_ips
        if set(new) == set(old):
            return False
        added = sorted(set(new) - set(old))
        removed = sorted(set(old) - set(new))
        self.config = dataclasses.replace(
            self.config, node=dataclasses.replace(self.config.node, node_ips=new))
        for ip in added:
            self._former_node_ips.pop(ip, None)
        for ip in removed:
            self._former_node_ips[ip] = None
        while len(self._former_node_ips) > FORMER_NODE_IPS:
            del self._former_node_ips[next(iter(self._former_node_ips))]
        self._node_ips_known = frozenset((*new, *self._former_node_ips))
        self.dirty |= self._node_port_services
        log.info("node addresses changed", extra=fields(
            added=",".join(added) or None, removed=",".join(removed) or None,
            services=len(self._node_port_services)))
        return True

    @property
    def node_ips_known(self) -> frozenset[str]:
        """The current node IPs and those removed while running: NodePort virtual servers on
        either are ipvsctl's (ownership for adoption and the audit)."""
        return self._node_ips_known

    def _report_problem(self, p: Problem) -> None:
        self.metrics.invalid_objects.labels(p.kind.value).inc()
        msg = "invalid object skipped" if p.fatal else "invalid field ignored"
        log.warning(msg, extra=fields(kind=p.kind.value, object=p.name, reason=p.reason))

    # --- sync ---------------------------------------------------------------------
    def sync(self) -> SyncResult:
        """Bring the kernel in line for every changed Service (all of them, the first
        time). Failed Services stay dirty; the caller retries with backoff."""
        if not self.ready:
            return SyncResult()
        if not self.started:
            return self._initial_sync()
        result = SyncResult()
        t0 = self.clock.monotonic()
        # A Service can make others dirty while syncing (it released or lost a virtual
        # server another one waits for): those go in a second round of the same sync.
        for _ in range(3):
            todo, self.dirty = self.dirty - result.failed, set()
            if not todo:
                break
            for ref in sorted(todo):
                self._sync_service(ref, result)
        self.dirty |= result.failed
        self._finish_sync(result, t0)
        return result

    def _finish_sync(self, result: SyncResult, t0: float) -> None:
        if result.services:
            self.metrics.sync_duration.observe(self.clock.monotonic() - t0)
        if not result.failed:
            self.metrics.last_sync_timestamp.set(self.clock.wall())
            self.last_updated = self.clock.wall()
            self.pending_since = None

    def _policy(self) -> DrainPolicy:
        return DrainPolicy(self.clock.wall(), self.config.drain_timeout,
                           self.store.pod_deadlines())

    def _build(self, ref: ServiceRef) -> DesiredService | None:
        desired = self._build_and_claim(ref)
        return None if desired is None else self._resolve_conflicts(ref, desired)

    def _build_and_claim(self, ref: ServiceRef) -> DesiredService | None:
        """The Service's virtual servers, all it claims (conflicts not yet resolved)."""
        svc = self.store.services.get(ref)
        desired = None if svc is None else build_desired_service(
            svc, self.store.slices_of(ref), self.config.node)
        claims = {} if desired is None else {
            k: rank(dvs.kind, svc.created if svc else None, ref)
            for k, dvs in desired.virtual_servers.items()}
        # Services that won or lost a key by this change: rebuilt in this or the next pass
        self.dirty |= self.claims.update(ref, claims)
        if desired is None:
            self._losing.pop(ref, None)
        self.metrics.virtual_server_conflict_losers.set(self.claims.conflicts())
        return desired

    def _resolve_conflicts(self, ref: ServiceRef, desired: DesiredService) -> DesiredService:
        """Two Services wanting one virtual server (say the same external IP and port): the
        winner by plan/conflicts.py's rule gets it, once the other has released it."""
        lost = frozenset(k for k in desired.virtual_servers if self.claims.winner(k) != ref)
        for key in sorted(lost - self._losing.get(ref, frozenset())):
            self.metrics.virtual_server_conflicts.inc()
            log.warning("virtual server claimed by another service", extra=fields(
                service=ref, vs=key, winner=self.claims.winner(key)))
        if lost:
            self._losing[ref] = lost
        else:
            self._losing.pop(ref, None)
        taken = [k for k in desired.virtual_servers
                 if k in lost or self.vs_owner.get(k, ref) != ref]
        if not taken:
            return desired
        for key in taken:
            self._conflicts.setdefault(key, set()).add(ref)  # rebuilt when it is released
        kept = {k: v for k, v in desired.virtual_servers.items() if k not in taken}
        return DesiredService(ref, kept, desired.drain_timeout, desired.endpoints,
                              desired.health_check_node_port)

    def _sync_service(self, ref: ServiceRef, result: SyncResult,
                      prebuilt: dict[ServiceRef, DesiredService | None] | None = None) -> None:
        new = prebuilt.pop(ref) if prebuilt and ref in prebuilt else self._build(ref)
        old = self.desired.get(ref)
        applied = self.applied.get(ref, {})
        ops = diff_service(
            ref, new, applied, {k: self.queue.for_vs(k) for k in applied}, self._policy(),
            previous_endpoints=old.endpoints if old else None,
        )
        self._request_pods(new)
        resync = self._apply(ref, ops, result)
        result.services += 1
        if ref in result.failed:
            return
        if new is None:
            self.desired.pop(ref, None)
            self.applied.pop(ref, None)
        else:
            self.desired[ref] = new
        if new != old:
            for listener in self.service_listeners:
                listener(ref, old, new)
        now = self.clock.monotonic()
        for t in self._arrivals.pop(ref, ()):
            self.metrics.event_to_kernel.observe(max(0.0, now - t))
        if resync:  # the kernel held something we did not know: one more pass sees it
            result.failed.add(ref)

    def _request_pods(self, desired: DesiredService | None) -> None:
        if desired is None or desired.drain_timeout is not None:
            return  # the Service's annotation decides the deadline: no pod lookup needed
        deadlines = self.store.pod_deadlines()
        for meta in desired.endpoints.values():
            pod = meta.pod
            if (meta.terminating and pod is not None and pod not in deadlines
                    and pod not in self._pods_requested):
                self._pods_requested.add(pod)
                self.request_pod(pod)

    # --- applying ops -------------------------------------------------------------
    def _apply(self, ref: ServiceRef | None, ops: list[Op], result: SyncResult) -> bool:
        """Apply in order; stop at the first failure (the Service stays dirty). Returns
        True when the kernel turned out to differ from what was applied."""
        surprised = False
        for op in ops:
            try:
                surprised |= self._apply_op(ref, op)
            except KernelError as exc:
                operation = exc.operation or type(op).__name__
                self.metrics.netlink_errors.labels(operation).inc()
                self.metrics.kernel_ops.labels(type(op).__name__, "error").inc()
                if ref is not None:
                    result.failed.add(ref)
                    if ref not in self._failing:  # one line per failing streak
                        self._failing.add(ref)
                        log.error("kernel operation failed", extra=fields(
                            service=ref, op=op, operation=operation, error=exc))
                return surprised
            result.ops += 1
            self.metrics.kernel_ops.labels(type(op).__name__, "ok").inc()
            log.debug("applied", extra=fields(service=ref, op=op))
        if ref is not None and ref in self._failing:
            self._failing.discard(ref)
            log.info("kernel operations recovered", extra=fields(service=ref))
        return surprised

    def _vs_state(self, ref: ServiceRef | None, key: ServiceKey) -> AppliedVirtualServer | None:
        if ref is None:
            ref = self.vs_owner.get(key)
        return self.applied.get(ref, {}).get(key) if ref is not None else None

    def _set_weight(self, state: AppliedVirtualServer | None, rs: RealServerKey,
                    weight: int | None) -> None:
        if state is None:
            return
        before = state.weights.get(rs)
        if weight is None:
            state.weights.pop(rs, None)
        else:
            state.weights[rs] = weight
        self._n_rs += (weight is not None) - (before is not None)
        was_live, live = (before or 0) > 0, (weight or 0) > 0
        if was_live != live:
            self._track_live(rs.address, 1 if live else -1)

    def _track_live(self, address: str, delta: int) -> None:
        """How many real servers with weight > 0 each pod IP has, and since when an IP has
        none: a pod's shutdown barrier asks every node whether it still gets new
        connections (`/v1/quiesced`)."""
        n = self._live_by_ip.get(address, 0) + delta
        if n > 0:
            self._live_by_ip[address] = n
            self._quiesced_since.pop(address, None)
        else:
            self._live_by_ip.pop(address, None)
            self._quiesced_since[address] = self.clock.wall()
            heapq.heappush(self._quiesced_expiry,
                           (self.clock.wall() + QUIESCED_MEMORY, address))

    def quiesced(self, address: str) -> dict[str, Any]:
        """Whether this node still sends new connections to `address`, and since when not."""
        now = self.clock.wall()
        while self._quiesced_expiry and self._quiesced_expiry[0][0] <= now:
            _, ip = heapq.heappop(self._quiesced_expiry)
            since = self._quiesced_since.get(ip)
            if since is not None and since + QUIESCED_MEMORY <= now:
                del self._quiesced_since[ip]
        live = self._live_by_ip.get(address, 0)
        since = self._quiesced_since.get(address)
        return {
            "ip": address, "node": self.config.node.node_name, "ready": self.started,
            "quiesced": self.started and live == 0, "real_servers_with_weight": live,
            "since": since, "for_seconds": round(now - since, 3) if since else None,
        }

    def _binds(self, kind: VirtualServerKind, key: ServiceKey) -> bool:
        """Whether the address goes on the dummy interface: not a node IP (NodePorts), and,
        as kube-proxy's shouldBind, not an external or LB IP that is already one of the
        node's addresses (on another interface: adding and later removing it here would
        disturb the node's own address)."""
        return kind.binds_address and key.address not in self.config.node.node_ips

    def _apply_op(self, ref: ServiceRef | None, op: Op) -> bool:
        k = self.kernel
        self._mutations += 1
        surprised = False
        if isinstance(op, AddVirtualServer):
            bind = self._binds(op.kind, op.vs.key)
            try:
                k.add_virtual_server(op.vs, bind)
                weights: dict[RealServerKey, int] = {}
            except KernelExists:
                # Left by an earlier run or another tool: adopt it as it is.
                k.update_virtual_server(op.vs)
                weights = {s.key: s.weight for s in k.list_real_servers(op.vs.key)}
                surprised = bool(weights)
            assert ref is not None
            self.applied.setdefault(ref, {})[op.vs.key] = AppliedVirtualServer(op.vs, bind)
            self._n_vs += 1
            for rs, w in weights.items():
                self._set_weight(self.applied[ref][op.vs.key], rs, w)
            self.vs_owner[op.vs.key] = ref
        elif isinstance(op, UpdateVirtualServer):
            state = self._vs_state(ref, op.vs.key)
            try:
                k.update_virtual_server(op.vs)
            except KernelNotFound:
                k.add_virtual_server(op.vs, state.bind_address if state else True)
                if state:
                    for rs in list(state.weights):
                        self._set_weight(state, rs, None)
                surprised = True
            if state:
                state.vs = op.vs
        elif isinstance(op, DeleteVirtualServer):
            with contextlib.suppress(KernelNotFound):
                k.delete_virtual_server(op.key, op.bind_address)
            self._forget_vs(ref, op.key, op.real_servers)
        elif isinstance(op, AddRealServer):
            try:
                k.add_real_server(op.vs, op.rs, 1)
            except KernelExists:
                k.set_real_server_weight(op.vs, op.rs, 1)
            self._set_weight(self._vs_state(ref, op.vs), op.rs, 1)
        elif isinstance(op, RestoreRealServer):
            try:
                k.set_real_server_weight(op.vs, op.rs, 1)
            except KernelNotFound:
                k.add_real_server(op.vs, op.rs, 1)
            self._set_weight(self._vs_state(ref, op.vs), op.rs, 1)
            self._forget_counts(op.vs, op.rs)
            if self.queue.remove(op.vs, op.rs):
                log.info("drain cancelled, endpoint back", extra=fields(
                    service=ref, vs=op.vs, rs=op.rs))
        elif isinstance(op, DrainRealServer):
            e = op.entry
            state = self._vs_state(ref, e.vs)
            try:
                if state is None or state.weights.get(e.rs) != 0:
                    k.set_real_server_weight(e.vs, e.rs, 0)
            except KernelNotFound:
                self._set_weight(state, e.rs, None)  # nothing left to drain
                return False
            self._set_weight(state, e.rs, 0)
            self.queue.add(e)
            log.info("drain started", extra=fields(
                service=e.service, vs=e.vs, rs=e.rs, reason=e.reason, pod=e.pod,
                deadline_in=round(e.deadline - e.since, 3), deadline_from=e.deadline_source))
        elif isinstance(op, DeleteRealServer):
            with contextlib.suppress(KernelNotFound):
                k.delete_real_server(op.vs, op.rs)
            if op.flush_conntrack:
                try:
                    k.flush_conntrack(op.vs, op.rs)
                except KernelError as exc:  # the real server is gone either way
                    self.metrics.netlink_errors.labels(exc.operation or "flush_conntrack").inc()
                    log.warning("conntrack flush failed", extra=fields(
                        vs=op.vs, rs=op.rs, error=exc))
            self._set_weight(self._vs_state(ref, op.vs), op.rs, None)
            entry = self.queue.remove(op.vs, op.rs)
            self._forget_counts(op.vs, op.rs)
            self.metrics.real_server_deletions.labels(op.reason.value).inc()
            if entry is not None:
                self.metrics.drain_duration.labels(op.reason.value).observe(
                    max(0.0, self.clock.wall() - entry.since))
            log.info("real server deleted", extra=fields(
                service=ref or (entry.service if entry else None), vs=op.vs, rs=op.rs,
                reason=op.reason,
                drained_for=round(self.clock.wall() - entry.since, 3) if entry else None))
        elif isinstance(op, ForgetDrain):
            self.queue.remove(op.vs, op.rs)
            self._forget_counts(op.vs, op.rs)
            self._set_weight(self._vs_state(ref, op.vs), op.rs, None)
        return surprised

    def _forget_vs(self, ref: ServiceRef | None, key: ServiceKey, real_servers: int) -> None:
        owner = ref if ref is not None else self.vs_owner.get(key)
        state = self.applied.get(owner, {}).pop(key, None) if owner is not None else None
        if state is not None:
            self._n_vs -= 1
            for rs in list(state.weights):
                self._set_weight(state, rs, None)
        if self.vs_owner.get(key) == owner:
            self.vs_owner.pop(key, None)
        self._dequeue_vs(key)
        if real_servers:
            self.metrics.real_server_deletions.labels(
                DeletionReason.SERVICE_DELETED.value).inc(real_servers)
        log.info("virtual server deleted", extra=fields(
            service=owner, vs=key, real_servers=real_servers))
        # A Service that wanted this key while another held it can have it now.
        for waiting in self._conflicts.pop(key, ()):
            self.dirty.add(waiting)

    def _forget_counts(self, vs: ServiceKey, rs: RealServerKey) -> None:
        self._drain_counts.pop((vs, rs), None)
        self._drain_conns.pop((vs, rs), None)

    def _dequeue_vs(self, key: ServiceKey) -> None:
        for entry in self.queue.remove_vs(key):
            self._forget_counts(*entry.key)

    # --- start-up -----------------------------------------------------------------
    def _initial_sync(self) -> SyncResult:
        """The first sync: adopt what the kernel holds, then diff every Service against it.
        Wanted real servers found at weight 0 go back to 1 (kubernetes#92019); unwanted
        ones at weight 0 are adopted into the queue with their persisted deadline, never
        deleted abruptly; owned virtual servers nobody wants are deleted."""
        t0 = self.clock.monotonic()
        now = self.clock.wall()
        wanted_rs: dict[ServiceKey, frozenset[RealServerKey]] = {}
        built: dict[ServiceRef, DesiredService | None] = {}
        # every claim first, so that who wins does not depend on the order of building
        claimed = {ref: self._build_and_claim(ref) for ref in sorted(self.store.services)}
        for ref, desired in claimed.items():
            if desired is not None:
                desired = self._resolve_conflicts(ref, desired)
            built[ref] = desired
            if desired is not None:
                for key, dvs in desired.virtual_servers.items():
                    wanted_rs[key] = dvs.real_servers
                    self.vs_owner[key] = ref
        # Ours: what we want (even when another proxy made it: kube-router's VIPs live on
        # its own interface; taking them over in place keeps their connections) and what
        # sits on our addresses. Anything else in the table is left alone.
        observed: dict[ServiceKey, tuple[VirtualServer, list[RealServerStatus]]] = {}
        ours = [vs for vs in self.kernel.list_virtual_servers()
                if vs.key in wanted_rs or self.owned(vs.key)]
        dests = self._read_all_real_servers([vs.key for vs in ours])
        for vs in ours:
            if vs.key in dests:
                observed[vs.key] = (vs, dests[vs.key])

        for ref, desired in built.items():
            if desired is None:
                continue
            for key, dvs in desired.virtual_servers.items():
                if key in observed:
                    vs, dests = observed[key]
                    state = AppliedVirtualServer(vs, self._binds(dvs.kind, key))
                    self.applied.setdefault(ref, {})[key] = state
                    self._n_vs += 1
                    for d in dests:
                        self._set_weight(state, d.key, d.weight)

        restored = {e.key: e for e in self._restored}
        for key, (_vs, dests) in observed.items():
            for d in dests:
                if d.weight != 0 or d.key in wanted_rs.get(key, frozenset()):
                    continue
                entry = restored.get((key, d.key))
                if entry is None:
                    entry = DrainEntry(
                        key, d.key, self.vs_owner.get(key), DrainReason.ADOPTED, now,
                        now + self.config.drain_timeout, DeadlineSource.DEFAULT)
                self.queue.add(entry)
                log.info("drain adopted", extra=fields(
                    vs=key, rs=d.key, reason=entry.reason,
                    deadline_in=round(entry.deadline - now, 3)))
        self._restored = []

        result = SyncResult()
        for key in sorted(observed.keys() - wanted_rs.keys()):
            self._delete_orphan(key, len(observed[key][1]), result)
        self.dirty |= set(self.store.services)
        for ref in sorted(self.dirty):
            self._sync_service(ref, result, built)
        # Only now, and not when the sync raised: `started` is /readyz ("the first full
        # list is in the kernel") and what /v1/quiesced calls ready, and other threads read
        # it without the lock.
        self.started = True
        self.dirty = set(result.failed)
        self._finish_sync(result, t0)
        log.info("initial sync done", extra=fields(
            services=len(self.store.services), virtual_servers=self._n_vs,
            real_servers=self._n_rs, draining=len(self.queue), ops=result.ops,
            failed=len(result.failed), seconds=round(self.clock.monotonic() - t0, 3)))
        return result

    def _read_all_real_servers(
        self, keys: list[ServiceKey]
    ) -> dict[ServiceKey, list[RealServerStatus]]:
        """Real servers of many virtual servers: one /proc/net/ip_vs read (a restart over
        10,000 Services made 10,000 dumps), per-service dumps for what it could not give.
        A virtual server gone between the reads is left out."""
        try:
            table = self.kernel.read_real_servers(keys)
        except KernelError as exc:
            log.info("ipvs table file unreadable, reading per virtual server",
                     extra=fields(error=exc))
            table = {}
        out: dict[ServiceKey, list[RealServerStatus]] = {}
        for key in keys:
            if key in table:
                found = table[key]
                if found is not None:
                    out[key] = found
                continue
            with contextlib.suppress(KernelNotFound):
                out[key] = self.kernel.list_real_servers(key)
        return out

    def _delete_orphan(self, key: ServiceKey, real_servers: int, result: SyncResult) -> None:
        self._mutations += 1
        try:
            self.kernel.delete_virtual_server(key, True)
        except KernelNotFound:
            pass
        except KernelError as exc:
            self.metrics.netlink_errors.labels(exc.operation or "delete_virtual_server").inc()
            log.error("kernel operation failed", extra=fields(op=f"del-vs {key}", error=exc))
            return
        result.ops += 1
        self._forget_vs(None, key, real_servers)

    # --- draining -----------------------------------------------------------------
    def check_drains(self) -> SyncResult:
        """One whole drain check in the caller's thread (tests, and the loop without a
        reader thread): snapshot, read, apply."""
        return self.apply_drain_reading(self.read_drains(self.drain_snapshot()))

    def drain_snapshot(self) -> DrainSnapshot:
        """Under the loop's lock: the queue as it is now, O(queue)."""
        return DrainSnapshot({key: dict(self.queue.for_vs(key))
                              for key in self.queue.virtual_servers()})

    def read_drains(self, snapshot: DrainSnapshot) -> DrainReading:
        """Without the lock: kernel reads only, no engine state touched."""
        return self.drain_reader.read(snapshot)

    def apply_drain_reading(self, reading: DrainReading) -> SyncResult:
        """Under the lock: delete the real servers whose connections are gone or closed, or
        whose deadline passed. Only entries still queued as the very same entry are judged
        (an endpoint that came back, or drained anew, since the snapshot is left alone)."""
        result = SyncResult()
        now = self.clock.wall()
        self.store.expire_pods(now)
        for key, snapped in sorted(reading.snapshot.entries.items()):
            if key not in reading.observed:
                continue  # not read this time
            queued = self.queue.for_vs(key)
            current = {rs: e for rs, e in snapped.items() if queued.get(rs) is e}
            if not current:
                continue
            observed = reading.observed[key]
            conns = {rs: c for rs in current
                     if (c := reading.conns.get((key, rs))) is not None}
            for status in observed or ():
                if status.key in current:
                    self._drain_counts[(key, status.key)] = (
                        status.active_conns, status.inactive_conns)
                    if status.key in conns:
                        self._drain_conns[(key, status.key)] = conns[status.key]
                    else:
                        self._drain_conns.pop((key, status.key), None)
            ops = check_drains(current, observed, now, conns)
            if ops:
                self._apply(self.vs_owner.get(key), ops, result)
        return result

    def next_deadline(self) -> float | None:
        """The earliest deadline in the queue (wall clock), for the loop's timer."""
        return min((e.deadline for e in self.queue), default=None)

    # --- drift audit --------------------------------------------------------------
    def audit_step(self) -> int:
        """Re-read a slice of the kernel and put right what differs from what was applied.
        Spread over calls (`audit_batch` virtual servers each) so a large table never
        causes a burst. Returns the number of differences found. (The daemon does the same
        in three steps, its reads off the loop's lock: audit_snapshot, read_audit,
        apply_audit_reading.)"""
        return self.apply_audit_reading(self.read_audit(self.audit_snapshot()))

    def _changed(self) -> tuple[int, int]:
        """Moves whenever what was applied (or the queue) may have changed."""
        return (self._mutations, self.queue.version)

    def audit_snapshot(self) -> AuditPlan | None:
        """Under the lock: what the next audit step reads."""
        if not self.started:
            return None
        batch = self.config.audit_batch
        if not self._audit_cursor:  # a new round: the virtual servers, then the first batch
            return AuditPlan(self._changed(), True, sorted(self.vs_owner)[:batch])
        return AuditPlan(self._changed(), False, self._audit_cursor[-batch:][::-1])

    def read_audit(self, plan: AuditPlan | None) -> AuditReading | None:
        """Without the lock: kernel reads only."""
        if plan is None:
            return None
        reading = AuditReading(plan)
        if plan.full:
            try:
                reading.virtual_servers = {vs.key: vs for vs in self.kernel.list_virtual_servers()}
            except KernelError as exc:
                self.metrics.netlink_errors.labels(exc.operation or "list_virtual_servers").inc()
        for key in plan.keys:
            try:
                reading.real_servers[key] = {
                    s.key: s.weight for s in self.kernel.list_real_servers(key)}
            except KernelNotFound:
                pass  # the virtual server check of the next round sees it
            except KernelError as exc:
                self.metrics.netlink_errors.labels(exc.operation or "list_real_servers").inc()
        return reading

    def apply_audit_reading(self, reading: AuditReading | None) -> int:
        """Under the lock. A reading taken while anything was applied is dropped whole (it
        could show a change in flight as drift); the same step is read again next time."""
        if reading is None or reading.plan.changed != self._changed():
            return 0
        found = 0
        if reading.plan.full:
            if reading.virtual_servers is not None:
                found += self._audit_virtual_servers(reading.virtual_servers)
            self._audit_cursor = sorted(self.vs_owner, reverse=True)
        for key in reading.plan.keys:
            if self._audit_cursor and self._audit_cursor[-1] == key:
                self._audit_cursor.pop()
            observed = reading.real_servers.get(key)
            if observed is not None:
                found += self._audit_real_servers(key, observed)
        if found:
            self._mutations += 1
        return found

    def _audit_virtual_servers(self, in_kernel: dict[ServiceKey, VirtualServer]) -> int:
        found = 0
        for ref, states in self.applied.items():
            for key, state in list(states.items()):
                vs = in_kernel.get(key)
                if vs is None:
                    self._drift("virtual_server_missing", ref, key)
                    for rs in list(state.weights):
                        self._set_weight(state, rs, None)
                    del states[key]
                    self._n_vs -= 1
                    self._dequeue_vs(key)
                    found += 1
                elif vs != state.vs:
                    self._drift("virtual_server_changed", ref, key)
                    state.vs = vs
                    found += 1
        for key in sorted(in_kernel.keys() - self.vs_owner.keys()):
            if self.owned(key):
                self._drift("virtual_server_unknown", None, key)
                self._delete_orphan(key, 0, SyncResult())
                found += 1
        return found

    def _audit_real_servers(self, key: ServiceKey, observed: dict[RealServerKey, int]) -> int:
        ref = self.vs_owner.get(key)
        state = self.applied.get(ref, {}).get(key) if ref else None
        if state is None:
            return 0
        found = 0
        queued = self.queue.for_vs(key)
        for rs in sorted(state.weights.keys() | observed.keys()):
            if rs in queued:
                if rs not in observed:
                    self.queue.remove(key, rs)
                    self._set_weight(state, rs, None)
                continue  # draining real servers are the drain check's business
            if state.weights.get(rs) != observed.get(rs):
                self._drift("real_server_changed", ref, key, rs)
                self._set_weight(state, rs, observed.get(rs))
                found += 1
        return found

    def _drift(self, kind: str, ref: ServiceRef | None, key: ServiceKey,
               rs: RealServerKey | None = None) -> None:
        self.metrics.drift_repairs.labels(kind).inc()
        log.warning("kernel drift repaired", extra=fields(kind=kind, service=ref, vs=key, rs=rs))
        if ref is not None:
            self.dirty.add(ref)

    # --- status -------------------------------------------------------------------
    def _metrics_gauges(self) -> None:
        m = self.metrics
        m.virtual_servers.set_function(lambda: self._n_vs)
        m.drain_queue_length.set_function(lambda: len(self.queue))
        m.real_servers.labels("draining").set_function(lambda: len(self.queue))
        m.real_servers.labels("active").set_function(
            lambda: max(0, self._n_rs - len(self.queue)))

    def status(self) -> dict[str, Any]:
        """The daemon's part of `ipvsctl status --json`."""
        now = self.clock.wall()
        out: list[dict[str, Any]] = []
        for ref in sorted(self.applied):
            out += self.status_of(ref, now)
        return {
            "node": self.config.node.node_name,
            "ready": self.started,
            "virtual_servers": out,
            "drain_queue": [drain_json(e, now) for e in self.queue],
        }

    def status_of(self, ref: ServiceRef, now: float) -> list[dict[str, Any]]:
        """One Service's virtual servers for `status()` (none if it has none applied):
        the HTTP server renders /status a few Services at a time with this."""
        out: list[dict[str, Any]] = []
        if ref in self.applied:
            desired = self.desired.get(ref)
            endpoints: Mapping[str, Any] = desired.endpoints if desired else {}
            for key, state in sorted(self.applied[ref].items()):
                dvs = desired.virtual_servers.get(key) if desired else None
                rss = []
                for rs, weight in sorted(state.weights.items()):
                    meta = endpoints.get(rs.address)
                    entry = self.queue.get(key, rs)
                    # A removed endpoint's pod is only remembered by its drain entry.
                    pod = (meta.pod if meta else None) or (entry.pod if entry else None)
                    counts = self._drain_counts.get((key, rs)) if entry else None
                    rss.append({
                        "address": rs.address, "port": rs.port, "weight": weight,
                        "pod": str(pod) if pod else None,
                        "node": meta.node_name if meta else None,
                        "state": "draining" if entry else "active",
                        # Read by the drain check; only draining ones are read at all.
                        "active_conns": counts[0] if counts else None,
                        "inactive_conns": counts[1] if counts else None,
                        "drain": (drain_json(entry, now, counts,
                                             self._drain_conns.get((key, rs)))
                                  if entry else None),
                    })
                out.append({
                    "protocol": key.protocol.value, "address": key.address, "port": key.port,
                    "scheduler": state.vs.scheduler,
                    "persistent_timeout": state.vs.persistent_timeout,
                    "service": str(ref), "port_name": dvs.port_name if dvs else None,
                    "kind": dvs.kind.value if dvs else None,
                    "real_servers": rss,
                })
        return out


def drain_json(e: DrainEntry, now: float, counts: tuple[int, int] | None = None,
               conns: ConnCounts | None = None) -> dict[str, Any]:
    d = e.to_json()
    d["age"] = round(max(0.0, now - e.since), 3)
    d["time_left"] = round(max(0.0, e.deadline - now), 3)
    if counts is not None:
        # ActiveConn is the established count; the rest is split only when the
        # connection table was read for this real server (null: not known).
        d["connections"] = (conns.to_json() if conns is not None else {
            "established": counts[0],
            "closing": 0 if counts[1] == 0 else None,
            "closed": 0 if counts[1] == 0 else None})
    return d

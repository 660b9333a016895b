"""Applying ops to the kernel: one small function per op, chosen by a `match` on the op's
type that mypy checks is exhaustive (`assert_never`: a new kind of op fails the type check
until it is applied).

Each function makes the kernel call(s) and records the result in the applied state (and the
drain queue), nothing else: deciding what to do was the planner's job. The one exception to
an op at a time: real servers added to one virtual server one after another go to a kernel
that can (`RealServerBatch`: netlink) as one batch, a Service's endpoints in one send. Every call is
idempotent against a kernel that moved on its own (as Cilium's BPFOps Update/Delete): an
add that finds the entry takes it over, a delete of what is gone is done, and an op that
finds its applied virtual server gone (another program's flush) has the table guard put the
table back as applied first, then runs again (`put_back_if_gone`). A function
returns True when the kernel turned out to hold something the applied state did not know:
then the Service is diffed once more to put it right (`Then.DIFF_AGAIN`).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, assert_never

from ipvsctl.kernel.port import (
    IPVSKernel,
    KernelError,
    KernelExists,
    KernelNotFound,
    RealServerBatch,
)
from ipvsctl.model import (
    NO_DEADLINE,
    ConnectionsCut,
    RealServerKey,
    ServiceKey,
    ServiceRef,
    VirtualServerDrainEvent,
)
from ipvsctl.obs.logging import FailureStreaks, fields
from ipvsctl.obs.metrics import Metrics
from ipvsctl.plan.desired import binds_address
from ipvsctl.plan.ops import (
    AddRealServer,
    AddVirtualServer,
    DeleteRealServer,
    DeleteVirtualServer,
    DeletionReason,
    DrainRealServer,
    DrainVirtualServer,
    ForgetDrain,
    Op,
    RestoreRealServer,
    RetimeDrain,
    UpdateVirtualServer,
)
from ipvsctl.reconcile.applied import AppliedState
from ipvsctl.reconcile.clock import Clock
from ipvsctl.reconcile.feed import ChangeFeed
from ipvsctl.reconcile.termination import Terminations

log = logging.getLogger("ipvsctl.engine")


class ForeignVirtualServer(KernelExists):
    """The virtual server exists and is another tool's (keepalived, an operator's), not a
    Kubernetes service proxy's: it is left alone (CONTRACT "Node safety")."""

    def __init__(self, key: ServiceKey) -> None:
        super().__init__(f"virtual server {key} is another tool's", "add_virtual_server")
        self.key = key


class Then(Enum):
    """What a Service needs after its ops were applied."""

    DONE = "done"  # nothing more
    # The kernel held something the applied state did not know (now recorded), or one of its
    # virtual servers is another tool's (left alone): diff it once more, in this sync.
    DIFF_AGAIN = "diff_again"
    RETRY = "retry"  # an op failed, the rest were not tried: again later, with backoff


@dataclass(frozen=True, slots=True)
class Applied:
    """How applying one Service's ops went."""

    ops: int = 0  # applied
    then: Then = Then.DONE

    @property
    def failed(self) -> bool:
        return self.then is Then.RETRY


@dataclass
class Applier:
    kernel: IPVSKernel
    state: AppliedState
    drains: Terminations
    metrics: Metrics
    clock: Clock
    node_ips: Callable[[], Collection[str]]  # now: they change while running
    # Where a virtual server's drain and the connections a deadline cut are told (feed.py).
    feed: ChangeFeed = field(default_factory=ChangeFeed)
    # A virtual server was deleted: a Service waiting for its key may have it now.
    on_released: Callable[[ServiceKey], None] = lambda key: None
    # Whether an existing virtual server not ours may be taken over: only another
    # Kubernetes service proxy's (plan/ownership.py's `may_take_over`).
    may_take_over: Callable[[ServiceKey], bool] = lambda key: True
    # A Service's virtual server found held by another tool: (Service, key).
    on_foreign: Callable[[ServiceRef | None, ServiceKey], None] = lambda ref, key: None
    # A draining virtual server whose last real server went could not be deleted: its
    # Service is synced again (the diff deletes a draining virtual server left empty).
    on_retry: Callable[[ServiceRef], None] = lambda ref: None
    # Another program's flush (kube-proxy starting, `ipvsadm -C`) that an op meets before
    # the table guard's next pass: the guard puts the table back as applied (draining real
    # servers at 0, their drains kept; True when this key was gone and is back) and the op
    # is tried again on it, where forgetting would have left the drains out.
    put_back_if_gone: Callable[[ServiceKey], bool] = lambda key: False
    _failing: FailureStreaks = field(default_factory=lambda: FailureStreaks(log))  # per Service
    _ok: dict[type, Any] = field(default_factory=dict)  # kernel_ops{result="ok"} per op type

    def __post_init__(self) -> None:
        # Whether the kernel adds a virtual server's real servers in one exchange.
        self._batch = self.kernel if isinstance(self.kernel, RealServerBatch) else None

    def apply(self, ref: ServiceRef | None, ops: list[Op]) -> Applied:
        """Apply in order; stop at the first failure (the Service stays dirty). Real
        servers added to one virtual server one after another go to the kernel as one
        batch: all of them are tried, and each added one is recorded even after one that
        failed (the state says what the kernel holds)."""
        again = False  # the kernel held something unknown
        done = 0
        i, n = 0, len(ops)
        while i < n:
            op = ops[i]
            run = _adds_at(ops, i) if self._batch is not None else ()
            if len(run) > 1:
                added, failure = self._add_real_servers(ref, run)
                done += added
                if failure is not None:
                    return self._failed(ref, *failure, done)
                i += len(run)
                continue
            try:
                self.state.mutations += 1
                again |= _apply_op(self, ref, op)
            except ForeignVirtualServer as exc:
                # Not a failure: the Service is built again without that key, at once (the
                # ops for the key's real servers are never tried).
                self.on_foreign(ref, exc.key)
                return Applied(done, Then.DIFF_AGAIN)
            except KernelError as exc:
                return self._failed(ref, op, exc, done)
            done += 1
            # the queue's bookkeeping (RetimeDrain, ForgetDrain) is no kernel operation
            if not isinstance(op, RetimeDrain | ForgetDrain):
                self._count_ok(op)
            log.debug("applied", extra=fields(service=ref, op=op))
            i += 1
        if ref is not None:
            self._failing.recovered("kernel operations recovered", key=ref, service=ref)
        return Applied(done, Then.DIFF_AGAIN if again else Then.DONE)

    def _add_batch(self, vs: ServiceKey, servers: list[RealServerKey]) -> list[KernelError | None]:
        """The batch; once more when its virtual server had gone and is put back."""
        assert self._batch is not None
        try:
            results = self._batch.add_real_servers(vs, servers, 1)
        except KernelNotFound:
            if not self.put_back_if_gone(vs):
                raise
        else:
            if not isinstance(results[0], KernelNotFound) or not self.put_back_if_gone(vs):
                return results
        return self._batch.add_real_servers(vs, servers, 1)

    def _add_real_servers(
        self, ref: ServiceRef | None, run: list[AddRealServer]
    ) -> tuple[int, tuple[Op, KernelError] | None]:
        """`_add_rs` for a run of adds to one virtual server, in one batch: (how many were
        added, the first failure)."""
        assert self._batch is not None
        vs = run[0].vs
        self.state.mutations += len(run)
        try:
            results = self._add_batch(vs, [op.rs for op in run])
        except KernelError as exc:  # none known added: as a failure of the first
            return 0, (run[0], exc)
        state = self.state.get(ref, vs)
        added = 0
        failure: tuple[Op, KernelError] | None = None
        for op, error in zip(run, results, strict=True):
            if isinstance(error, KernelExists):  # as _add_rs: taken over at weight 1
                try:
                    self.kernel.set_real_server_weight(vs, op.rs, 1)
                    error = None
                except KernelError as exc:
                    error = exc
            if error is not None:
                failure = failure or (op, error)
                continue
            self.state.set_weight(state, op.rs, 1)
            added += 1
            self._count_ok(op)
            log.debug("applied", extra=fields(service=ref, op=op))
        return added, failure

    def _count_ok(self, op: Op) -> None:
        ok = self._ok.get(type(op))
        if ok is None:  # labels() per op was a few percent of an initial sync
            ok = self._ok[type(op)] = self.metrics.kernel_ops.labels(type(op).__name__, "ok")
        ok.inc()

    def _failed(self, ref: ServiceRef | None, op: Op, exc: KernelError, done: int) -> Applied:
        operation = exc.operation or type(op).__name__
        self.metrics.netlink_errors.labels(operation).inc()
        self.metrics.kernel_ops.labels(type(op).__name__, "error").inc()
        if ref is not None:
            self._failing.failed(
                logging.ERROR,
                "kernel operation failed",
                key=ref,
                service=ref,
                op=op,
                operation=operation,
                error=exc,
            )
        return Applied(done, Then.RETRY)

    def delete_orphan(self, key: ServiceKey, real_servers: int) -> bool:
        """A virtual server of ours that no Service wants. Returns whether it is gone."""
        self.state.mutations += 1
        try:
            self.kernel.delete_virtual_server(key, True)
        except KernelNotFound:
            pass
        except KernelError as exc:
            self.metrics.netlink_errors.labels(exc.operation or "delete_virtual_server").inc()
            log.error("kernel operation failed", extra=fields(op=f"del-vs {key}", error=exc))
            return False
        self.forget_vs(None, key, real_servers)
        return True

    def take_over(self, ref: ServiceRef, key: ServiceKey) -> None:
        """`ref` claims a draining virtual server: it becomes `ref`'s, live, in place (its
        real servers keep their connections and drains; `ref`'s diff adds its own)."""
        old = self.state.move(key, ref)
        self.drains.take_over(key)
        self.state.mutations += 1
        self.feed.vs_drain(key, VirtualServerDrainEvent.TAKEN_OVER)
        log.info("draining virtual server taken over", extra=fields(service=ref, vs=key, was=old))

    def finish_vs_drain(self, ref: ServiceRef | None, key: ServiceKey) -> None:
        """A draining virtual server goes with its last real server (CONTRACT.md
        "Draining"): called whenever one of its real servers went."""
        if key not in self.drains.draining_virtual_servers:
            return
        state = self.state.get(ref, key)
        if state is not None and state.weights:
            return
        self.state.mutations += 1
        try:
            # One dump to be sure: a drain check's reading that missed a real server (or
            # the whole virtual server) must never delete one that still carries traffic.
            left = self.kernel.list_real_servers(key)
            if left:
                for status in left:  # back into the state: its Service's diff drains them
                    self.state.set_weight(state, status.key, status.weight)
                log.warning(
                    "draining virtual server still has real servers",
                    extra=fields(service=ref, vs=key, real_servers=len(left)),
                )
                if ref is not None:
                    self.on_retry(ref)
                return
            self.kernel.delete_virtual_server(key, state.bind_address if state else True)
        except KernelNotFound:
            pass
        except KernelError as exc:
            self.metrics.netlink_errors.labels(exc.operation or "delete_virtual_server").inc()
            log.error("kernel operation failed", extra=fields(op=f"del-vs {key}", error=exc))
            if ref is not None:
                self.on_retry(ref)
            return
        self.forget_vs(ref, key, 0)

    def forget_vs(self, ref: ServiceRef | None, key: ServiceKey, real_servers: int) -> None:
        owner = self.state.forget(ref, key)
        draining = key in self.drains.draining_virtual_servers
        self.drains.remove_vs(key)
        if draining:
            self.feed.vs_drain(key, VirtualServerDrainEvent.GONE)
        if real_servers:
            self.metrics.real_server_deletions.labels(DeletionReason.SERVICE_DELETED.value).inc(
                real_servers
            )
        log.info(
            "virtual server deleted", extra=fields(service=owner, vs=key, real_servers=real_servers)
        )
        self.on_released(key)


# --- one function per op ------------------------------------------------------------------


def _add_vs(a: Applier, ref: ServiceRef | None, op: AddVirtualServer) -> bool:
    k = a.kernel
    bind = binds_address(op.kind, op.vs.key.address, a.node_ips())
    try:
        k.add_virtual_server(op.vs, bind)
        weights: dict[RealServerKey, int] = {}
    except KernelExists:
        # Left by an earlier run or another Kubernetes proxy: adopt it as it is. Anyone
        # else's (keepalived's) is never touched.
        if not a.may_take_over(op.vs.key):
            raise ForeignVirtualServer(op.vs.key) from None
        k.update_virtual_server(op.vs)
        weights = {s.key: s.weight for s in k.list_real_servers(op.vs.key)}
    assert ref is not None
    a.state.add(ref, op.vs, bind, weights)
    return bool(weights)


def _update_vs(a: Applier, ref: ServiceRef | None, op: UpdateVirtualServer) -> bool:
    state = a.state.get(ref, op.vs.key)
    gone = False  # deleted by someone else: its real servers are gone with it
    try:
        a.kernel.update_virtual_server(op.vs)
    except KernelNotFound:
        if a.put_back_if_gone(op.vs.key):  # its real servers with it, as applied
            a.kernel.update_virtual_server(op.vs)
        else:
            a.kernel.add_virtual_server(op.vs, state.bind_address if state else True)
            if state:
                for rs in list(state.weights):
                    a.state.set_weight(state, rs, None)
            gone = True
    if state:
        state.vs = op.vs
    return gone


def _delete_vs(a: Applier, ref: ServiceRef | None, op: DeleteVirtualServer) -> bool:
    with contextlib.suppress(KernelNotFound):
        a.kernel.delete_virtual_server(op.key, op.bind_address)
    a.forget_vs(ref, op.key, op.real_servers)
    return False


def _drain_vs(a: Applier, ref: ServiceRef | None, op: DrainVirtualServer) -> bool:
    a.drains.drain_virtual_server(op.key, op.service)
    a.feed.vs_drain(op.key, VirtualServerDrainEvent.DRAINING)
    state = a.state.get(ref, op.key)
    log.info(
        "virtual server draining",
        extra=fields(
            service=op.service, vs=op.key, real_servers=len(state.weights) if state else 0
        ),
    )
    return False


def _add_rs(a: Applier, ref: ServiceRef | None, op: AddRealServer) -> bool:
    try:
        a.kernel.add_real_server(op.vs, op.rs, 1)
    except KernelExists:
        a.kernel.set_real_server_weight(op.vs, op.rs, 1)
    except KernelNotFound:
        if not a.put_back_if_gone(op.vs):
            raise
        a.kernel.add_real_server(op.vs, op.rs, 1)
    a.state.set_weight(a.state.get(ref, op.vs), op.rs, 1)
    return False


def _restore_rs(a: Applier, ref: ServiceRef | None, op: RestoreRealServer) -> bool:
    # Out of the queue before the kernel call: if the call fails, the drain check must not
    # delete a real server that is wanted again (at its deadline, with live connections).
    # The retry restores it (diff: a wanted one at weight 0), and drains it anew if it goes.
    cancelled = a.drains.remove(op.vs, op.rs)
    try:
        a.kernel.set_real_server_weight(op.vs, op.rs, 1)
    except KernelNotFound:
        if a.put_back_if_gone(op.vs):  # back as applied, this one at 0
            a.kernel.set_real_server_weight(op.vs, op.rs, 1)
        else:
            a.kernel.add_real_server(op.vs, op.rs, 1)
    a.state.set_weight(a.state.get(ref, op.vs), op.rs, 1)
    if cancelled:
        log.info("drain cancelled, endpoint back", extra=fields(service=ref, vs=op.vs, rs=op.rs))
    return False


def _drain_rs(a: Applier, ref: ServiceRef | None, op: DrainRealServer) -> bool:
    e = op.entry
    state = a.state.get(ref, e.vs)
    try:
        if state is None or state.weights.get(e.rs) != 0:
            a.kernel.set_real_server_weight(e.vs, e.rs, 0)
    except KernelNotFound:
        if not a.put_back_if_gone(e.vs):
            a.state.set_weight(state, e.rs, None)  # nothing left to drain
            a.finish_vs_drain(ref, e.vs)
            return False
        a.kernel.set_real_server_weight(e.vs, e.rs, 0)  # put back at its applied weight
    a.state.set_weight(state, e.rs, 0)
    a.drains.add(e)
    log.info(
        "drain started",
        extra=fields(
            service=e.service,
            vs=e.vs,
            rs=e.rs,
            reason=e.reason,
            pod=e.pod,
            deadline_in=_deadline_in(e.deadline, e.since),
            deadline_from=e.deadline_source,
        ),
    )
    return False


def _deadline_in(deadline: float, now: float) -> float | None:
    """Seconds to a deadline for a log line; None: none (its pod's lifetime bounds it)."""
    return round(deadline - now, 3) if deadline != NO_DEADLINE else None


def _retime_drain(a: Applier, ref: ServiceRef | None, op: RetimeDrain) -> bool:
    e = op.entry
    if a.drains.replace(e):
        log.info(
            "drain bound changed",
            extra=fields(
                service=e.service,
                vs=e.vs,
                rs=e.rs,
                reason=e.reason,
                pod=e.pod,
                deadline_in=_deadline_in(e.deadline, a.clock.wall()),
                deadline_from=e.deadline_source,
            ),
        )
    return False


# Deletions a drain's deadline made (the connections still open through it are cut).
_CUTTING = frozenset((DeletionReason.DEADLINE, DeletionReason.POD_GONE))


def _delete_rs(a: Applier, ref: ServiceRef | None, op: DeleteRealServer) -> bool:
    # What the drain check that judged it read: the established connections it cuts.
    seen = a.drains.counts(op.vs, op.rs) if op.reason in _CUTTING else None
    with contextlib.suppress(KernelNotFound):
        a.kernel.delete_real_server(op.vs, op.rs)
    if op.flush_conntrack:
        try:
            a.kernel.flush_conntrack(op.vs, op.rs)
        except KernelError as exc:  # the real server is gone either way
            a.metrics.netlink_errors.labels(exc.operation or "flush_conntrack").inc()
            log.warning("conntrack flush failed", extra=fields(vs=op.vs, rs=op.rs, error=exc))
    a.state.set_weight(a.state.get(ref, op.vs), op.rs, None)
    entry = a.drains.remove(op.vs, op.rs)
    a.metrics.real_server_deletions.labels(op.reason.value).inc()
    if entry is not None:
        a.metrics.drain_duration.labels(op.reason.value).observe(
            max(0.0, a.clock.wall() - entry.since)
        )
    established = seen[0] if seen is not None else 0
    log.info(
        "real server deleted",
        extra=fields(
            service=ref or (entry.service if entry else None),
            vs=op.vs,
            rs=op.rs,
            reason=op.reason,
            drained_for=round(a.clock.wall() - entry.since, 3) if entry else None,
            connections_cut=established if op.reason in _CUTTING else None,
        ),
    )
    if established > 0:
        a.metrics.drain_connections_cut.labels(op.vs.protocol.value).inc(established)
        if entry is not None and entry.pod is not None:
            a.feed.connections_cut(
                ConnectionsCut(
                    entry.pod,
                    entry.service or ref,
                    op.vs,
                    op.rs,
                    established,
                    max(0.0, a.clock.wall() - entry.since),
                )
            )
    a.finish_vs_drain(ref, op.vs)
    return False


def _forget_drain(a: Applier, ref: ServiceRef | None, op: ForgetDrain) -> bool:
    a.drains.remove(op.vs, op.rs)
    a.state.set_weight(a.state.get(ref, op.vs), op.rs, None)
    a.finish_vs_drain(ref, op.vs)
    return False


def _adds_at(ops: list[Op], i: int) -> list[AddRealServer]:
    """The run of AddRealServer ops to one virtual server that starts at i (none when
    ops[i] is another op)."""
    first = ops[i]
    if not isinstance(first, AddRealServer):
        return []
    run = [first]
    for op in itertools.islice(ops, i + 1, None):
        if not isinstance(op, AddRealServer) or op.vs != first.vs:
            break
        run.append(op)
    return run


def _apply_op(a: Applier, ref: ServiceRef | None, op: Op) -> bool:
    """The op's function: True when the kernel held something the applied state did not know.
    The commonest ops first."""
    match op:
        case AddRealServer():
            return _add_rs(a, ref, op)
        case AddVirtualServer():
            return _add_vs(a, ref, op)
        case DrainRealServer():
            return _drain_rs(a, ref, op)
        case RetimeDrain():
            return _retime_drain(a, ref, op)
        case RestoreRealServer():
            return _restore_rs(a, ref, op)
        case DeleteRealServer():
            return _delete_rs(a, ref, op)
        case UpdateVirtualServer():
            return _update_vs(a, ref, op)
        case DeleteVirtualServer():
            return _delete_vs(a, ref, op)
        case DrainVirtualServer():
            return _drain_vs(a, ref, op)
        case ForgetDrain():
            return _forget_drain(a, ref, op)
        case _:
            assert_never(op)

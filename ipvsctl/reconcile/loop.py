"""The daemon's main loop: when to sync, separate from what a sync does (the engine).

One thread owns the engine. It wakes on a source event, a retry timer, a drain state write
that is due or the node address check. Events that arrive together are applied as one
batch and synced once (bursts coalesce). A failed sync is retried with capped exponential
backoff; Services the audit repaired are synced at the next turn. The HTTP thread reads
status under `lock`.

The drain check and the audit read the kernel on threads of their own, each run by a
`PacedRunner` (`paced.py`) that takes `lock` only for their snapshot and their apply
(`drain_runner`, `audit_runner`: the daemon starts them; tests step them). While an event
waits or is applied, those readers step aside at their next give-way point
(`events_first.py`): a change does not wait for a reader's Python.

Node addresses (without --node-ip) are re-read every `node_ips_interval`, as kube-proxy
re-reads them every sync, and at once when the followed addresses (`host_addresses`, from
rtnetlink's notifications) changed: NodePort virtual servers follow an address added or
removed. Every address of the node goes to the engine too, with or without --node-ip (Node
safety counts them all).
"""

from __future__ import annotations

import gc
import logging
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import overload

from ipvsctl.kernel.port import HostAddresses, KernelError
from ipvsctl.model import DrainEntry
from ipvsctl.obs import gcpause
from ipvsctl.obs.logging import FailureStreaks, fields
from ipvsctl.reconcile.clock import Clock, SystemClock
from ipvsctl.reconcile.engine import Engine
from ipvsctl.reconcile.events_first import EventsFirst
from ipvsctl.reconcile.paced import Pace, PacedRunner
from ipvsctl.source.events import SourceEvent

log = logging.getLogger("ipvsctl.loop")


@dataclass(frozen=True, slots=True)
class LoopConfig:
    drain_check_interval: float = 1.0
    audit_interval: float = 1.0  # one audit step per interval
    retry_min: float = 0.5
    retry_max: float = 30.0
    max_batch: int = 5000  # events applied before a sync, at most
    idle_wakeup: float = 1.0  # heartbeat for /healthz even when nothing happens
    persist_interval: float = 0.5  # drain state written at most this often (and at exit)
    node_ips_interval: float = 10.0  # node addresses re-read this often (without --node-ip)


STARTUP_GC_GRACE = 300.0  # seconds the GC may stay off waiting for the first sync
AUDIT_DUTY = 9.0  # an audit step waits at least this many times its own duration


class Loop:
    def __init__(
        self,
        engine: Engine,
        events: queue.Queue[SourceEvent],
        config: LoopConfig | None = None,
        *,
        clock: Clock | None = None,
        save_queue: Callable[[Sequence[DrainEntry]], None] | None = None,
        read_node_ips: Callable[[], list[str]] | None = None,
        host_addresses: HostAddresses | None = None,
    ) -> None:
        self.engine = engine
        self.events = events
        self.config = config or LoopConfig()
        self.clock = clock or SystemClock()
        self.save_queue = save_queue
        self.read_node_ips = read_node_ips  # None: fixed addresses (--node-ip)
        # Every address of the node, followed (None: not followed, as in most tests): a
        # change reaches the engine at the next step, and re-reads the NodePort addresses.
        self.host_addresses = host_addresses
        self._host_version = host_addresses.version if host_addresses is not None else 0
        self._node_ips_version = self._host_version
        self.lock = threading.Lock()
        # The readers give way to events (the engine's audit and drain reads call it).
        self.events_first = EventsFirst(events)
        engine.give_way = self.events_first.give_way
        self.heartbeat = self.clock.monotonic()
        self._retry_at: float | None = None
        self._retry_delay = self.config.retry_min
        self.queue = engine.drains.queue  # what the drain state file holds
        self._saved_version = self.queue.version
        self._saved_added = self.queue.added
        self._persist_failing = False  # a failing disk is retried per interval, not per step
        self._next_persist = 0.0
        # The start-up addresses are fresh: the first re-read is one interval after the
        # first step.
        self._next_node_ips: float | None = None
        self._node_ips_failing = FailureStreaks(log)
        self._gc_paused_until: float | None = None  # pause_gc_until_started
        # Drain checks never queue behind the audit (a round start's full dump took ~40 s
        # under emulation at 10,000 Services): each on its own thread. A drain check runs
        # from start to start every interval (a check that read for 0.8 s is followed by the
        # next 0.2 s later: a drain is seen within interval + one read); the audit waits at
        # least AUDIT_DUTY x its read's duration, so an idle node stays idle however slow its
        # reads are, and survives its own failure (a safety net must not end the daemon).
        self.drain_runner = PacedRunner(
            "drain",
            engine.drain_check,
            self.lock,
            Pace(every=self.config.drain_check_interval),
            clock=self.clock,
        )
        self.audit_runner = PacedRunner(
            "audit-reader",
            engine.audit,
            self.lock,
            Pace(
                every=self.config.audit_interval, duty=AUDIT_DUTY, first=self.config.audit_interval
            ),
            clock=self.clock,
            survive=True,
            # its reads at the short switch interval: their dump's parse and sort have no
            # give-way point (not the drain check's: see events_first.py)
            events_first=self.events_first,
            on_health=lambda exc: engine.metrics.degraded.set("audit", exc),
        )

    def run(self, stop: threading.Event) -> None:
        try:
            while not stop.is_set():
                self.step(self._timeout())
        finally:
            self._resume_gc()

    def pause_gc_until_started(self) -> None:
        """Keep the cyclic GC off while the first full list is decoded, parsed and synced
        (the daemon calls this before its threads start): each full collection walks the
        growing heap, ~40% of a 10,000-Service initial sync's CPU on the host. The first
        sync ends it (collect, freeze, enable); so does STARTUP_GC_GRACE without one (an
        API server that never answers must not leave the GC off for good)."""
        if self._gc_paused_until is None:
            gcpause.hold()
            self._gc_paused_until = self.clock.monotonic() + STARTUP_GC_GRACE

    def _resume_gc(self) -> None:
        if self._gc_paused_until is not None:
            self._gc_paused_until = None
            gcpause.release()

    def _timeout(self) -> float:
        now = self.clock.monotonic()
        wake = [now + self.config.idle_wakeup]
        if self._retry_at is not None:
            wake.append(self._retry_at)
        if self.queue.version != self._saved_version:
            wake.append(self._next_persist)
        if self.read_node_ips is not None and self._next_node_ips is not None:
            wake.append(self._next_node_ips)
        return max(0.0, min(wake) - now)

    def step(self, timeout: float = 0.0) -> None:
        """Wait up to `timeout` for events, then do whatever is due. Tests call this."""
        batch: list[SourceEvent] = []
        try:
            batch.append(
                self.events.get(timeout=timeout) if timeout > 0 else self.events.get_nowait()
            )
            self.events_first.took_events()
            while len(batch) < self.config.max_batch:
                batch.append(self.events.get_nowait())
        except queue.Empty:
            pass
        try:
            self._step(batch)
        finally:
            self.events_first.step_done()  # the readers waiting for this step read on

    def _step(self, batch: list[SourceEvent]) -> None:
        if self._gc_paused_until is not None and self.clock.monotonic() >= self._gc_paused_until:
            self._resume_gc()  # no first sync within the grace: the GC back on
        node_ips = self._read_node_ips()  # outside the lock: a netlink dump
        host_ips = self._read_host_ips()
        with self.lock:
            got_events = bool(batch)
            # Each raw object goes as soon as the store has taken what it needs (a first
            # list of 100,000 endpoints is ~60 MB of dicts; a batch of 5,000 slice updates
            # waiting behind a slow apply ~35 MB), not when the whole batch is done.
            batch.reverse()
            while batch:
                self.engine.handle(batch.pop())
            now = self.clock.monotonic()
            e = self.engine
            moved = node_ips is not None and e.set_node_ips(node_ips)
            moved = (host_ips is not None and e.set_host_ips(host_ips)) or moved
            starting = not e.started and (self._retry_at is None or self._retry_due(now))
            if e.ready and (
                starting
                or e.repaired
                or (e.dirty and (got_events or moved or self._retry_due(now)))
            ):
                self._sync(now)
            snapshot = self._persist_snapshot()
            self.heartbeat = self.clock.monotonic()
        if snapshot is not None:  # the fsyncs outside the lock: /status never waits on disk
            self._persist(*snapshot)

    def _read_host_ips(self) -> frozenset[str] | None:
        """The node's own addresses when they changed since the last step, else None
        (O(1): a version compared)."""
        ha = self.host_addresses
        if ha is None or ha.version == self._host_version:
            return None
        self._host_version = ha.version
        return ha.host_addresses()

    def _read_node_ips(self) -> list[str] | None:
        """The node's addresses when a re-read is due (every interval, or at once when the
        followed addresses changed), else None. A failed read keeps the addresses in force:
        dropping every NodePort on a transient netlink error would be worse than following
        a change a little late."""
        if self.read_node_ips is None:
            return None
        now = self.clock.monotonic()
        ha = self.host_addresses
        moved = ha is not None and ha.version != self._node_ips_version
        if moved and ha is not None:
            self._node_ips_version = ha.version
        if self._next_node_ips is not None and now < self._next_node_ips and not moved:
            return None
        first = self._next_node_ips is None
        self._next_node_ips = now + self.config.node_ips_interval
        if first and not moved:
            return None
        try:
            ips = self.read_node_ips()
        except Exception as exc:  # whatever the reason, the current addresses stay
            self.engine.metrics.node_address_errors.inc()
            self._node_ips_failing.failed(
                logging.ERROR, "node addresses unreadable, keeping the current ones", error=exc
            )
            return None
        self._node_ips_failing.recovered("node addresses readable again")
        return ips

    def _retry_due(self, now: float) -> bool:
        return self._retry_at is not None and now >= self._retry_at

    def _sync(self, now: float) -> None:
        was_started = self.engine.started
        try:
            result = self.engine.sync()
        except KernelError as exc:  # e.g. the start-up dump failed: nothing was changed
            self.engine.metrics.netlink_errors.labels(exc.operation or "sync").inc()
            log.error(
                "sync failed, retrying",
                extra=fields(error=exc, retry_in=round(self._retry_delay, 3)),
            )
            self._retry_at = now + self._retry_delay
            self._retry_delay = min(self._retry_delay * 2, self.config.retry_max)
            return
        if self.engine.started and not was_started:
            # The first full state is ~a million long-lived objects at 10,000 Services:
            # keep the cyclic GC from walking them all (pauses of 0.35 s on the host,
            # seconds under emulation; bench hot spot 3).
            gc.collect()
            gc.freeze()
            self._resume_gc()
        if result.failed:
            self._retry_at = now + self._retry_delay
            log.warning(
                "sync incomplete, retrying",
                extra=fields(
                    failed_services=len(result.failed), retry_in=round(self._retry_delay, 3)
                ),
            )
            self._retry_delay = min(self._retry_delay * 2, self.config.retry_max)
        elif result.resync:
            # Not a failure (say the kernel held an entry we did not know): one more pass
            # soon, at the shortest retry interval (never a hot loop), the backoff reset.
            self._retry_at = now + self.config.retry_min
            self._retry_delay = self.config.retry_min
            log.debug("sync needs another pass", extra=fields(services=len(result.resync)))
        else:
            self._retry_at = None
            self._retry_delay = self.config.retry_min

    def _persist_snapshot(self) -> tuple[int, int, QueueView] | None:
        """The queue to write now, if any (called under the lock). A queue that gained an
        entry is written at once: a drain started just before a SIGKILL must keep its
        deadline (a 600 s annotation became the 30 s default after a restart). Other changes
        (deletions, deadline moves) are coalesced to one write per `persist_interval`: a
        whole-queue JSON write with two fsyncs per event halved the loop's throughput.
        O(1): the entries are copied only when the writer reads the view (bench hot spot:
        a sorted copy per step was 63% of the loop's time with 1,000 draining)."""
        q = self.queue
        if self.save_queue is None or q.version == self._saved_version:
            return None
        now = self.clock.monotonic()
        if now < self._next_persist and (self._persist_failing or q.added == self._saved_added):
            return None
        self._next_persist = now + self.config.persist_interval
        return q.version, q.added, QueueView(self)

    def _persist(self, version: int, added: int, entries: QueueView) -> None:
        assert self.save_queue is not None
        try:
            self.save_queue(entries)
            self._saved_version = version
            self._saved_added = added
            self._persist_failing = False
        except OSError as exc:
            self._persist_failing = True
            self.engine.metrics.state_write_errors.inc()
            log.error("drain state write failed", extra=fields(error=exc))


class QueueView(Sequence[DrainEntry]):
    """The drain queue as it is when first read: the copy is made then, under the loop's
    lock, by whoever reads it (the state writer's thread, just before it writes). A view
    the writer replaces by a newer one before writing is never copied at all."""

    def __init__(self, loop: Loop) -> None:
        self._loop = loop
        self._entries: list[DrainEntry] | None = None

    def _get(self) -> list[DrainEntry]:
        if self._entries is None:
            with self._loop.lock:
                self._entries = self._loop.queue.entries()
        return self._entries

    def __len__(self) -> int:
        return len(self._get())

    @overload
    def __getitem__(self, i: int) -> DrainEntry: ...

    @overload
    def __getitem__(self, i: slice) -> list[DrainEntry]: ...

    def __getitem__(self, i: int | slice) -> DrainEntry | list[DrainEntry]:
        return self._get()[i]

    def __iter__(self) -> Iterator[DrainEntry]:
        return iter(self._get())

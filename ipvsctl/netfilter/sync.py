"""Keeps ipvsctl's nftables table in line with the virtual servers, one batch at a time.

- `start()` writes the chains once (idempotently: map elements left by an earlier run stay,
  so a restart opens no window without masquerading).
- `on_service(ref, old, new)` is a service listener on the engine's change feed: called
  after a Service's changes reached IPVS, it compares that Service's elements before and
  after, O(the Service). An endpoint change leaves them equal and costs nothing more.
- A thread (`run`) pushes what changed as one `nft -f` transaction per batch: it takes the
  changes under the loop's lock (`batch_lock`), so a batch is whole syncs, never half of
  one, and runs nft outside it. The first push after the engine is ready replaces every
  element at once (atomically: flush and refill in one transaction); later ones add and
  delete elements. A failed push is retried with backoff as a full replace.
- Every `check_interval` the table's chains, sets and maps (not rules: listing those reads
  every map element, ~1 s at 50,000) are compared with a listing taken right after ipvsctl
  wrote them; every `audit_interval` the rules (the whole table without elements) and then
  the elements are compared too. Missing or changed, the table is rewritten whole,
  elements included, in one transaction; changed elements are refilled.
- With a `generation` reader (the daemon gives kernel/netlink/nftables.py's), every
  `generation_interval` the ruleset's generation is read (one small netlink message); when
  someone else's transaction moved it, the table is looked up at once, and a deleted table
  is put back within a second instead of at the next check.
"""

from __future__ import annotations

import ipaddress
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Protocol

from ipvsctl.model import (
    DesiredService,
    ServiceKey,
    ServiceRef,
    VirtualServerDrainEvent,
    normalize_ip,
)
from ipvsctl.model import Protocol as L4Protocol
from ipvsctl.netfilter.nft import NftError, NftPermissionDenied, NftUnavailable
from ipvsctl.netfilter.ruleset import (
    Element,
    FilterItem,
    RulesetConfig,
    Verdict,
    allow_name,
    base_ruleset,
    delete_table_ruleset,
    delta_ruleset,
    element_delta,
    filter_counts,
    filter_items,
    firewall_name,
    map_name,
    replace_elements_ruleset,
    replace_table_ruleset,
    service_elements,
    vip_ports_name,
    vips_name,
)
from ipvsctl.obs.logging import fields
from ipvsctl.obs.metrics import Metrics

log = logging.getLogger("ipvsctl.netfilter")


class NftRunner(Protocol):
    """What the sync needs of nft (netfilter.nft.Nft; tests use a fake)."""

    def apply(self, script: str, operation: str) -> None: ...

    def list_table(self, target: str, operation: str = "check") -> str | None: ...

    def list_declarations(self, target: str, operation: str = "check") -> str | None: ...

    def list_map(
        self, target: str, name: str, operation: str = "check"
    ) -> list[tuple[str, str, int, str]] | None: ...

    def list_set(
        self, target: str, name: str, operation: str = "check"
    ) -> list[tuple[str, ...]] | None: ...


@dataclass(frozen=True, slots=True)
class SyncConfig:
    ruleset: RulesetConfig = field(default_factory=RulesetConfig)
    check_interval: float = 30.0  # chains, sets, maps compared with what was written
    audit_interval: float = 300.0  # rules and elements compared with what was written
    retry_min: float = 0.5
    retry_max: float = 30.0
    idle: float = 1.0  # longest sleep while something waits for the engine to be ready
    generation_interval: float = 1.0  # the ruleset's generation read, with a reader


class GenerationReader(Protocol):
    """nftables' ruleset generation and whether ipvsctl's table exists (OSError when it
    cannot say)."""

    def generation(self) -> int: ...

    def table_exists(self) -> bool: ...


class NetfilterSync:
    def __init__(
        self,
        nft: NftRunner,
        config: SyncConfig | None = None,
        *,
        batch_lock: AbstractContextManager[object] | None = None,
        ready: Callable[[], bool] = lambda: True,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        node_ips: Callable[[], Collection[str]] = tuple,
        generation: GenerationReader | None = None,
    ) -> None:
        self.nft = nft
        self.generation = generation
        self._generation_seen: int | None = None  # after ipvsctl's own last transaction
        self.config = config or SyncConfig()
        self.batch_lock = batch_lock
        self.ready = ready
        self.metrics = metrics
        self.clock = clock
        self.node_ips = node_ips  # the node's own addresses: never in the port filter
        self.desired: dict[ServiceKey, Element] = {}
        self.owner: dict[ServiceKey, ServiceRef] = {}
        self.applied: dict[ServiceKey, Element] = {}
        # port-filter set elements (`filter_counts`) of `desired` and of `applied`
        self.desired_counts: Counter[FilterItem] = Counter()
        self.applied_counts: Counter[FilterItem] = Counter()
        self.touched: set[ServiceKey] = set()
        # Virtual servers that left their Service and drain: their elements stay (the port
        # filter keeps covering their still-bound address) until they go.
        self.draining: set[ServiceKey] = set()
        self.needs_replace = True  # the first push after start-up rewrites every element
        self.needs_table = False  # the table went missing or was changed by someone else
        # (declarations, terse table listing) right after ipvsctl wrote the table
        self.baseline: tuple[str | None, str | None] = (None, None)
        # The node was handed over to another proxy: the table goes, then nothing more.
        self.releasing = False
        self.released = False
        self.wake = threading.Event()
        self._lock = threading.Lock()
        self._retry_at: float | None = None
        self._retry_delay = self.config.retry_min
        now = self.clock()
        self._next_check = now + self.config.check_interval
        self._next_audit = now + self.config.audit_interval
        self._next_generation = now

    @property
    def target(self) -> str:
        return self.config.ruleset.target

    # --- the listener -----------------------------------------------------------------------
    def on_service(
        self, ref: ServiceRef, old: DesiredService | None, new: DesiredService | None
    ) -> None:
        """A service listener: note this Service's element changes, O(the Service)."""
        nodes = frozenset(self.node_ips())
        old_el, new_el = service_elements(old, nodes), service_elements(new, nodes)
        if old_el == new_el:
            return  # endpoints only: nothing for nftables
        with self._lock:
            for key in old_el.keys() - new_el.keys():
                if self.owner.get(key) == ref and key not in self.draining:
                    del self.owner[key]
                    self.desired_counts.subtract(filter_items(key, self.desired.pop(key)))
                    self.touched.add(key)
            for key, element in new_el.items():
                if self.desired.get(key) != element or self.owner.get(key) != ref:
                    if key in self.desired:
                        self.desired_counts.subtract(filter_items(key, self.desired[key]))
                    self.desired[key] = element
                    self.desired_counts.update(filter_items(key, element))
                    self.owner[key] = ref
                    self.touched.add(key)
        self.wake.set()

    def on_virtual_server_drain(self, key: ServiceKey, event: VirtualServerDrainEvent) -> None:
        """Engine listener: a draining virtual server keeps its element until it goes."""
        with self._lock:
            if event is VirtualServerDrainEvent.DRAINING:
                self.draining.add(key)
                return
            self.draining.discard(key)
            if event is VirtualServerDrainEvent.GONE and key in self.desired:
                del self.owner[key]
                self.desired_counts.subtract(filter_items(key, self.desired.pop(key)))
                self.touched.add(key)
        self.wake.set()

    # --- writing ----------------------------------------------------------------------------
    def start(self) -> None:
        """Write the chains (elements already in the maps stay). Raises NftError: at start-up
        a failure is fatal, with nft's reason in one line."""
        try:
            self.nft.apply(base_ruleset(self.config.ruleset), "base")
        except (NftUnavailable, NftPermissionDenied):
            raise
        except NftError as exc:
            # e.g. maps of another ipvsctl version: build the table afresh (its elements
            # come back with the first push, moments later)
            log.warning(
                "nftables table not updatable in place, replacing it",
                extra=fields(table=self.target, error=exc),
            )
            self.nft.apply(replace_table_ruleset(self.config.ruleset, {}), "table")
        self._take_baseline()
        log.info(
            "nftables table written",
            extra=fields(
                table=self.target,
                cluster_cidrs=",".join(self.config.ruleset.cluster_cidrs) or "-",
                masquerade_all=self.config.ruleset.masquerade_all,
            ),
        )

    def pending(self) -> bool:
        with self._lock:
            return bool(self.needs_table or self.needs_replace or self.touched)

    def flush(self) -> bool:
        """Push what changed since the last push, as one transaction. False if nft failed
        (the next push then replaces every element)."""
        with self.batch_lock if self.batch_lock is not None else nullcontext():
            if not self.ready():
                return True  # the first full sync has not reached the kernel yet
            with self._lock:
                if self.needs_table or self.needs_replace:
                    kind = "table" if self.needs_table else "replace"
                    elements = dict(self.desired)
                    self.touched = set()
                    delta = None
                elif self.touched:
                    kind, elements = "elements", {}
                    touched, self.touched = self.touched, set()
                    delta = element_delta(
                        self.applied,
                        self.desired,
                        touched,
                        self.applied_counts,
                        self.desired_counts,
                    )
                    if not delta:
                        return True
                else:
                    return True
        cfg = self.config.ruleset
        t0 = self.clock()
        try:
            if kind == "table":
                self.nft.apply(replace_table_ruleset(cfg, elements), kind)
                self._take_baseline()
            elif kind == "replace":
                self.nft.apply(replace_elements_ruleset(cfg, elements), kind)
            else:
                assert delta is not None
                self.nft.apply(delta_ruleset(cfg, delta), kind)
        except NftError as exc:
            with self._lock:
                self.needs_replace = True  # we no longer know what the maps hold
                if kind == "table":
                    self.needs_table = True
            if self.metrics is not None:
                self.metrics.degraded.set("nftables", exc)
            return False
        if self.metrics is not None:
            self.metrics.degraded.set("nftables", None)
        with self._lock:
            if delta is None:
                self.applied = elements
                self.applied_counts = filter_counts(elements.items())
                self.needs_replace = False
                if kind == "table":
                    self.needs_table = False
            else:
                for key, el in delta.delete:
                    self.applied.pop(key, None)
                    self.applied_counts.subtract(filter_items(key, el))
                for key, el in delta.add:
                    self.applied_counts.update(filter_items(key, el))
                self.applied.update(delta.add)
            n = len(self.applied)
        if self.metrics is not None:
            self.metrics.netfilter_elements.set(n)
        if delta is None:
            log.info(
                "nftables elements written",
                extra=fields(how=kind, elements=n, seconds=round(self.clock() - t0, 3)),
            )
        else:
            log.debug(
                "nftables elements changed",
                extra=fields(added=len(delta.add), deleted=len(delta.delete)),
            )
        return True

    # --- checking ---------------------------------------------------------------------------
    def _take_baseline(self) -> None:
        self.baseline = (self.nft.list_declarations(self.target), self.nft.list_table(self.target))

    def check(self) -> bool:
        """Are the table's chains, sets and maps as ipvsctl wrote them? If not, schedule a
        rewrite of the whole table. True when they are."""
        try:
            text = self.nft.list_declarations(self.target)
        except NftError:
            return False  # counted and logged by the adapter; try again next time
        return self._compare(text, self.baseline[0])

    def _look_for_the_table(self) -> None:
        """Someone's transaction moved the generation: is the table still there? A missing
        one is put back whole, as the check would (counted as a restore)."""
        assert self.generation is not None
        try:
            seen = self.generation.generation()
            if seen == self._generation_seen:
                return
            self._generation_seen = seen
            if self.generation.table_exists():
                return
        except OSError as exc:  # the periodic check still covers it
            log.debug("nftables generation unreadable", extra=fields(error=exc))
            return
        with self._lock:
            if self.needs_table:
                return  # already being put back
        self._compare(None, self.baseline[0])

    def _after_own_transaction(self) -> None:
        """The generation ipvsctl's own push left: not someone else's change."""
        if self.generation is None:
            return
        try:
            self._generation_seen = self.generation.generation()
        except OSError:
            self._generation_seen = None

    def _compare(self, text: str | None, baseline: str | None) -> bool:
        if text is not None and text == baseline:
            return True
        if text is None and self.metrics is not None:  # deleted: put back whole
            self.metrics.table_restores.labels("nftables").inc()
        self._repair(
            "table",
            "nftables table missing" if text is None else "nftables table changed by someone else",
        )
        return False

    def audit(self) -> bool:
        """Are the rules, then the map elements, those last written? If not, schedule a
        rewrite of the table, or a refill of the elements."""
        try:
            text = self.nft.list_table(self.target)
        except NftError:
            return False
        if not self._compare(text, self.baseline[1]):
            return False
        found: dict[ServiceKey, Verdict] = {}
        found_sets: set[tuple[str, ...]] = set()
        strange = False  # an element ipvsctl never writes
        try:
            for family in (4, 6):
                items = self.nft.list_map(self.target, map_name(family))
                if items is None:
                    return self.check()
                for address, proto, port, target in items:
                    try:
                        key = ServiceKey(L4Protocol(proto.upper()), normalize_ip(address), port)
                        found[key] = Verdict(target)
                    except ValueError:
                        strange = True
                for name in (
                    firewall_name(family),
                    allow_name(family),
                    vips_name(family),
                    vip_ports_name(family),
                ):
                    elements = self.nft.list_set(self.target, name)
                    if elements is None:
                        return self.check()
                    for fields_ in elements:
                        try:
                            found_sets.add((name, *_normalized(fields_)))
                        except (ValueError, TypeError):
                            strange = True
        except NftError:
            return False
        with self._lock:
            applied = {k: e.verdict for k, e in self.applied.items()}
            wanted_sets = _set_elements(self.applied) | {
                item for item, n in self.applied_counts.items() if n > 0
            }
            same = (
                (not strange and found == applied and found_sets == wanted_sets)
                or self.needs_replace
                or self.needs_table
            )
        if not same:
            self._repair("elements", "nftables elements changed by someone else")
        return same

    def _repair(self, kind: str, message: str) -> None:
        if self.metrics is not None:
            self.metrics.netfilter_repairs.labels(kind).inc()
        log.warning(message, extra=fields(table=self.target, repair=kind))
        with self._lock:
            self.needs_replace = True
            if kind == "table":
                self.needs_table = True
        self.wake.set()

    def hand_over(self) -> None:
        """The node is handed over (a feed listener, on the loop's thread): the table is
        deleted at the thread's next step, and nothing is written, checked or repaired
        after that."""
        self.releasing = True
        self.wake.set()

    def _release(self, now: float) -> None:
        try:
            self.nft.apply(delete_table_ruleset(self.config.ruleset), "delete")
        except NftError as exc:
            self._retry_at = now + self._retry_delay
            self._retry_delay = min(self._retry_delay * 2, self.config.retry_max)
            log.error("nftables table not deleted, retrying", extra=fields(error=exc))
            return
        self.released = True
        log.info("nftables table deleted: the node is handed over", extra=fields(table=self.target))

    # --- the thread -------------------------------------------------------------------------
    def step(self) -> None:
        """Whatever is due now: push, check, audit. The thread calls this; tests too."""
        now = self.clock()
        if self.releasing:
            if not self.released and (self._retry_at is None or now >= self._retry_at):
                self._release(now)
            return
        if self.generation is not None and now >= self._next_generation:
            self._next_generation = now + self.config.generation_interval
            self._look_for_the_table()
        if now >= self._next_check:
            self._next_check = now + self.config.check_interval
            self.check()
        if now >= self._next_audit:
            self._next_audit = now + self.config.audit_interval
            self.audit()
        if self._retry_at is not None and now < self._retry_at:
            return
        pushing = self.generation is not None and self.pending()
        if self.flush():
            if pushing:
                self._after_own_transaction()
            self._retry_at = None
            self._retry_delay = self.config.retry_min
        else:
            self._retry_at = now + self._retry_delay
            log.warning(
                "nftables push failed, retrying", extra=fields(retry_in=round(self._retry_delay, 3))
            )
            self._retry_delay = min(self._retry_delay * 2, self.config.retry_max)

    def _timeout(self) -> float:
        now = self.clock()
        if self.released:
            return 3600.0  # idle: only the stop event ends the wait
        wake = [self._next_check, self._next_audit]
        if self.generation is not None:
            wake.append(self._next_generation)
        if self._retry_at is not None:
            wake.append(self._retry_at)
        elif self.pending():
            wake.append(now + self.config.idle)
        return max(0.0, min(wake) - now)

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self.wake.wait(self._timeout())
            self.wake.clear()
            if stop.is_set():
                return
            self.step()


def _normalized(fields_: tuple[str, ...]) -> tuple[str, ...]:
    """A listed source-range set element as ipvsctl writes it: address, protocol, port and,
    in the allow sets, a CIDR (nft lists a /32 or /128 as a bare address); in the vips sets
    the address alone."""
    if len(fields_) == 1:
        return (normalize_ip(fields_[0]),)
    address, proto, port, *rest = fields_
    out = (normalize_ip(address), proto, str(int(port)))
    return out + tuple(ipaddress.ip_network(c, strict=False).compressed for c in rest)


def _set_elements(elements: Mapping[ServiceKey, Element]) -> set[tuple[str, ...]]:
    """What the source-range sets hold for these elements, as `_normalized` gives it."""
    out: set[tuple[str, ...]] = set()
    for key, el in elements.items():
        if el.source_ranges is None:
            continue
        head = (key.address, key.protocol.value.lower(), str(key.port))
        out.add((firewall_name(key.family), *head))
        for cidr in el.source_ranges:
            if (":" in cidr) == (key.family == 6):
                out.add((allow_name(key.family), *head, cidr))
    return out

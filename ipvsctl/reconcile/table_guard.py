"""The table guard: what ipvsctl programmed, put back when another program removes it
(CONTRACT.md "Beside another proxy"; docs/netfilter.md "The hold rules").

kube-proxy in nftables mode runs its IPVS cleanup whenever it starts (`ipvsadm -C`, then
`kube-ipvs0` deleted); so does an operator's `ipvsadm -C`. Nothing else would put the table
back before the next change or audit, and every flow through it waits meanwhile (held by
the hold rules) or is lost.

Noticing it costs O(1) per pass, whatever the table's size: the kernel answers a get of one
virtual server (`sentinel`: one the daemon applied, its real servers read) and the
interface's presence is one lookup; IPVS has no notifications. A pass that finds both is
all the guard ever does while nothing happens. When the sentinel is gone, one dump of the
virtual servers (no real servers) says which are missing, and each missing one is added
back from the applied state, with every real server at the weight it had (draining ones at
0, their drain deadlines untouched: the queue never left the engine); the kernel takes a
re-added real server's connections back from its trash. When the interface is gone, it is
made again with every address a virtual server binds.

A background read (`paced.py`): `snapshot` (under the lock: the sentinel, the applied
state's mutation count), `read` (off it: the get and the lookup), `apply` (under it: the
restore, if nothing was applied meanwhile; a reading taken while the engine changed the
table is dropped, as the audit's). The restore runs under the loop's lock: the engine
applies nothing to a table half put back.

For `ipvsctl handover` (its state "adds nothing new but still restores"): the guard
restores what the applied state holds, whatever the engine does next; `restore()` is one
restore now, and `on_restore` hears each (what, how many).

The drift audit's dump can see a flush before the guard's next pass does: it hands the
missing virtual servers to `put_back`, the same restore (draining real servers at 0, the
queue kept, counted and reported as the guard's), rather than forgetting them and letting
the next sync add only the wanted real servers back. So can an op of the engine's (an
event for a flushed Service, in the half second before the pass): `put_back_if_gone`
puts the whole table back before the op is tried again. The engine owns the one guard for all.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from ipvsctl.kernel.port import (
    IPVSKernel,
    KernelError,
    KernelExists,
    KernelNotFound,
    RealServerBatch,
    add_each,
)
from ipvsctl.model import RealServerKey, Restored, ServiceKey
from ipvsctl.obs.logging import fields
from ipvsctl.reconcile.applied import AppliedState

log = logging.getLogger("ipvsctl.guard")

IPVS = "ipvs"
INTERFACE = "interface"
NFTABLES = "nftables"
# Restores this close together mean another program keeps removing the table (a kube-proxy
# DaemonSet crash-looping on the node, an installer re-applying it): degraded until quiet.
KEEPS_HAPPENING = 3
WINDOW = 600.0  # seconds


@runtime_checkable
class VirtualInterface(Protocol):
    """The dummy interface that holds the virtual IPs, as the guard needs it
    (NetlinkKernel's; the in-memory kernel has no interface)."""

    def interface_present(self) -> bool: ...

    def bind_address(self, address: str) -> None: ...


@dataclass(frozen=True, slots=True)
class GuardPlan:
    sentinel: ServiceKey | None  # an applied virtual server; None: nothing applied
    mutations: int  # the applied state's count when taken
    interface: bool  # an address is bound: the interface must be there


@dataclass(frozen=True, slots=True)
class GuardReading:
    plan: GuardPlan
    ipvs_gone: bool
    interface_gone: bool


class TableGuard:
    def __init__(
        self,
        kernel: IPVSKernel,
        state: AppliedState,
        *,
        interface: VirtualInterface | None = None,
        ready: Callable[[], bool] = lambda: True,
        on_restore: Callable[[Restored], None] = lambda r: None,
        on_recurring: Callable[[bool], None] = lambda recurring: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kernel = kernel
        self.state = state
        self.interface = interface
        self.ready = ready  # the first sync is done: there is an applied state to guard
        self.on_restore = on_restore  # each restore (the metric, the Node's Event)
        self.on_recurring = on_recurring  # True: it keeps happening; False: quiet again
        self.clock = clock
        self._sentinel: ServiceKey | None = None
        self.restores = 0
        self._recent: deque[float] = deque()
        self.recurring = False

    def _note_restore(self) -> None:
        self._recent.append(self.clock())
        self._check_recurring()

    def _check_recurring(self) -> None:
        now = self.clock()
        while self._recent and self._recent[0] < now - WINDOW:
            self._recent.popleft()
        recurring = len(self._recent) >= KEEPS_HAPPENING
        if recurring != self.recurring:
            self.recurring = recurring
            self.on_recurring(recurring)

    # --- the background read --------------------------------------------------------------
    def snapshot(self) -> GuardPlan | None:
        """Under the lock: O(1) but when the sentinel left the applied state (then the
        first owned key, also O(1) amortized: dict iteration)."""
        if not self.ready():
            return None
        if self.recurring:
            self._check_recurring()  # quiet for a window: no longer degraded
        owner = self.state.owner
        if self._sentinel not in owner:
            self._sentinel = next(iter(owner), None)
        bound = self.interface is not None and self.state.n_vs > 0
        if self._sentinel is None and not bound:
            return None
        return GuardPlan(self._sentinel, self.state.mutations, bound)

    def read(self, plan: GuardPlan) -> GuardReading:
        ipvs_gone = plan.sentinel is not None and self._gone(plan.sentinel)
        return GuardReading(plan, ipvs_gone, plan.interface and self._interface_gone())

    def apply(self, reading: GuardReading) -> Restored | None:
        """Under the lock: put back what is gone, unless the engine applied something
        since the snapshot (its own deletion of the sentinel, say): the next pass looks
        again."""
        if not (reading.ipvs_gone or reading.interface_gone):
            return None
        if self.state.mutations != reading.plan.mutations:
            return None
        return self.restore(ipvs=reading.ipvs_gone, interface=reading.interface_gone)

    # --- the restore ------------------------------------------------------------------------
    def restore(self, *, ipvs: bool = True, interface: bool = True) -> Restored:
        """Under the loop's lock: every applied virtual server missing from the kernel back
        with its real servers at their applied weights; with `interface`, the interface and
        every address a virtual server binds. Idempotent: what is there stays."""
        return self._restore(None, ipvs=ipvs, interface=interface)[0]

    def put_back(self, missing: Collection[ServiceKey]) -> set[ServiceKey]:
        """Under the loop's lock: the applied virtual servers another reader (the audit's
        dump) found missing, put back as `restore` does, without a dump of its own (and the
        interface's addresses, when it went too). Returns those now in the kernel; the rest
        are the caller's to repair."""
        return self._restore(set(missing), ipvs=True, interface=self._interface_gone())[1]

    def put_back_if_gone(self, key: ServiceKey) -> bool:
        """Under the loop's lock: an op of the engine's got not-found on `key` or one of
        its real servers. When the applied virtual server itself is gone (a flush the op met
        before the guard's pass), the whole table is put back now, as `restore` does: a
        flush rarely takes one, and the guard would not look further once its sentinel is
        back. True when `key` was gone and is back."""
        if self.state.get(None, key) is None or not self._gone(key):
            return False
        return key in self._restore(None, ipvs=True, interface=self._interface_gone())[1]

    def _gone(self, key: ServiceKey) -> bool:
        """One get of the virtual server (its real servers read)."""
        try:
            self.kernel.list_real_servers(key)
        except KernelNotFound:
            return True
        except KernelError:
            pass  # the kernel's trouble, counted by the adapter: next pass
        return False

    def _interface_gone(self) -> bool:
        if self.interface is None:
            return False
        with contextlib.suppress(KernelError):
            return not self.interface.interface_present()
        return False  # not readable: the next pass looks again

    def _restore(
        self, only: set[ServiceKey] | None, *, ipvs: bool, interface: bool
    ) -> tuple[Restored, set[ServiceKey]]:
        done = Restored()
        readded: set[ServiceKey] = set()
        if ipvs:
            readded = self._restore_ipvs(done, only)  # each re-added one binds its address
        if interface and self.interface is not None and self._restore_addresses(done, readded):
            done.what.append(INTERFACE)
        self._report(done)
        return done, readded

    def _report(self, done: Restored) -> None:
        if done.what:
            self.restores += 1
            log.warning(
                "IPVS table restored after another program removed it",
                extra=fields(
                    what=",".join(done.what),
                    virtual_servers=done.virtual_servers,
                    real_servers=done.real_servers,
                    addresses=done.addresses,
                    failed=done.failed,
                ),
            )
            self.on_restore(done)
            self._note_restore()

    def _restore_addresses(self, done: Restored, readded: set[ServiceKey]) -> bool:
        """Every address a virtual server binds, but those the re-added ones bound again;
        True when any address is back (bound here or by a re-added virtual server)."""
        assert self.interface is not None
        bound = {k.address for k in readded if (a := self.state.get(None, k)) and a.bind_address}
        addresses = sorted(
            {
                key.address
                for services in self.state.by_service.values()
                for key, applied in services.items()
                if applied.bind_address and key.address not in bound
            }
        )
        for address in addresses:
            try:
                self.interface.bind_address(address)  # the interface too, when missing
                done.addresses += 1
            except KernelError as exc:
                done.failed += 1
                log.error("address not restored", extra=fields(address=address, error=exc))
        return bool(done.addresses or bound)

    def _restore_ipvs(self, done: Restored, only: set[ServiceKey] | None) -> set[ServiceKey]:
        """Every applied virtual server missing from a dump (or each of `only`, known
        missing: O(them), no dump) back with its real servers. Returns those put back."""
        readded: set[ServiceKey] = set()
        if only is not None:
            missing = [(key, a) for key in only if (a := self.state.get(None, key)) is not None]
        else:
            try:
                present = {vs.key for vs in self.kernel.list_virtual_servers()}
            except KernelError as exc:
                log.error("IPVS table not readable, restore retried", extra=fields(error=exc))
                done.failed += 1
                return readded
            missing = [
                (key, applied)
                for services in self.state.by_service.values()
                for key, applied in services.items()
                if key not in present
            ]
        for key, applied in missing:
            try:
                self.kernel.add_virtual_server(applied.vs, applied.bind_address)
            except KernelExists:
                pass
            except KernelError as exc:
                done.failed += 1
                log.error("virtual server not restored", extra=fields(vs=key, error=exc))
                continue
            done.virtual_servers += 1
            readded.add(key)
            done.real_servers += self._restore_real_servers(key, applied.weights, done)
        if done.virtual_servers:
            done.what.append(IPVS)
        return readded

    def _restore_real_servers(
        self, key: ServiceKey, weights: Mapping[RealServerKey, int], done: Restored
    ) -> int:
        """In one netlink send per weight where the kernel takes batches (as the engine's
        adds), else one call each."""
        by_weight: dict[int, list[RealServerKey]] = {}
        for rs, weight in weights.items():
            by_weight.setdefault(weight, []).append(rs)
        n = 0
        for weight, servers in by_weight.items():
            if isinstance(self.kernel, RealServerBatch):
                results = self.kernel.add_real_servers(key, servers, weight)
            else:
                results = add_each(self.kernel, key, servers, weight)
            for rs, exc in zip(servers, results, strict=True):
                if exc is None or isinstance(exc, KernelExists):
                    n += 1
                    continue
                done.failed += 1
                log.error("real server not restored", extra=fields(vs=key, rs=rs, error=exc))
        return n

"""The drain check, as a background read (`paced.py`): which draining real servers can go.

snapshot  under the lock: the queue as it is now, one shallow copy (`Terminations`)
read      off the lock: the kernel's counts and connection states (`drain_reader.py`),
          judged by the pure rule (`plan/drain.py`); no engine state touched
apply     under the lock: delete the real servers whose connections are gone or closed,
          or whose deadline passed, if their entries are still the very ones judged
          (`Terminations.accept`: a count read before an endpoint came back never
          deletes it); O(the deletions), not O(queue)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ipvsctl.model import ServiceRef
from ipvsctl.reconcile.applied import AppliedState
from ipvsctl.reconcile.apply import Applier
from ipvsctl.reconcile.clock import Clock
from ipvsctl.reconcile.drain_reader import DrainReader, DrainSnapshot
from ipvsctl.reconcile.termination import DrainVerdict, Terminations


@dataclass(slots=True)
class DrainCheckResult:
    ops: int = 0  # kernel operations applied
    # A deletion failed: the entry stays queued and the next check tries again.
    failed: set[ServiceRef] = field(default_factory=set)


class DrainCheck:
    def __init__(
        self,
        drains: Terminations,
        reader: DrainReader,
        applier: Applier,
        state: AppliedState,
        clock: Clock,
        ready: Callable[[], bool],
    ) -> None:
        self.drains = drains
        self.reader = reader
        self.applier = applier
        self.state = state
        self.clock = clock
        self.ready = ready  # the first sync is done: the queue is the kernel's

    def snapshot(self) -> DrainSnapshot | None:
        if not self.ready() or not len(self.drains):
            return None
        return self.drains.snapshot()

    def read(self, snapshot: DrainSnapshot) -> DrainVerdict:
        reading = self.reader.read(snapshot)
        return self.drains.judge(reading, self.clock.wall(), self.reader.give_way)

    def apply(self, verdict: DrainVerdict) -> DrainCheckResult:
        result = DrainCheckResult()
        for key, ops in self.drains.accept(verdict):
            ref = self.state.owner.get(key)
            outcome = self.applier.apply(ref, ops)
            result.ops += outcome.ops
            if outcome.failed and ref is not None:
                result.failed.add(ref)
        return result

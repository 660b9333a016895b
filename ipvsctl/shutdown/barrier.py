"""The shutdown barrier as a pure state machine: no I/O, no sleeping, no clock of its own.

The caller (ipvsctl.shutdown.runner) feeds it observations with the time they were made and
does what the returned action says:

    action = barrier.start(now)
    Wait(until)          sleep until `until`, then     barrier.on_timer(now)
    Discover()           find the daemons, then        barrier.on_daemons(now, urls | Failure)
    Query(daemons, t, g) GET /v1/quiesced from each    barrier.on_answers(now, {url: answer}, g)
    CountConnections(g)  read /proc/net/tcp{,6}        barrier.on_connections(now, n | Failure, g)
    Finish(result)       done; every later call returns the same Finish

Callers: the first `/shutdown` starts a barrier; another caller while it runs `join`s it:
the deadline becomes the latest caller's (arrival + --timeout), and the daemons stage starts
over (every daemon asked again, answers to queries sent before the join ignored), so the
result each caller gets is made of observations from after its own arrival. A caller whose
own deadline passes first gets `result_now()` (a timeout) while the barrier goes on for the
others. A finished barrier is never reused (the runner starts a new one): an early call, by
the app before the pod is terminating or by anyone else, cannot leave a result behind that a
later preStop would return at once.

Stages: `delay` (--check-delay), `daemons` (every daemon found says the pod's IPs are
quiesced), `connections` (the pod's established connections <= --min-open-connections),
then `done`. Whatever the stage, an observation made at or after the deadline
(start + --timeout) finishes the barrier with outcome `timeout`; waits never reach past
the deadline. What happened is reported as `Note`s (taken with `take_notes()`) for the
runner to log, and in the `BarrierResult`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

NAMED_AT_TIMEOUT = 20  # daemons named one per log line at a timeout; the response has all


class Stage(StrEnum):
    DELAY = "delay"
    DAEMONS = "daemons"
    CONNECTIONS = "connections"
    DONE = "done"


class Outcome(StrEnum):
    DRAINED = "drained"  # every daemon quiesced, connections at or below the minimum
    QUIESCED = "quiesced"  # every daemon quiesced; connections not watched
    TIMEOUT = "timeout"


@dataclass(frozen=True, slots=True)
class BarrierConfig:
    check_interval: float = 1.0
    """Seconds between rounds of daemon queries or connection counts."""
    check_delay: float = 0.0
    """Seconds to wait after the first call before the first check."""
    min_open_connections: int = 0
    """The connections stage ends when the pod has this many established connections or fewer."""
    timeout: float = 25.0
    """The barrier ends at start + timeout whatever it is waiting for."""
    wait_connections: bool = True
    """False: end as soon as every daemon is quiesced (no connections stage)."""
    query_timeout: float = 2.0
    """Longest single daemon query; it is also cut to the time left before the deadline."""

    def __post_init__(self) -> None:
        if self.check_interval <= 0:
            raise ValueError("check_interval must be > 0")
        if self.check_delay < 0 or self.timeout < 0 or self.query_timeout <= 0:
            raise ValueError("check_delay and timeout must be >= 0, query_timeout > 0")
        if self.min_open_connections < 0:
            raise ValueError("min_open_connections must be >= 0")


# --- observations -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DaemonReport:
    """One daemon's answer about the pod's IPs (all of them, combined)."""

    ready: bool
    """The daemon has applied its first full sync; before that it knows nothing."""
    quiesced: bool
    """No real server for these IPs with weight > 0 on that node."""
    node: str = ""
    real_servers_with_weight: int = 0

    @property
    def done(self) -> bool:
        return self.ready and self.quiesced

    @property
    def why_not(self) -> str:
        if not self.ready:
            return "not ready (no first sync yet)"
        if not self.quiesced:
            n = self.real_servers_with_weight
            return f"{n} real server{'s' if n != 1 else ''} with weight > 0"
        return ""


@dataclass(frozen=True, slots=True)
class Failure:
    """A probe that did not work: unreachable daemon, bad answer, unreadable /proc, no DNS."""

    error: str


DaemonAnswer = DaemonReport | Failure


# --- actions ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Wait:
    until: float


@dataclass(frozen=True, slots=True)
class Discover:
    pass


@dataclass(frozen=True, slots=True)
class Query:
    daemons: tuple[str, ...]
    timeout: float
    generation: int = 0
    """Pass it back with the answers: answers to a query made before a `join` are stale."""


@dataclass(frozen=True, slots=True)
class CountConnections:
    generation: int = 0


@dataclass(frozen=True, slots=True)
class Finish:
    result: BarrierResult


Action = Wait | Discover | Query | CountConnections | Finish


@dataclass(frozen=True, slots=True)
class Note:
    """Something worth a log line: level is "debug", "info" or "warning"."""

    level: str
    message: str
    fields: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class BarrierResult:
    outcome: Outcome
    stage: Stage
    """The stage the barrier was in when it ended (timeout) or `done`."""
    pod_ips: tuple[str, ...]
    elapsed: float
    stages: Mapping[str, float]
    """Seconds spent in each stage that was entered."""
    daemons: tuple[str, ...]
    quiesced: tuple[str, ...]
    not_quiesced: Mapping[str, str]
    """Daemon -> why it was not quiesced when the barrier ended (timeout only)."""
    discovery_error: str | None
    connections: int | None
    connections_error: str | None
    min_open_connections: int
    timeout: float

    @property
    def message(self) -> str:
        daemons = f"{len(self.daemons)} daemon{'s' if len(self.daemons) != 1 else ''}"
        if self.outcome is Outcome.DRAINED:
            return (
                f"all {daemons} quiesced and {self.connections} "
                f"established connections (<= {self.min_open_connections}) "
                f"after {self.elapsed:.3f}s"
            )
        if self.outcome is Outcome.QUIESCED:
            return f"all {daemons} quiesced after {self.elapsed:.3f}s"
        if self.stage is Stage.CONNECTIONS:
            if self.connections_error is None:
                seen = f"{self.connections} established connections > {self.min_open_connections}"
            else:
                seen = f"connections unknown ({self.connections_error})" + (
                    f", {self.connections} when last read" if self.connections is not None else ""
                )
            return f"timeout after {self.elapsed:.3f}s: all daemons quiesced, but {seen}"
        if self.stage is Stage.DELAY:
            return f"timeout after {self.elapsed:.3f}s during the check delay"
        if not self.daemons:
            return f"timeout after {self.elapsed:.3f}s: no daemon found" + (
                f" ({self.discovery_error})" if self.discovery_error else ""
            )
        waiting = _some([f"{d} ({why})" for d, why in self.not_quiesced.items()], sep=", ")
        return (
            f"timeout after {self.elapsed:.3f}s: {len(self.not_quiesced)} of "
            f"{daemons} not quiesced: {waiting}"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome.value,
            "stage": self.stage.value,
            "message": self.message,
            "pod_ips": list(self.pod_ips),
            "elapsed_seconds": round(self.elapsed, 3),
            "timeout_seconds": self.timeout,
            "stages": {k: round(v, 3) for k, v in self.stages.items()},
            "daemons": {
                "total": len(self.daemons),
                "quiesced": len(self.quiesced),
                "not_quiesced": dict(self.not_quiesced),
                "discovery_error": self.discovery_error,
            },
            "connections": {
                "established": self.connections,
                "min_open_connections": self.min_open_connections,
                "error": self.connections_error,
            },
        }


# --- the state machine --------------------------------------------------------------------


class Barrier:
    """One shutdown's barrier. Not thread-safe: the runner serialises calls."""

    def __init__(self, config: BarrierConfig, pod_ips: Sequence[str]) -> None:
        if not pod_ips:
            raise ValueError("at least one pod IP is needed")
        self.config = config
        self.pod_ips = tuple(pod_ips)
        self.stage = Stage.DELAY
        self.started_at: float | None = None
        self.deadline = 0.0
        self._stage_started = 0.0
        self._stages: dict[str, float] = {}
        self._notes: list[Note] = []
        self.daemons: tuple[str, ...] = ()
        self.quiesced: dict[str, DaemonReport] = {}
        self.problems: dict[str, str] = {}  # daemon -> why not quiesced, last seen
        self.discovery_error: str | None = None
        self.rounds = 0
        self.connections: int | None = None
        self.connections_error: str | None = None
        self.result: BarrierResult | None = None
        self.generation = 0  # one more per join
        self.joins = 0

    # -- inputs --

    def start(self, now: float) -> Action:
        if self.started_at is not None:
            raise RuntimeError("barrier already started")
        self.started_at = now
        self.deadline = now + self.config.timeout
        self._stage_started = now
        self._note(
            "info",
            "shutdown barrier started",
            pod_ips=",".join(self.pod_ips),
            timeout=self.config.timeout,
            check_delay=self.config.check_delay,
            check_interval=self.config.check_interval,
            min_open_connections=self.config.min_open_connections,
        )
        if self.config.check_delay > 0:
            if (expired := self._expired(now)) is not None:
                return expired
            return Wait(min(now + self.config.check_delay, self.deadline))
        return self._enter_daemons(now)

    def on_timer(self, now: float) -> Action:
        if self.result is not None:
            return Finish(self.result)
        if (expired := self._expired(now)) is not None:
            return expired
        if self.stage is Stage.DELAY:
            assert self.started_at is not None
            if now < self.started_at + self.config.check_delay:
                return Wait(min(self.started_at + self.config.check_delay, self.deadline))
            return self._enter_daemons(now)
        return self._resume()

    def on_daemons(self, now: float, found: Sequence[str] | Failure) -> Action:
        """The daemons found this round (DNS or the static list), or why none were."""
        if self.result is not None:
            return Finish(self.result)
        self._expect(Stage.DAEMONS)
        if isinstance(found, Failure) or not found:
            error = found.error if isinstance(found, Failure) else "no daemon addresses"
            if error != self.discovery_error:
                self._note("warning", "daemon discovery failed, retrying", error=error)
            self.discovery_error = error
            return self._expired(now) or self._next_round(now)
        if self.discovery_error is not None:
            self._note("info", "daemon discovery recovered", daemons=len(found))
        self.discovery_error = None
        found = tuple(sorted(set(found)))
        if found != self.daemons:
            added = sorted(set(found) - set(self.daemons))
            gone = sorted(set(self.daemons) - set(found))
            changes = {"added": _some(added)} if added else {}
            if gone:
                changes["gone"] = _some(gone)
            self._note(
                "info" if not self.daemons else "debug",
                "daemons found",
                daemons=len(found),
                **changes,
            )
            for d in gone:
                self.problems.pop(d, None)
        self.daemons = found
        pending = tuple(d for d in found if d not in self.quiesced)
        if not pending:
            return self._expired(now) or self._enter_connections(now)
        if (expired := self._expired(now)) is not None:
            return expired
        return Query(
            pending,
            max(min(self.config.query_timeout, self.deadline - now), 0.001),
            self.generation,
        )

    def join(self, now: float) -> None:
        """Another caller, arriving at `now`: its answer must rest on what is seen from now
        on (see the module docstring)."""
        if self.started_at is None or self.result is not None:
            raise RuntimeError("join: barrier not running")
        self.deadline = max(self.deadline, now + self.config.timeout)
        self.generation += 1
        self.joins += 1
        if self.stage is Stage.CONNECTIONS:
            self._end_stage(now)
            self.stage = Stage.DAEMONS
            self._stage_started = now
        self.quiesced.clear()
        self.connections = None
        self._note(
            "info",
            "shutdown barrier joined, checking again",
            joins=self.joins,
            stage=self.stage.value,
            deadline_in=round(self.deadline - now, 3),
        )

    def result_now(self, now: float) -> BarrierResult:
        """A timeout result as of now, changing nothing: for a caller whose own deadline
        has passed while the barrier goes on for a later one."""
        if self.result is not None:
            return self.result
        return self._result(now, Outcome.TIMEOUT, self.stage)

    def on_answers(
        self, now: float, answers: Mapping[str, DaemonAnswer], generation: int | None = None
    ) -> Action:
        if self.result is not None:
            return Finish(self.result)
        if generation is not None and generation != self.generation:
            return self._expired(now) or self._resume()  # asked before a join: ask again
        self._expect(Stage.DAEMONS)
        self.rounds += 1
        for daemon, answer in sorted(answers.items()):
            if daemon not in self.daemons:
                continue
            if isinstance(answer, DaemonReport) and answer.done:
                self.quiesced[daemon] = answer
                self.problems.pop(daemon, None)
                self._note(
                    "debug",
                    "daemon quiesced",
                    daemon=daemon,
                    node=answer.node,
                    elapsed=self._elapsed(now),
                )
                continue
            why = f"unreachable: {answer.error}" if isinstance(answer, Failure) else answer.why_not
            if self.problems.get(daemon) != why:
                self._note("debug", "daemon not quiesced yet", daemon=daemon, reason=why)
            self.problems[daemon] = why
        if all(d in self.quiesced for d in self.daemons):
            return self._expired(now) or self._enter_connections(now)
        return self._expired(now) or self._next_round(now)

    def on_connections(
        self, now: float, count: int | Failure, generation: int | None = None
    ) -> Action:
        if self.result is not None:
            return Finish(self.result)
        if generation is not None and generation != self.generation:
            return self._expired(now) or self._resume()  # counted before a join
        self._expect(Stage.CONNECTIONS)
        if isinstance(count, Failure):
            if count.error != self.connections_error:
                self._note("warning", "cannot count connections, retrying", error=count.error)
            self.connections_error = count.error
            return self._expired(now) or self._next_round(now)
        self.connections_error = None
        if count != self.connections:
            self._note(
                "debug",
                "established connections",
                connections=count,
                min_open_connections=self.config.min_open_connections,
            )
        self.connections = count
        if count <= self.config.min_open_connections:
            self._end_stage(now)
            self._note(
                "info",
                "connections drained",
                connections=count,
                min_open_connections=self.config.min_open_connections,
                stage_seconds=self._stages[Stage.CONNECTIONS],
                elapsed=self._elapsed(now),
            )
            return self._finish(now, Outcome.DRAINED)
        return self._expired(now) or self._next_round(now)

    def expire(self, now: float) -> Finish:
        """End now, whatever the stage: the caller's own deadline has passed (a probe hung)."""
        if self.result is not None:
            return Finish(self.result)
        if self.started_at is None:
            raise RuntimeError("barrier not started")
        return self._timeout(now)

    def take_notes(self) -> list[Note]:
        notes, self._notes = self._notes, []
        return notes

    # -- transitions --

    def _enter_daemons(self, now: float) -> Action:
        if self.stage is Stage.DELAY and self.config.check_delay > 0:
            self._end_stage(now)
            self._note("info", "check delay over", stage_seconds=self._stages[Stage.DELAY])
        self.stage = Stage.DAEMONS
        self._stage_started = now
        return Discover()

    def _enter_connections(self, now: float) -> Action:
        self._end_stage(now)
        self._note(
            "info",
            "all daemons quiesced",
            daemons=len(self.daemons),
            rounds=self.rounds,
            stage_seconds=self._stages[Stage.DAEMONS],
            elapsed=self._elapsed(now),
        )
        if not self.config.wait_connections:
            return self._finish(now, Outcome.QUIESCED)
        self.stage = Stage.CONNECTIONS
        self._stage_started = now
        return CountConnections(self.generation)

    def _resume(self) -> Action:
        """The next probe for the stage the barrier is in (DAEMONS or CONNECTIONS)."""
        if self.stage is Stage.DAEMONS:
            return Discover()
        return CountConnections(self.generation)

    def _next_round(self, now: float) -> Action:
        return Wait(min(now + self.config.check_interval, self.deadline))

    def _expired(self, now: float) -> Finish | None:
        return self._timeout(now) if now >= self.deadline else None

    def _timeout(self, now: float) -> Finish:
        stage = self.stage
        self._end_stage(now)
        pending = [d for d in self.daemons if d not in self.quiesced]
        for daemon in pending[:NAMED_AT_TIMEOUT]:
            self._note(
                "warning",
                "daemon not quiesced at timeout",
                daemon=daemon,
                reason=self.problems.get(daemon, "no answer yet"),
            )
        if len(pending) > NAMED_AT_TIMEOUT:
            self._note(
                "warning",
                "more daemons not quiesced at timeout",
                count=len(pending) - NAMED_AT_TIMEOUT,
                see="the /shutdown response",
            )
        result = self._result(now, Outcome.TIMEOUT, stage)
        self._note(
            "warning",
            "shutdown barrier timed out",
            stage=stage.value,
            elapsed=self._elapsed(now),
            summary=result.message,
        )
        return self._done(result)

    def _finish(self, now: float, outcome: Outcome) -> Finish:
        result = self._result(now, outcome, Stage.DONE)
        self._note(
            "info",
            "shutdown barrier done",
            outcome=outcome.value,
            elapsed=self._elapsed(now),
            stages=_stages_text(result.stages),
        )
        return self._done(result)

    def _done(self, result: BarrierResult) -> Finish:
        self.stage = Stage.DONE
        self.result = result
        return Finish(result)

    def _result(self, now: float, outcome: Outcome, stage: Stage) -> BarrierResult:
        not_quiesced = {
            d: self.problems.get(d, "no answer yet") for d in self.daemons if d not in self.quiesced
        }
        return BarrierResult(
            outcome=outcome,
            stage=stage,
            pod_ips=self.pod_ips,
            elapsed=self._elapsed(now),
            stages=dict(self._stages),
            daemons=self.daemons,
            quiesced=tuple(d for d in self.daemons if d in self.quiesced),
            not_quiesced=not_quiesced,
            discovery_error=self.discovery_error,
            connections=self.connections,
            connections_error=self.connections_error,
            min_open_connections=self.config.min_open_connections,
            timeout=self.config.timeout,
        )

    def _end_stage(self, now: float) -> None:
        if self.stage is not Stage.DONE:
            self._stages[self.stage.value] = round(now - self._stage_started, 3)

    def _elapsed(self, now: float) -> float:
        assert self.started_at is not None
        return round(now - self.started_at, 3)

    def _expect(self, stage: Stage) -> None:
        if self.stage is not stage:
            raise RuntimeError(f"observation for stage {stage.value} in stage {self.stage.value}")

    def _note(self, level: str, message: str, **fields: Any) -> None:
        self._notes.append(Note(level, message, fields))


def _stages_text(stages: Mapping[str, float]) -> str:
    return ",".join(f"{k}={v:.3f}s" for k, v in stages.items())


def _some(items: Sequence[str], limit: int = 10, sep: str = ",") -> str:
    """A list for a log line, cut short on a large cluster."""
    more = len(items) - limit
    return sep.join(items[:limit]) + (f"{sep}... (+{more} more)" if more > 0 else "")

"""The shutdown barrier's state machine (pure: times are plain numbers), the runner on a
manual clock, and the shared barrier with concurrent callers."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence

import pytest

from ipvsctl.shutdown.barrier import (
    Barrier,
    BarrierConfig,
    CountConnections,
    DaemonAnswer,
    DaemonReport,
    Discover,
    Failure,
    Finish,
    Outcome,
    Query,
    Stage,
    Wait,
)
from ipvsctl.shutdown.runner import Runner, SharedBarrier

POD = "10.244.1.5"
A, B, C = "http://192.0.2.1:9796", "http://192.0.2.2:9796", "http://192.0.2.3:9796"
QUIET = DaemonReport(ready=True, quiesced=True, node="n")
LIVE = DaemonReport(ready=True, quiesced=False, node="n", real_servers_with_weight=2)
UNSYNCED = DaemonReport(ready=False, quiesced=False, node="n")
SILENT = Failure("timed out")

T0 = 1000.0


def barrier(**kw: object) -> Barrier:
    return Barrier(BarrierConfig(**kw), [POD])  # type: ignore[arg-type]


def finish(action: object) -> Finish:
    assert isinstance(action, Finish), action
    return action


def test_all_quiesced_moves_on_to_the_connections_stage_and_drains():
    b = barrier(check_interval=1, timeout=25)
    assert b.start(T0) == Discover()
    q = b.on_daemons(T0, [B, A, A])
    assert q == Query((A, B), 2.0)
    assert b.on_answers(T0 + 0.1, {A: QUIET, B: QUIET}) == CountConnections()
    assert b.stage is Stage.CONNECTIONS
    notes = [n.message for n in b.take_notes() if n.level != "debug"]
    assert notes == ["shutdown barrier started", "daemons found", "all daemons quiesced"]
    r = finish(b.on_connections(T0 + 0.2, 0)).result
    assert r.outcome is Outcome.DRAINED and r.stage is Stage.DONE
    assert r.elapsed == pytest.approx(0.2) and r.daemons == (A, B) and r.quiesced == (A, B)
    assert r.stages == {"daemons": pytest.approx(0.1), "connections": pytest.approx(0.1)}
    doc = r.to_json()
    assert doc["outcome"] == "drained" and doc["daemons"]["total"] == 2
    assert doc["connections"] == {"established": 0, "min_open_connections": 0, "error": None}
    assert "all 2 daemons quiesced" in doc["message"]
    # Finished is final: any later input returns the same result.
    assert finish(b.on_timer(T0 + 5)).result is r


def test_a_silent_daemon_is_retried_each_interval_and_named_at_the_timeout():
    b = barrier(check_interval=1, timeout=3.5)
    assert b.start(T0) == Discover()
    assert b.on_daemons(T0, [A, B]) == Query((A, B), 2.0)
    now, queried = T0, []
    action = b.on_answers(now, {A: QUIET, B: SILENT})
    while not isinstance(action, Finish):
        assert isinstance(action, Wait) and action.until <= b.deadline
        now = action.until
        action = b.on_timer(now)
        if isinstance(action, Finish):
            break
        assert action == Discover()
        action = b.on_daemons(now, [A, B])
        if isinstance(action, Query):
            queried.append((now, action.daemons, action.timeout))
            action = b.on_answers(now, {B: SILENT})
    # Retried once per interval, only the daemon still pending; the last query's timeout
    # is cut to what is left before the deadline.
    assert [q[:2] for q in queried] == [(T0 + 1, (B,)), (T0 + 2, (B,)), (T0 + 3, (B,))]
    assert queried[-1][2] == pytest.approx(0.5)
    r = finish(action).result
    assert r.outcome is Outcome.TIMEOUT and r.stage is Stage.DAEMONS
    assert r.elapsed == pytest.approx(3.5)  # at the deadline, not a round later
    assert r.not_quiesced == {B: "unreachable: timed out"} and r.quiesced == (A,)
    assert f"{B} (unreachable: timed out)" in r.message
    warnings = [n for n in b.take_notes() if n.level == "warning"]
    assert [(n.message, n.fields.get("daemon")) for n in warnings] == [
        ("daemon not quiesced at timeout", B),
        ("shutdown barrier timed out", None),
    ]


def test_a_large_cluster_names_a_bounded_number_of_daemons_in_the_log():
    b = barrier(timeout=1)
    b.start(T0)
    many = [f"http://10.0.{i // 256}.{i % 256}:9796" for i in range(300)]
    b.on_daemons(T0, many)
    r = b.expire(T0 + 1).result
    assert len(r.not_quiesced) == 300  # the response has them all
    assert r.message.endswith("... (+290 more)")
    warnings = [n for n in b.take_notes() if n.level == "warning"]
    assert len(warnings) == 22 and warnings[20].fields["count"] == 280


def test_a_daemon_that_has_not_synced_is_not_quiesced():
    b = barrier(timeout=2)
    b.start(T0)
    b.on_daemons(T0, [A])
    # ready: false with quiesced: true (a daemon that knows nothing yet) still waits.
    assert isinstance(b.on_answers(T0, {A: DaemonReport(ready=False, quiesced=True)}), Wait)
    assert b.problems[A] == "not ready (no first sync yet)"
    assert isinstance(b.on_answers(T0, {A: UNSYNCED}), Wait)
    b.on_timer(T0 + 1)
    b.on_daemons(T0 + 1, [A])
    assert isinstance(b.on_answers(T0 + 1, {A: LIVE}), Wait)
    assert b.problems[A] == "2 real servers with weight > 0"
    r = finish(b.on_timer(T0 + 2)).result
    assert r.not_quiesced == {A: "2 real servers with weight > 0"}


def test_min_open_connections_ends_the_connections_stage():
    b = barrier(min_open_connections=2, timeout=10)
    b.start(T0)
    b.on_daemons(T0, [A])
    assert b.on_answers(T0, {A: QUIET}) == CountConnections()
    assert b.on_connections(T0, 5) == Wait(T0 + 1)
    assert b.on_timer(T0 + 1) == CountConnections()
    assert b.on_connections(T0 + 1, 3) == Wait(T0 + 2)
    b.on_timer(T0 + 2)
    r = finish(b.on_connections(T0 + 2, 2)).result
    assert r.outcome is Outcome.DRAINED and r.connections == 2
    assert r.stages["connections"] == pytest.approx(2)


def test_connections_that_never_drain_time_out_in_the_connections_stage():
    b = barrier(timeout=1.5)
    b.start(T0)
    b.on_daemons(T0, [A])
    b.on_answers(T0, {A: QUIET})
    assert b.on_connections(T0, 4) == Wait(T0 + 1)
    b.on_timer(T0 + 1)
    assert b.on_connections(T0 + 1, Failure("/proc/net/tcp: denied")) == Wait(T0 + 1.5)
    r = finish(b.on_timer(T0 + 1.5)).result
    assert r.outcome is Outcome.TIMEOUT and r.stage is Stage.CONNECTIONS
    assert r.connections == 4 and r.connections_error == "/proc/net/tcp: denied"
    assert r.message.endswith(
        "all daemons quiesced, but connections unknown (/proc/net/tcp: denied), 4 when last read"
    )


def test_check_delay_comes_first_and_is_timed():
    b = barrier(check_delay=5, timeout=25)
    assert b.start(T0) == Wait(T0 + 5)
    assert b.stage is Stage.DELAY
    assert b.on_timer(T0 + 4.9) == Wait(T0 + 5)  # woken early: wait the rest
    assert b.on_timer(T0 + 5) == Discover()
    b.on_daemons(T0 + 5, [A])
    b.on_answers(T0 + 6, {A: QUIET})
    r = finish(b.on_connections(T0 + 6, 0)).result
    assert r.stages == {"delay": 5, "daemons": 1, "connections": 0}
    assert "check delay over" in [n.message for n in b.take_notes()]


def test_a_check_delay_longer_than_the_timeout_ends_at_the_timeout():
    b = barrier(check_delay=60, timeout=25)
    assert b.start(T0) == Wait(T0 + 25)
    r = finish(b.on_timer(T0 + 25)).result
    assert r.outcome is Outcome.TIMEOUT and r.stage is Stage.DELAY


def test_discovery_failures_are_retried_and_no_daemon_at_all_is_a_timeout():
    b = barrier(timeout=2)
    b.start(T0)
    assert b.on_daemons(T0, Failure("cannot resolve x")) == Wait(T0 + 1)
    b.on_timer(T0 + 1)
    assert b.on_daemons(T0 + 1, []) == Wait(T0 + 2)
    r = finish(b.on_timer(T0 + 2)).result
    assert r.outcome is Outcome.TIMEOUT and r.daemons == ()
    assert r.message.startswith("timeout after 2.000s: no daemon found (no daemon addresses)")
    msgs = [n.message for n in b.take_notes()]
    assert msgs.count("daemon discovery failed, retrying") == 2  # the error changed once


def test_daemons_are_followed_across_rounds():
    b = barrier(timeout=10)
    b.start(T0)
    b.on_daemons(T0, [A, B])
    b.on_answers(T0, {A: QUIET, B: LIVE})
    b.on_timer(T0 + 1)
    # A new node's daemon appears, B's node is gone: ask C only (A said yes already).
    assert b.on_daemons(T0 + 1, [A, C]) == Query((C,), 2.0)
    assert B not in b.problems
    assert b.on_answers(T0 + 1, {C: QUIET, B: LIVE}) == CountConnections()


def test_without_the_connections_stage_it_ends_when_the_daemons_are_quiesced():
    b = barrier(wait_connections=False)
    b.start(T0)
    b.on_daemons(T0, [A])
    r = finish(b.on_answers(T0 + 0.3, {A: QUIET})).result
    assert r.outcome is Outcome.QUIESCED and r.connections is None


def test_expire_ends_it_whatever_the_stage_and_answers_after_that_change_nothing():
    b = barrier(timeout=10)
    b.start(T0)
    b.on_daemons(T0, [A, B])
    r = b.expire(T0 + 10).result
    assert r.outcome is Outcome.TIMEOUT and r.not_quiesced == {
        A: "no answer yet",
        B: "no answer yet",
    }
    assert finish(b.on_answers(T0 + 11, {A: QUIET, B: QUIET})).result is r


def test_config_and_order_are_checked():
    with pytest.raises(ValueError):
        BarrierConfig(check_interval=0)
    with pytest.raises(ValueError):
        BarrierConfig(min_open_connections=-1)
    with pytest.raises(ValueError):
        Barrier(BarrierConfig(), [])
    b = barrier()
    b.start(T0)
    with pytest.raises(RuntimeError):
        b.on_connections(T0, 0)  # still in the daemons stage


def test_a_join_asks_every_daemon_again_and_ignores_answers_from_before_it():
    b = barrier(check_interval=1, timeout=10)
    assert b.start(T0) == Discover()
    q = b.on_daemons(T0, [A, B])
    assert q == Query((A, B), 2.0, 0)
    b.join(T0 + 4)  # another caller while the query is out
    assert b.deadline == T0 + 14
    assert b.on_answers(T0 + 4.1, {A: QUIET, B: QUIET}, q.generation) == Discover()
    assert b.quiesced == {}  # the stale answers counted for nothing
    q2 = b.on_daemons(T0 + 4.2, [A, B])
    assert q2 == Query((A, B), 2.0, 1)
    assert b.on_answers(T0 + 4.3, {A: QUIET, B: QUIET}, q2.generation) == CountConnections(1)
    assert finish(b.on_connections(T0 + 4.4, 0, 1)).result.outcome is Outcome.DRAINED


def test_a_join_in_the_connections_stage_goes_back_to_the_daemons():
    b = barrier(check_interval=1, timeout=10)
    b.start(T0)
    b.on_daemons(T0, [A])
    c = b.on_answers(T0, {A: QUIET}, 0)
    assert c == CountConnections(0) and b.stage is Stage.CONNECTIONS
    b.join(T0 + 1)
    assert b.stage is Stage.DAEMONS and b.connections is None
    assert b.on_connections(T0 + 1.1, 0, c.generation) == Discover()  # counted before
    assert b.result is None
    q = b.on_daemons(T0 + 1.2, [A])
    assert b.on_answers(T0 + 1.3, {A: LIVE}, q.generation) == Wait(T0 + 2.3)


def test_result_now_is_a_timeout_that_changes_nothing():
    b = barrier(check_interval=1, timeout=10)
    b.start(T0)
    b.on_daemons(T0, [A])
    r = b.result_now(T0 + 3)
    assert r.outcome is Outcome.TIMEOUT and r.not_quiesced == {A: "no answer yet"}
    assert b.result is None and b.stage is Stage.DAEMONS
    with pytest.raises(RuntimeError):
        barrier().join(T0)  # not started


# --- the runner on a manual clock ---------------------------------------------------------


class ManualTime:
    def __init__(self) -> None:
        self.now = T0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


class ScriptedProbes:
    """Daemons answer from `state`; each probe costs `cost` seconds of manual time."""

    def __init__(
        self,
        t: ManualTime,
        state: dict[str, DaemonAnswer],
        connections: list[int] | None = None,
        cost: float = 0.0,
    ) -> None:
        self.t, self.state, self.cost = t, state, cost
        self.connections = connections or [0]
        self.queries: list[tuple[float, tuple[str, ...]]] = []

    def discover(self) -> Sequence[str] | Failure:
        return sorted(self.state)

    def query(self, daemons: Sequence[str], timeout: float) -> Mapping[str, DaemonAnswer]:
        self.queries.append((self.t.now, tuple(daemons)))
        self.t.now += min(self.cost, timeout)
        return {d: self.state[d] for d in daemons}

    def count_connections(self) -> int | Failure:
        return self.connections.pop(0) if len(self.connections) > 1 else self.connections[0]


def test_runner_stops_waiting_as_soon_as_everything_is_quiet(caplog):
    t = ManualTime()
    probes = ScriptedProbes(t, {A: QUIET, B: LIVE}, connections=[3, 1, 0])
    runner = Runner(
        Barrier(BarrierConfig(check_interval=1, timeout=25), [POD]), probes, t.clock, t.sleep
    )

    # B's node applies the endpoint removal after two rounds.
    def sleep(seconds: float) -> None:
        t.sleep(seconds)
        if len(probes.queries) == 2:
            probes.state[B] = QUIET

    runner.sleep = sleep
    with caplog.at_level(logging.INFO, logger="ipvsctl.shutdown"):
        r = runner.run()
    assert r.outcome is Outcome.DRAINED
    assert [q[1] for q in probes.queries] == [(A, B), (B,), (B,)]
    assert r.elapsed == pytest.approx(4) and t.slept == [1, 1, 1, 1]
    assert r.stages == {"daemons": 2, "connections": 2}
    lines = [rec.getMessage() for rec in caplog.records]
    assert lines == [
        "shutdown barrier started",
        "daemons found",
        "all daemons quiesced",
        "connections drained",
        "shutdown barrier done",
    ]
    done = caplog.records[-1]
    assert done.fields["stages"] == "daemons=2.000s,connections=2.000s"  # type: ignore[attr-defined]


def test_runner_names_the_silent_daemon_in_the_log_and_returns_at_the_timeout(caplog):
    t = ManualTime()
    probes = ScriptedProbes(t, {A: QUIET, B: SILENT}, cost=2.0)  # B's query times out
    runner = Runner(
        Barrier(BarrierConfig(check_interval=1, timeout=7), [POD]), probes, t.clock, t.sleep
    )
    with caplog.at_level(logging.INFO, logger="ipvsctl.shutdown"):
        r = runner.run()
    assert r.outcome is Outcome.TIMEOUT and t.now == T0 + 7
    assert len(probes.queries) == 3  # at 0, 3 and 6 s: each query costs 2 s, then 1 s pause
    assert probes.queries[-1] == (T0 + 6, (B,))
    named = [rec for rec in caplog.records if rec.getMessage() == "daemon not quiesced at timeout"]
    assert [rec.fields for rec in named] == [  # type: ignore[attr-defined]
        {"daemon": B, "reason": "unreachable: timed out"}
    ]
    assert caplog.records[-1].levelname == "WARNING"


# --- one barrier for concurrent callers ---------------------------------------------------


class GatedProbes:
    """Real-time probes: the first query blocks until the test opens the gate."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.discoveries = 0
        self.answer: DaemonAnswer = QUIET

    def discover(self) -> Sequence[str] | Failure:
        self.discoveries += 1
        return [A]

    def query(self, daemons: Sequence[str], timeout: float) -> Mapping[str, DaemonAnswer]:
        self.entered.set()
        assert self.gate.wait(10)
        return {A: self.answer}

    def count_connections(self) -> int | Failure:
        return 0


def _wait_until(pred: object, timeout: float = 10.0) -> None:
    done = threading.Event()
    for _ in range(int(timeout / 0.01)):
        if pred():  # type: ignore[operator]
            return
        done.wait(0.01)
    raise AssertionError("condition not met in time")


def test_concurrent_callers_share_one_barrier_and_one_result():
    probes = GatedProbes()
    shared = SharedBarrier(BarrierConfig(check_interval=0.01, timeout=30), [POD], probes)
    results: list[object] = []

    def call() -> None:
        results.append(shared.wait())

    callers = [threading.Thread(target=call) for _ in range(5)]
    callers[0].start()
    assert probes.entered.wait(10)  # the first query is out
    for c in callers[1:]:
        c.start()
    _wait_until(lambda: shared.status().get("joins") == 4)
    assert shared.status()["state"] == "running"
    probes.gate.set()
    for c in callers:
        c.join(10)
    assert len(results) == 5 and all(r is results[0] for r in results)
    # One barrier; the first query's answers predate the joins, so it asked once more.
    assert shared.calls == 5 and shared.runs == 1 and probes.discoveries == 2
    # A caller that comes after the end gets a new barrier, not the old result.
    late = shared.wait()
    assert late is not results[0] and late.outcome is Outcome.DRAINED
    assert shared.runs == 2 and shared.status()["state"] == "done"


def test_an_early_stray_call_never_makes_the_real_prestop_return_early():
    """Regression: /shutdown called while the pod was not yet behind a Service (quiesced
    everywhere) finished the barrier; the real preStop later got that result at once."""
    probes = GatedProbes()
    probes.gate.set()
    shared = SharedBarrier(BarrierConfig(check_interval=0.01, timeout=30), [POD], probes)
    stray = shared.wait()  # before the pod is terminating (not even serving yet)
    assert stray.outcome is Outcome.DRAINED
    probes.answer = LIVE  # now the pod serves; the real preStop comes
    results: list[object] = []
    real = threading.Thread(target=lambda: results.append(shared.wait()))
    real.start()
    _wait_until(lambda: probes.discoveries >= 4)  # it keeps asking
    assert results == [] and shared.status()["state"] == "running"
    probes.answer = QUIET  # the endpoint leaves every node
    real.join(10)
    assert len(results) == 1 and results[0] is not stray
    assert results[0].outcome is Outcome.DRAINED  # type: ignore[attr-defined]


def test_a_stray_call_that_times_out_first_does_not_end_the_real_prestop():
    """The stray caller's own deadline passes: it gets a timeout, the barrier goes on for
    the real preStop, which joined later and gets its own answer."""
    probes = GatedProbes()
    probes.gate.set()
    probes.answer = LIVE
    # Regression (flake under load): the real caller joined a few ms after the stray, so its
    # own deadline passed before the test could make the pod quiet. The clock jumps 2 s
    # before it joins: its deadline is 2 s after the stray's, whatever the machine's load.
    skew = [0.0]
    shared = SharedBarrier(
        BarrierConfig(check_interval=0.01, timeout=3),
        [POD],
        probes,
        clock=lambda: time.monotonic() + skew[0],
    )
    stray: list[object] = []
    s = threading.Thread(target=lambda: stray.append(shared.wait()))
    s.start()
    _wait_until(lambda: probes.discoveries >= 2)
    skew[0] = 2.0
    real: list[object] = []
    r = threading.Thread(target=lambda: real.append(shared.wait()))
    r.start()
    _wait_until(lambda: shared.status().get("joins") == 1)  # joined within the stray's 3 s
    s.join(10)
    assert stray and stray[0].outcome is Outcome.TIMEOUT  # type: ignore[attr-defined]
    assert real == [] and shared.status()["state"] == "running"
    probes.answer = QUIET
    r.join(10)
    assert real and real[0].outcome is Outcome.DRAINED  # type: ignore[attr-defined]
    assert shared.runs == 1


def test_a_probe_hanging_past_the_deadline_does_not_hold_the_callers():
    probes = GatedProbes()  # the gate stays shut: the query hangs
    shared = SharedBarrier(BarrierConfig(check_interval=0.01, timeout=0.2), [POD], probes)
    r = shared.wait()
    assert r.outcome is Outcome.TIMEOUT and r.not_quiesced == {A: "no answer yet"}
    assert r.elapsed < 5
    probes.gate.set()  # the runner thread then sees the barrier is over
    assert shared.result is r


def test_the_finishing_log_lines_are_written_before_anyone_sees_the_result():
    """Regression (CI flake): a caller expiring the barrier at the deadline answered while
    the barrier thread still held the timeout's notes unlogged, so the daemon it named was
    missing from the log when the preStop hook returned."""
    t = ManualTime()
    runner = Runner(
        Barrier(BarrierConfig(check_interval=1, timeout=2), [POD]),
        ScriptedProbes(t, {A: SILENT}),
        t.clock,
        t.sleep,
    )
    writing, release = threading.Event(), threading.Event()
    written: list[str] = []

    class SlowHandler(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage() == "daemon not quiesced at timeout":
                writing.set()
                assert release.wait(10)
            written.append(record.getMessage())

    logger = logging.getLogger("ipvsctl.shutdown")
    handler, level = SlowHandler(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        barrier_thread = threading.Thread(target=runner.run)
        barrier_thread.start()
        assert writing.wait(10)  # the barrier thread is logging its timeout
        expired: list[object] = []
        caller = threading.Thread(target=lambda: expired.append(runner.expire()))
        caller.start()
        caller.join(0.2)
        assert not expired, "the result was visible before its log lines were written"
        release.set()
        caller.join(10)
        barrier_thread.join(10)
        assert expired and "daemon not quiesced at timeout" in written
    finally:
        release.set()
        logger.removeHandler(handler)
        logger.setLevel(level)

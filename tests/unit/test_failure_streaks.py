"""One log line per failure streak (obs/logging.py), the helper every adapter uses."""

from __future__ import annotations

import logging

from ipvsctl.obs.logging import FailureStreaks

log = logging.getLogger("ipvsctl.test.streaks")


def _lines(caplog) -> list[tuple[str, str, dict]]:
    return [(r.levelname, r.getMessage(), r.fields) for r in caplog.records if r.name == log.name]


def test_a_streak_logs_its_first_failure_and_its_end_once(caplog) -> None:
    s = FailureStreaks(log)
    caplog.set_level(logging.INFO, logger=log.name)
    assert not s.recovered("back")  # no streak: nothing to end, nothing logged
    assert s.failed(logging.ERROR, "down", error="e1")
    assert not s.failed(logging.ERROR, "down", error="e2")
    assert s.failing() and s.running() == [None]
    assert s.recovered("back", n=2)
    assert not s.recovered("back")
    assert s.failed(logging.WARNING, "down", error="e3")  # a new streak
    assert _lines(caplog) == [
        ("ERROR", "down", {"error": "e1"}),
        ("INFO", "back", {"n": 2}),
        ("WARNING", "down", {"error": "e3"}),
    ]


def test_keys_have_streaks_of_their_own_and_can_end_silently(caplog) -> None:
    s = FailureStreaks(log)
    caplog.set_level(logging.INFO, logger=log.name)
    assert s.failed(logging.ERROR, "port down", key=30001, port=30001)
    assert s.failed(logging.ERROR, "port down", key=30002, port=30002)
    assert not s.failed(logging.ERROR, "port down", key=30001, port=30001)
    assert s.running() == [30001, 30002]
    assert s.recovered(None, key=30001)  # ended, no line
    assert s.running() == [30002] and not s.failing(30001) and s.failing(30002)
    assert [m for _, m, f in _lines(caplog)] == ["port down", "port down"]

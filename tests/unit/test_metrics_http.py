"""/metrics as one shared rendering (daemon/metrics_http.py), on a test clock: which
rendering a scrape gets, the renderer's pace, a stuck or failing rendering."""

from __future__ import annotations

import pytest

from ipvsctl.daemon.metrics_http import MetricsDocument


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_scrape_never_gets_a_rendering_finished_before_it_came() -> None:
    """The rendering under way when a scrape arrives, or a later one: a value set before a
    scrape is in its answer. The next rendering waits max(1 s, 4 x the last one's time)."""
    clock = Clock()
    values = iter([b"one", b"two", b"three"])
    doc = MetricsDocument(lambda: next(values), "text/plain", clock=clock)
    first = doc.handler({}).waiter
    assert first.poll(clock.now) is None
    doc.render_once()
    answer = first.poll(clock.now)
    assert answer is not None and answer.body == b"one"
    later = doc.handler({}).waiter  # came after "one" was finished: never gets it
    assert later.poll(clock.now) is None
    doc.render_once()
    answer = later.poll(clock.now)
    assert answer is not None and answer.body == b"two"


def test_the_renderer_paces_itself_and_a_stuck_rendering_answers_503() -> None:
    clock = Clock()
    doc = MetricsDocument(lambda: b"x", "text/plain", clock=clock, min_gap=1.0, gap_factor=4.0)

    def slow() -> bytes:
        clock.now += 0.5  # a rendering of 0.5 s
        return b"x"

    doc.render = slow
    doc.handler({})
    doc.render_once()
    assert doc._next_at == pytest.approx(clock.now + 2.0)  # 4 x 0.5 s, not 1 s
    waiting = doc.handler({}).waiter
    clock.now += 9.9
    assert waiting.poll(clock.now) is None
    clock.now += 0.2  # past the 10 s a scrape waits at most
    answer = waiting.poll(clock.now)
    assert answer is not None and answer.code == 503


def test_a_failing_rendering_is_500_and_the_next_one_works() -> None:
    clock = Clock()
    calls = iter([RuntimeError("collector bug"), b"fine"])

    def render() -> bytes:
        v = next(calls)
        if isinstance(v, Exception):
            raise v
        return v

    doc = MetricsDocument(render, "text/plain", clock=clock)
    w = doc.handler({}).waiter
    doc.render_once()
    answer = w.poll(clock.now)
    assert answer is not None and answer.code == 500
    w = doc.handler({}).waiter
    doc.render_once()
    answer = w.poll(clock.now)
    assert answer is not None and (answer.code, answer.body) == (200, b"fine")


def test_a_rendering_slower_than_a_scrape_waits_is_one_warning(caplog) -> None:
    clock = Clock()

    def slow() -> bytes:
        clock.now += 12.0
        return b"x"

    doc = MetricsDocument(slow, "text/plain", clock=clock)
    doc.handler({})
    with caplog.at_level("WARNING", logger="ipvsctl.metrics"):
        doc.render_once()
    assert [r.getMessage() for r in caplog.records] == ["metrics rendering slow"]

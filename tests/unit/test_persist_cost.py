"""The drain state's cost per loop step does not grow with the queue (bench hot spot: a
sorted copy of the whole queue on every step that changed it was 63% of the loop's
time with 1,000 draining). Counted in copies, not timed."""

from __future__ import annotations

import queue
import threading

from devkit.harness import Harness
from ipvsctl.model import DrainEntry, DrainQueue, RealServerKey, ServiceKey
from ipvsctl.model.drain import DeadlineSource, DrainReason
from ipvsctl.model.keys import Protocol
from ipvsctl.reconcile.loop import Loop, LoopConfig
from ipvsctl.reconcile.writer import StateWriter


def _entry(i: int) -> DrainEntry:
    return DrainEntry(
        ServiceKey(Protocol.TCP, "10.96.0.1", 80 + i // 250),
        RealServerKey(f"10.244.{i // 250}.{i % 250}", 8080),
        None,
        DrainReason.TERMINATING,
        1000.0,
        1600.0,
        DeadlineSource.DEFAULT,
    )


class _Counting:
    """Whole-queue copies (the sorted iteration and the unsorted copy) since it was made:
    the queue's own counter."""

    def __init__(self, q: DrainQueue) -> None:
        self.q, self.start = q, q.copies

    @property
    def copies(self) -> int:
        return self.q.copies - self.start


def _loop(h: Harness, save) -> Loop:
    for i in range(1000):
        h.engine.drains.queue.add(_entry(i))
    return Loop(
        h.engine, queue.Queue(), LoopConfig(persist_interval=2.0), clock=h.clock, save_queue=save
    )


def test_steps_that_change_the_queue_copy_nothing_until_the_writer_reads():
    h = Harness()
    submitted: list = []
    loop = _loop(h, submitted.append)  # like StateWriter.submit: keeps the view, reads later
    counting = _Counting(h.engine.drains.queue)
    loop.step()  # the restored queue is on disk already: nothing to write
    for i in range(200):  # 200 steps, each ending a drain: one hand-over (the first), no copy
        h.engine.drains.queue.remove(_entry(i).vs, _entry(i).rs)
        loop.step()
    assert counting.copies == 0
    assert len(submitted) == 1
    h.clock.advance(2.0)
    loop.step()
    assert len(submitted) == 2 and counting.copies == 0
    assert len(submitted[-1]) == 800  # read now: one copy, of the queue as it is now
    assert counting.copies == 1
    list(submitted[-1])
    assert counting.copies == 1  # a view is copied once


def test_a_new_drain_is_submitted_at_once_without_a_copy():
    h = Harness()
    submitted: list = []
    loop = _loop(h, submitted.append)
    loop.step()
    counting = _Counting(h.engine.drains.queue)
    for i in range(1000, 1100):  # every step adds a drain: each is handed over at once
        h.engine.drains.queue.add(_entry(i))
        loop.step()
    assert len(submitted) == 100 and counting.copies == 0


def test_the_writer_copies_once_per_write_and_writes_the_newest_queue():
    h = Harness()
    written: list[list[DrainEntry]] = []
    gate = threading.Event()

    def save(entries) -> None:
        gate.wait(30)
        written.append(list(entries))

    writer = StateWriter(save)
    loop = _loop(h, writer.submit)
    counting = _Counting(h.engine.drains.queue)
    stop = threading.Event()
    t = threading.Thread(target=writer.run, args=(stop,))
    t.start()
    try:
        loop.step()  # the first write starts and waits on the gate
        for i in range(1000, 1050):  # new drains while the disk is slow: views replace
            h.engine.drains.queue.add(_entry(i))
            loop.step()
        gate.set()
        assert writer.wait_idle(30)
    finally:
        stop.set()
        t.join(30)
    assert counting.copies == len(written) <= 3
    assert {e.key for e in written[-1]} == {e.key for e in h.engine.drains.queue.entries()}


def test_the_state_file_is_encoded_entry_by_entry_and_reads_as_one_json_document(tmp_path):
    """No json.dumps of the whole queue (one C call holding the GIL for all of it); the
    file is the same document as before, byte for byte, and loads back."""
    import json

    from ipvsctl.persist.drain_state import FORMAT_VERSION, DrainStateFile

    entries = [_entry(i) for i in range(300)]
    f = DrainStateFile(tmp_path)
    f.save(entries)
    text = (tmp_path / "drain-queue.json").read_text()
    assert 0 < f.longest_encoded < 1000  # one entry at a time, never the queue
    assert len(text) > 300 * f.longest_encoded // 2
    assert text == json.dumps(
        {"version": FORMAT_VERSION, "entries": [e.to_json() for e in entries]},
        separators=(",", ":"),
    )
    assert f.load() == entries

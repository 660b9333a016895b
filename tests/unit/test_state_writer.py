"""The drain queue's writer thread: the loop never waits on disk."""

from __future__ import annotations

import threading

from ipvsctl.reconcile.writer import StateWriter

WAIT = 10.0


def _entries(n: int) -> list:
    return [n]  # the writer never looks inside; a marker per snapshot


def test_submit_never_waits_for_a_write_and_the_newest_snapshot_wins() -> None:
    release = threading.Event()
    started = threading.Event()
    saved: list[list] = []

    def save(entries: list) -> None:
        started.set()
        assert release.wait(WAIT)
        saved.append(entries)

    w = StateWriter(save)
    stop = threading.Event()
    t = threading.Thread(target=w.run, args=(stop,), daemon=True)
    t.start()
    w.submit(_entries(1))
    assert started.wait(WAIT)  # the first write is under way and blocked on "disk"
    w.submit(_entries(2))  # returns at once although the writer is busy
    w.submit(_entries(3))
    release.set()
    assert w.wait_idle(WAIT)
    assert saved == [[1], [3]]  # 2 was replaced before it was written
    stop.set()
    t.join(WAIT)
    assert not t.is_alive()


def test_a_failed_write_is_counted_and_retried() -> None:
    fails = [True]
    saved: list[list] = []
    errors: list[int] = []

    def save(entries: list) -> None:
        if fails.pop(0) if fails else False:
            raise OSError(28, "No space left on device")
        saved.append(entries)

    w = StateWriter(save, on_error=lambda: errors.append(1), retry_interval=0.01)
    stop = threading.Event()
    t = threading.Thread(target=w.run, args=(stop,), daemon=True)
    t.start()
    w.submit(_entries(1))
    assert w.wait_idle(WAIT)
    assert errors == [1] and saved == [[1]]
    stop.set()
    t.join(WAIT)


def test_stop_writes_what_is_pending_then_returns() -> None:
    saved: list[list] = []
    w = StateWriter(saved.append)
    stop = threading.Event()
    w.submit(_entries(7))
    stop.set()
    w.run(stop)  # returns: stopped, after writing the pending snapshot
    assert saved == [[7]]


def test_stop_does_not_retry_a_failing_disk_forever() -> None:
    def save(entries: list) -> None:
        raise OSError(5, "I/O error")

    w = StateWriter(save, retry_interval=60)
    stop = threading.Event()
    w.submit(_entries(1))
    stop.set()
    t = threading.Thread(target=w.run, args=(stop,), daemon=True)
    t.start()
    t.join(WAIT)
    assert not t.is_alive()

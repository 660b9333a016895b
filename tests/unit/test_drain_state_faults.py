"""Hostile state files: each is set aside and start-up goes on by adoption."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from devkit.harness import rs, vs
from ipvsctl.model import NO_DEADLINE, DeadlineSource, DrainEntry, DrainReason, PodRef
from ipvsctl.persist.drain_state import FILE_NAME, DrainStateFile

GOOD = DrainEntry(
    vs(), rs("10.244.1.6"), None, DrainReason.TERMINATING, 1000.0, 1600.0, DeadlineSource.ANNOTATION
)


def _doc(**over: object) -> dict:
    entry = GOOD.to_json() | over
    return {"version": 1, "entries": [entry]}


def _load(tmp_path: Path, raw: bytes) -> tuple[list[DrainEntry], DrainStateFile]:
    (tmp_path / FILE_NAME).write_bytes(raw)
    state = DrainStateFile(tmp_path)
    return state.load(), state


def _set_aside(tmp_path: Path) -> bool:
    return not os.path.lexists(tmp_path / FILE_NAME) and any(
        p.name.startswith(f"{FILE_NAME}.corrupt-") for p in tmp_path.iterdir()
    )


def test_a_good_file_round_trips(tmp_path: Path) -> None:
    state = DrainStateFile(tmp_path)
    bounded_by_pod = DrainEntry(
        vs(),
        rs("10.244.1.7"),
        None,
        DrainReason.TERMINATING,
        1000.0,
        NO_DEADLINE,
        DeadlineSource.POD,
        PodRef("default", "web-0", "u1"),
    )
    state.save([GOOD, bounded_by_pod])
    assert state.load() == [GOOD, bounded_by_pod] and state.load_error is None
    saved = json.loads((tmp_path / FILE_NAME).read_text())["entries"][1]
    assert saved["deadline"] is None and saved["pod_uid"] == "u1"


def test_a_file_of_the_version_that_read_pods_loads(tmp_path: Path) -> None:
    """Written by the version that read pods, whose "pod" deadline was the pod's
    deletionTimestamp and whose entries carry no uid: it loads, such a drain as one its pod
    bounds (the first sync judges it from the slices), the others as they were."""
    old = (Path(__file__).parent / "data" / "drain-queue-v1-pod-deadlines.json").read_bytes()
    entries, state = _load(tmp_path, old)
    assert state.load_error is None and len(entries) == 3
    pod, default, annotation = entries
    assert pod.deadline_source is DeadlineSource.POD and not pod.has_deadline
    assert pod.pod == PodRef("default", "web-0") and pod.pod.uid == ""
    assert (default.deadline_source, default.deadline) == (DeadlineSource.DEFAULT, 1700000030.0)
    assert (annotation.deadline_source, annotation.deadline) == (
        DeadlineSource.ANNOTATION,
        1700000090.0,
    )


@pytest.mark.parametrize(
    "raw",
    [
        b'{"version":1,"entries":[\xff\xfe]}',  # not UTF-8
        json.dumps(_doc(vport=None)).replace("null", "1e999").encode(),  # inf in a port
        json.dumps(_doc(port=None)).replace("null", "1e999").encode(),
        json.dumps(_doc(deadline=None)).replace("null", "NaN").encode(),
        json.dumps(_doc(deadline=None)).replace("null", "Infinity").encode(),
        json.dumps(_doc(since=None)).replace("null", "1e999").encode(),  # inf via overflow
        b'{"version":1,"entries":' + b"[" * 100_000 + b"]" * 100_000 + b"}",  # deep nesting
        json.dumps(_doc(vport=70000)).encode(),
        json.dumps(_doc(vport=True)).encode(),
        json.dumps(_doc(vip="fe80::1%eth0")).encode(),
        json.dumps(_doc(address=["10.0.0.1"])).encode(),
        json.dumps(_doc(service={"a": 1})).encode(),
        json.dumps(_doc(pod="nopodslash")).encode(),
        json.dumps(_doc(reason="gone")).encode(),
        json.dumps({"version": 1, "entries": {"a": 1}}).encode(),
        json.dumps([1, 2]).encode(),
        json.dumps(_doc(deadline=None)).encode(),  # only a drain its pod bounds has none
        json.dumps(_doc(deadline_source="pod", pod_uid=["u"])).encode(),
    ],
    ids=[
        "non-utf8",
        "inf-vport",
        "inf-port",
        "nan-deadline",
        "infinity-deadline",
        "overflow-since",
        "deep",
        "big-port",
        "bool-port",
        "zone-id",
        "list-ip",
        "dict-service",
        "bad-pod",
        "bad-reason",
        "entries-dict",
        "top-list",
        "null-deadline",
        "list-uid",
    ],
)
def test_a_bad_file_is_set_aside_and_start_up_goes_on(tmp_path: Path, raw: bytes) -> None:
    entries, state = _load(tmp_path, raw)
    assert entries == []
    assert state.load_error and state.load_error.startswith("corrupt")
    assert _set_aside(tmp_path)


def test_a_fifo_in_place_of_the_file_does_not_hang_start_up(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / FILE_NAME)
    state = DrainStateFile(tmp_path)
    result: list[list[DrainEntry]] = []
    t = threading.Thread(target=lambda: result.append(state.load()), daemon=True)
    t.start()
    t.join(5)
    assert not t.is_alive(), "load() blocked on a FIFO"
    assert result == [[]] and _set_aside(tmp_path)


def test_a_symlink_in_place_of_the_file_is_not_followed(tmp_path: Path) -> None:
    other = tmp_path / "other.json"
    other.write_text(json.dumps(_doc()))
    (tmp_path / FILE_NAME).symlink_to(other)
    state = DrainStateFile(tmp_path)
    assert state.load() == [] and _set_aside(tmp_path)
    assert other.read_text() == json.dumps(_doc())


def test_a_symlinked_tmp_does_not_make_the_write_overwrite_another_file(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (tmp_path / f".{FILE_NAME}.tmp").symlink_to(victim)
    state = DrainStateFile(tmp_path)
    state.save([GOOD])
    assert victim.read_text() == "precious"
    assert not (tmp_path / FILE_NAME).is_symlink()
    assert state.load() == [GOOD]


def test_a_nan_deadline_is_never_written(tmp_path: Path) -> None:
    state = DrainStateFile(tmp_path)
    bad = GOOD.with_deadline(float("nan"), DeadlineSource.DEFAULT)
    with pytest.raises(OSError):
        state.save([bad])  # OSError: the loop counts it as a failed write, never dies
    assert not (tmp_path / FILE_NAME).exists()


# --- numbers no parser should meet, deadlines out of range, the size cap ---------
BIG_INT = "9" * 5000  # past sys.get_int_max_str_digits(): int() raises ValueError


@pytest.mark.parametrize("field", ["vport", "port", "since", "deadline"])
def test_a_5000_digit_integer_is_set_aside_not_raised(tmp_path: Path, field: str) -> None:
    raw = json.dumps(_doc(**{field: 0})).replace(f'"{field}": 0', f'"{field}": {BIG_INT}')
    assert BIG_INT in raw
    entries, state = _load(tmp_path, raw.encode())
    assert entries == [] and state.load_error and state.load_error.startswith("corrupt")
    assert _set_aside(tmp_path)
    assert len(state.load_error) < 300


@pytest.mark.parametrize(
    ("since", "deadline"),
    [
        (1000.0, -1e9),  # negative
        (-5.0, 30.0),
        (1000.0, 1e308),  # huge
        (1e308, 1e308),
        (1600.0, 1000.0),  # since after the deadline
        (1000.0, 1000.0 + 30 * 24 * 3600),  # a month: no flag or annotation gives that
    ],
)
def test_deadlines_out_of_range_are_set_aside(tmp_path: Path, since: float, deadline: float):
    entries, _ = _load(tmp_path, json.dumps(_doc(since=since, deadline=deadline)).encode())
    assert entries == [] and _set_aside(tmp_path)


def test_a_drain_its_pod_bounds_keeps_a_null_deadline(tmp_path: Path) -> None:
    """That version's `deadline: null` with `deadline_source: "pod"` stays valid."""
    raw = json.dumps(_doc(deadline=None, deadline_source="pod", pod="default/web-0", pod_uid="u"))
    entries, state = _load(tmp_path, raw.encode())
    assert state.load_error is None and len(entries) == 1 and not entries[0].has_deadline


def test_a_file_over_the_cap_is_set_aside_and_never_written(tmp_path: Path) -> None:
    from ipvsctl.persist.drain_state import MAX_BYTES

    assert MAX_BYTES <= 8 << 20  # a 64 MB file took 566 MiB to parse; the pod has 384
    padding = " " * (MAX_BYTES + 1 - len(json.dumps(_doc())))
    entries, state = _load(tmp_path, (json.dumps(_doc()) + padding).encode())
    assert entries == [] and _set_aside(tmp_path) and "larger than" in (state.load_error or "")
    many = [
        GOOD.__class__(vs(), rs(f"10.{i >> 16}.{(i >> 8) & 255}.{i & 255}"), *GOOD_TAIL)
        for i in range(MAX_BYTES // 100)
    ]
    with pytest.raises(OSError, match="over"):
        state.save(many)
    assert not (tmp_path / FILE_NAME).exists()


GOOD_TAIL = (None, DrainReason.TERMINATING, 1000.0, 1600.0, DeadlineSource.ANNOTATION)


def test_the_shutdown_save_waits_for_the_writers(tmp_path: Path, monkeypatch) -> None:
    """The writer thread and the shutdown both saved to one .tmp name without a lock: the
    second unlinked the first's tmp, and the first then failed or put back an older queue."""
    state = DrainStateFile(tmp_path)
    in_fsync, release = threading.Event(), threading.Event()
    real_fsync = os.fsync
    first = [True]

    def slow_fsync(fd: int) -> None:
        if first[0] and threading.current_thread().name == "writer":
            first[0] = False
            in_fsync.set()
            release.wait(30)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", slow_fsync)
    errors: list[BaseException] = []

    def save(entries: list[DrainEntry]) -> None:
        try:
            state.save(entries)
        except BaseException as exc:
            errors.append(exc)

    newer = GOOD.with_deadline(1700.0, DeadlineSource.ANNOTATION)
    writer = threading.Thread(target=save, args=([GOOD],), name="writer")
    writer.start()
    assert in_fsync.wait(30)
    shutdown = threading.Thread(target=save, args=([newer],), name="shutdown")
    shutdown.start()
    shutdown.join(1.0)  # with the lock it waits here; without, it ran to the end
    release.set()
    writer.join(30)
    shutdown.join(30)
    assert errors == []
    assert state.load() == [newer]  # the later save is the one on disk
    assert [p.name for p in tmp_path.iterdir()] == [FILE_NAME]

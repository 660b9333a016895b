"""Hostile state files: a file that is not one ipvsctl wrote is set aside whole and start-up
goes on by adoption; an entry that cannot be read is set aside alone and the others load."""

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


OTHER = DrainEntry(
    vs(), rs("10.244.1.9"), None, DrainReason.REMOVED, 1000.0, 1030.0, DeadlineSource.DEFAULT
)


def _doc(**over: object) -> dict:
    """A file of one entry (GOOD with `over`) and a good one after it."""
    entry = GOOD.to_json() | over
    return {"version": 1, "entries": [entry, OTHER.to_json()]}


def _load(tmp_path: Path, raw: bytes) -> tuple[list[DrainEntry], DrainStateFile]:
    (tmp_path / FILE_NAME).write_bytes(raw)
    state = DrainStateFile(tmp_path)
    return state.load(), state


def _asides(tmp_path: Path) -> list[Path]:
    return [p for p in tmp_path.iterdir() if p.name.startswith(f"{FILE_NAME}.corrupt-")]


def _set_aside(tmp_path: Path) -> bool:
    return not os.path.lexists(tmp_path / FILE_NAME) and bool(_asides(tmp_path))


def _entry_set_aside(tmp_path: Path, entries: list[DrainEntry], state: DrainStateFile) -> bool:
    """The bad entry alone went aside (a copy beside the file); the good one loaded."""
    (aside,) = _asides(tmp_path)
    return (
        entries == [OTHER]
        and state.entries_set_aside == 1
        and state.load_error is None
        and (tmp_path / FILE_NAME).exists()
        and len(json.loads(aside.read_text())["entries"]) == 1
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
        json.dumps(_doc(deadline=None)).replace("null", "NaN").encode(),
        json.dumps(_doc(deadline=None)).replace("null", "Infinity").encode(),
        b'{"version":1,"entries":' + b"[" * 100_000 + b"]" * 100_000 + b"}",  # deep nesting
        json.dumps({"version": 1, "entries": {"a": 1}}).encode(),
        json.dumps([1, 2]).encode(),
        json.dumps({"version": 2, "entries": []}).encode(),
    ],
    ids=[
        "non-utf8",
        "nan-deadline",
        "infinity-deadline",
        "deep",
        "entries-dict",
        "top-list",
        "other-version",
    ],
)
def test_a_bad_file_is_set_aside_and_start_up_goes_on(tmp_path: Path, raw: bytes) -> None:
    entries, state = _load(tmp_path, raw)
    assert entries == []
    assert state.load_error and state.load_error.startswith("corrupt")
    assert _set_aside(tmp_path)


INF = "<1e999>"  # written as the bare number 1e999, which json reads as inf


@pytest.mark.parametrize(
    "over",
    [
        {"vport": INF},  # inf in a port (json reads 1e999 as inf)
        {"port": INF},
        {"since": INF},
        {"vport": 70000},
        {"vport": True},
        {"vip": "fe80::1%eth0"},
        {"address": ["10.0.0.1"]},
        {"service": {"a": 1}},
        {"pod": "nopodslash"},
        {"reason": "gone"},
        {"deadline": None},  # only a drain its pod bounds has none
        {"deadline_source": "pod", "pod_uid": ["u"]},
        {"vs_draining": "yes"},
    ],
    ids=[
        "inf-vport",
        "inf-port",
        "overflow-since",
        "big-port",
        "bool-port",
        "zone-id",
        "list-ip",
        "dict-service",
        "bad-pod",
        "bad-reason",
        "null-deadline",
        "list-uid",
        "string-vs-draining",
    ],
)
def test_a_bad_entry_is_set_aside_alone_and_the_others_load(
    tmp_path: Path, over: dict[str, object]
) -> None:
    raw = json.dumps(_doc(**over)).replace(f'"{INF}"', "1e999")
    entries, state = _load(tmp_path, raw.encode())
    assert _entry_set_aside(tmp_path, entries, state)


def test_an_entry_that_is_not_an_object_is_set_aside_alone(tmp_path: Path) -> None:
    raw = json.dumps({"version": 1, "entries": [[1, 2], "x", OTHER.to_json()]}).encode()
    entries, state = _load(tmp_path, raw)
    assert entries == [OTHER] and state.entries_set_aside == 2 and state.load_error is None


def test_a_file_without_bad_entries_sets_nothing_aside(tmp_path: Path) -> None:
    entries, state = _load(tmp_path, json.dumps(_doc()).encode())
    assert entries == [GOOD, OTHER] and state.entries_set_aside == 0 and not _asides(tmp_path)


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
    """json itself refuses such a number: the file is set aside whole."""
    raw = json.dumps(_doc(**{field: 0})).replace(f'"{field}": 0', f'"{field}": {BIG_INT}', 1)
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
    entries, state = _load(tmp_path, json.dumps(_doc(since=since, deadline=deadline)).encode())
    assert _entry_set_aside(tmp_path, entries, state)


def test_a_drain_its_pod_bounds_keeps_a_null_deadline(tmp_path: Path) -> None:
    """That version's `deadline: null` with `deadline_source: "pod"` stays valid."""
    raw = json.dumps(_doc(deadline=None, deadline_source="pod", pod="default/web-0", pod_uid="u"))
    entries, state = _load(tmp_path, raw.encode())
    assert state.load_error is None and len(entries) == 2 and not entries[0].has_deadline


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

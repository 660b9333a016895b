"""The drain queue on disk: one JSON file in --state-dir, replaced atomically.

Write: a fresh temporary file in the same folder (any old one, even a symlink planted there,
is unlinked first and the new one made with O_EXCL|O_NOFOLLOW), fsync, rename over the old
one, fsync the folder; a crash leaves either the old or the new file, never half of one.

Read: opened with O_NOFOLLOW|O_NONBLOCK (a symlink or a FIFO in its place neither redirects
nor hangs start-up), must be a regular file under MAX_BYTES, UTF-8 JSON without NaN/Infinity,
and every field of every entry is checked. A file that fails a check of the whole (not JSON,
another version, no list of entries) is set aside (renamed `*.corrupt-<time>`) and the queue
is rebuilt from the kernel by adoption: a bad file must never crash-loop the daemon. An
entry that fails a check is set aside alone (copied into `*.corrupt-<time>`, one line, a
count in `entries_set_aside`) and the others load: one bad entry must not turn every other
drain into an adoption with a default deadline.

A drain its pod's lifetime bounds has no deadline: `"deadline": null` with
`"deadline_source": "pod"`. The version before that read Pod objects wrote `"pod"` with the
pod's deletionTimestamp as the deadline and no `pod_uid`: such an entry loads as a drain
its pod bounds (the number is dropped, it may be a former pod's of the same name), and the
first sync judges it again from the slices (still terminating, gone, or neither).
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import stat
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ipvsctl.model import (
    NO_DEADLINE,
    DeadlineSource,
    DrainEntry,
    DrainReason,
    PodRef,
    Protocol,
    RealServerKey,
    ServiceKey,
    ServiceRef,
    normalize_ip,
)
from ipvsctl.obs.logging import fields
from ipvsctl.source.duration import MAX_SECONDS
from ipvsctl.source.validate import short

log = logging.getLogger("ipvsctl.state")

FILE_NAME = "drain-queue.json"
FORMAT_VERSION = 1
# ~250 bytes an entry: 8 MB is 32,000 draining real servers, and parsing a file at the cap
# peaks at ~50 MiB traced (a 64 MB one took 566 MiB, beyond the pod's 384). A queue that would
# write more is a write error (counted, retried), never a file the next start sets aside.
MAX_BYTES = 8 << 20
# Times are epoch seconds: not before 1970, not past 2106 (u32), and a drain is never
# longer than the longest timeout a flag or annotation takes (a week) plus slack.
MAX_TIME = float(2**32)
MAX_DRAIN_SECONDS = MAX_SECONDS + 24 * 3600


class BadState(ValueError):
    """A state file that must not be used; the message says why."""


def _reject_constant(name: str) -> Any:
    raise BadState(f"{name} is not a number ipvsctl writes")


def _str(d: dict[str, Any], key: str) -> str:
    v = d.get(key)
    if not isinstance(v, str) or not v or len(v) > 512:
        raise BadState(f"{key}: {short(v)} is not a string")
    return v


def _port(d: dict[str, Any], key: str) -> int:
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 65535:
        raise BadState(f"{key}: {short(v)} is not a port")
    return v


def _time(d: dict[str, Any], key: str) -> float:
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v <= MAX_TIME:
        raise BadState(f"{key}: {short(v)} is not a time (epoch seconds, 0 to 2^32)")
    return float(v)


def _ip(d: dict[str, Any], key: str) -> str:
    text = _str(d, key)
    try:
        ip = normalize_ip(text)
    except ValueError:
        raise BadState(f"{key}: {short(text)} is not an IP address") from None
    if ip != text:  # ipvsctl writes the compressed form; anything else was not written by it
        raise BadState(f"{key}: {short(text)} is not an IP address in compressed form")
    return ip


def _uid(d: dict[str, Any]) -> str:
    v = d.get("pod_uid")
    if v is None:
        return ""
    if not isinstance(v, str) or len(v) > 128:
        raise BadState(f"pod_uid: {short(v)} is not a uid")
    return v


def _ref(d: dict[str, Any], key: str) -> str | None:
    if d.get(key) is None:
        return None
    text = _str(d, key)
    namespace, slash, name = text.partition("/")
    if not slash or not namespace or not name:
        raise BadState(f"{key}: {short(text)} is not namespace/name")
    return text


def entry_from_json(d: Any) -> DrainEntry:
    """One entry, every field checked; BadState otherwise."""
    if not isinstance(d, dict):
        raise BadState("an entry is not an object")
    try:
        protocol = Protocol(_str(d, "protocol"))
        reason = DrainReason(_str(d, "reason"))
        source = DeadlineSource(_str(d, "deadline_source"))
    except ValueError as exc:
        raise BadState(str(exc)) from None
    service, pod, uid = _ref(d, "service"), _ref(d, "pod"), _uid(d)
    if source is DeadlineSource.POD:
        if d.get("deadline") is not None:
            _time(d, "deadline")  # an old file's deletionTimestamp: checked, then dropped
        deadline = NO_DEADLINE
    else:
        deadline = _time(d, "deadline")
    since = _time(d, "since")
    if not since <= deadline <= since + MAX_DRAIN_SECONDS and deadline != NO_DEADLINE:
        raise BadState(f"deadline {deadline} is not within a drain of since {since}")
    vs_draining = d.get("vs_draining", False)
    if not isinstance(vs_draining, bool):
        raise BadState(f"vs_draining: {vs_draining!r} is not a boolean")
    return DrainEntry(
        vs=ServiceKey(protocol, _ip(d, "vip"), _port(d, "vport")),
        rs=RealServerKey(_ip(d, "address"), _port(d, "port")),
        service=ServiceRef.parse(service) if service else None,
        reason=reason,
        since=since,
        deadline=deadline,
        deadline_source=source,
        pod=PodRef.parse(pod, uid) if pod else None,
        vs_draining=vs_draining,
    )


def parse_state(raw: bytes) -> list[DrainEntry]:
    """The entries of a state file's bytes; BadState for anything ipvsctl did not write,
    an entry of it included."""
    entries, bad = parse_entries(raw)
    if bad:
        raise BadState(bad[0][1])
    return entries


def parse_entries(raw: bytes) -> tuple[list[DrainEntry], list[tuple[Any, str]]]:
    """The good entries of a state file's bytes, and each bad one (as read) with why;
    BadState when the file as a whole is not one ipvsctl wrote."""
    try:
        doc = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except UnicodeDecodeError as exc:
        raise BadState(f"not UTF-8: {exc}") from None
    except json.JSONDecodeError as exc:
        raise BadState(f"not JSON: {exc}") from None
    except RecursionError:
        raise BadState("nested too deeply") from None
    except ValueError as exc:  # an integer past sys.get_int_max_str_digits() (5,000 digits)
        raise BadState(f"not JSON ipvsctl writes: {str(exc)[:120]}") from None
    if not isinstance(doc, dict) or doc.get("version") != FORMAT_VERSION:
        version = doc.get("version") if isinstance(doc, dict) else None
        raise BadState(f"unknown version {short(version)}")
    entries = doc.get("entries")
    if not isinstance(entries, list):
        raise BadState("entries is not a list")
    good: list[DrainEntry] = []
    bad: list[tuple[Any, str]] = []
    for e in entries:
        try:
            good.append(entry_from_json(e))
        except BadState as exc:
            bad.append((e, str(exc)))
        except (ValueError, TypeError, OverflowError) as exc:
            bad.append((e, f"{type(exc).__name__}: {short(str(exc))}"))
    return good, bad


class DrainStateFile:
    def __init__(self, state_dir: str | Path) -> None:
        self.dir = Path(state_dir)
        self.path = self.dir / FILE_NAME
        self.load_error: str | None = None  # why the last load found no usable file
        self.entries_set_aside = 0  # entries the last load could not read (the rest loaded)
        # The longest JSON text one encoder call made while saving: an entry's, never the
        # queue's (the cost tests read it).
        self.longest_encoded = 0
        # One save at a time: the writer thread's and the shutdown's share the .tmp name (a
        # second save unlinked the first's tmp and renamed its own, and the first then
        # failed or put back an older queue).
        self._lock = threading.Lock()

    def ensure_dir(self) -> None:
        """OSError if the folder cannot be made or written (a fatal start-up error)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        if not os.access(self.dir, os.W_OK):
            raise PermissionError(f"{self.dir} is not writable")

    def _read(self) -> bytes | None:
        """The file's bytes, None if there is none; BadState/OSError otherwise."""
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(self.path, flags)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise BadState("is a symlink") from None
            raise
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise BadState("is not a regular file")
            if st.st_size > MAX_BYTES:
                raise BadState(f"larger than {MAX_BYTES} bytes")
            chunks = []
            size = 0
            while chunk := os.read(fd, 1 << 20):
                size += len(chunk)
                if size > MAX_BYTES:  # grown since the fstat
                    raise BadState(f"larger than {MAX_BYTES} bytes")
                chunks.append(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)

    def load(self) -> list[DrainEntry]:
        """The saved queue; [] (the file set aside, one line, `load_error` set) for a file
        that cannot be used, whatever is in it: a raise here would be a crash loop."""
        self.load_error = None
        self.entries_set_aside = 0
        try:
            raw = self._read()
            if raw is None:
                return []
            try:
                entries, bad = parse_entries(raw)
            except BadState:
                raise
            except (ValueError, TypeError, OverflowError, RecursionError, MemoryError) as exc:
                raise BadState(f"{type(exc).__name__}: {short(str(exc))}") from None
            if bad:
                self._set_entries_aside(bad)
            return entries
        except BadState as exc:
            aside = self.path.with_name(f"{FILE_NAME}.corrupt-{int(time.time())}")
            try:
                self.path.rename(aside)  # a rename moves a symlink or FIFO, not its target
            except OSError:
                aside = self.path
            self.load_error = f"corrupt: {exc}"
            log.error(
                "drain state corrupt, set aside; rebuilding the queue from the kernel",
                extra=fields(path=aside, error=exc),
            )
            return []
        except OSError as exc:
            self.load_error = f"unreadable: {exc}"
            log.error(
                "drain state unreadable, rebuilding the queue from the kernel",
                extra=fields(path=self.path, error=exc),
            )
            return []

    def _set_entries_aside(self, bad: list[tuple[Any, str]]) -> None:
        """Entries that cannot be read go to a file of their own beside the state (kept
        for a look; the next save writes the state without them): one line for all."""
        self.entries_set_aside = len(bad)
        aside = self.path.with_name(f"{FILE_NAME}.corrupt-{int(time.time())}")
        where: Path | None = aside
        try:
            doc = {"version": FORMAT_VERSION, "entries": [e for e, _ in bad]}
            fd = os.open(
                aside, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
            )
            with os.fdopen(fd, "w") as f:
                json.dump(doc, f)
        except (OSError, ValueError, TypeError, RecursionError) as exc:
            where = None  # the count and the line still say it; the copy is a courtesy
            log.debug("drain state entries not copied aside", extra=fields(error=exc))
        log.error(
            "drain state entries unreadable, set aside; the others loaded",
            extra=fields(path=where, entries=len(bad), first_error=short(bad[0][1])),
        )

    def save(self, entries: Iterable[DrainEntry], lock_timeout: float = -1) -> None:
        """Atomic replace; raises OSError (the caller counts it and retries later), EBUSY
        when another save still runs after `lock_timeout` seconds (-1: wait)."""
        if not self._lock.acquire(timeout=lock_timeout):
            raise OSError(errno.EBUSY, "another write of the drain state is still running")
        try:
            self._save(entries)
        finally:
            self._lock.release()

    def _save(self, entries: Iterable[DrainEntry]) -> None:
        # Entry by entry: one json.dumps of the whole queue is one C call that holds the GIL
        # throughout (~30 ms for 1,000 entries under emulation, every event waiting); short
        # calls let the loop thread in between. The same document, byte for byte.
        encode = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode
        pieces: list[str] = []
        try:
            for e in entries:
                pieces.append(piece := encode(e.to_json()))
                self.longest_encoded = max(self.longest_encoded, len(piece))
            data = (f'{{"version":{FORMAT_VERSION},"entries":[' + ",".join(pieces) + "]}").encode()
        except ValueError as exc:  # a NaN deadline would never expire: refuse to keep it
            raise OSError(errno.EINVAL, f"drain state not serializable: {exc}") from None
        if len(data) > MAX_BYTES:  # load() would set it aside: keep the last good one
            raise OSError(errno.EFBIG, f"drain state over {MAX_BYTES} bytes ({len(data)})")
        tmp = self.path.with_name(f".{FILE_NAME}.tmp")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)  # whatever is there (a leftover, a planted symlink) goes
        fd = os.open(
            tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
        )
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        dir_fd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

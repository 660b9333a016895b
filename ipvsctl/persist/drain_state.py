"""The drain queue on disk: one JSON file in --state-dir, replaced atomically.

Write: a fresh temporary file in the same folder (any old one, even a symlink planted there,
is unlinked first and the new one made with O_EXCL|O_NOFOLLOW), fsync, rename over the old
one, fsync the folder; a crash leaves either the old or the new file, never half of one.

Read: opened with O_NOFOLLOW|O_NONBLOCK (a symlink or a FIFO in its place neither redirects
nor hangs start-up), must be a regular file under MAX_BYTES, UTF-8 JSON without NaN/Infinity,
and every field of every entry is checked. A file that fails any check is set aside (renamed
`*.corrupt-<time>`) and the queue is rebuilt from the kernel by adoption: a bad file must
never crash-loop the daemon.

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
import math
import os
import stat
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

log = logging.getLogger("ipvsctl.state")

FILE_NAME = "drain-queue.json"
FORMAT_VERSION = 1
# ~250 bytes an entry: 64 MB is a quarter of a million draining real servers.
MAX_BYTES = 64 << 20


class BadState(ValueError):
    """A state file that must not be used; the message says why."""


def _reject_constant(name: str) -> Any:
    raise BadState(f"{name} is not a number ipvsctl writes")


def _str(d: dict[str, Any], key: str) -> str:
    v = d.get(key)
    if not isinstance(v, str) or not v or len(v) > 512:
        raise BadState(f"{key}: {v!r} is not a string")
    return v


def _port(d: dict[str, Any], key: str) -> int:
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 65535:
        raise BadState(f"{key}: {v!r} is not a port")
    return v


def _time(d: dict[str, Any], key: str) -> float:
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise BadState(f"{key}: {v!r} is not a time")
    return float(v)


def _ip(d: dict[str, Any], key: str) -> str:
    text = _str(d, key)
    try:
        ip = normalize_ip(text)
    except ValueError:
        raise BadState(f"{key}: {text!r} is not an IP address") from None
    if ip != text:  # ipvsctl writes the compressed form; anything else was not written by it
        raise BadState(f"{key}: {text!r} is not an IP address in compressed form")
    return ip


def _uid(d: dict[str, Any]) -> str:
    v = d.get("pod_uid")
    if v is None:
        return ""
    if not isinstance(v, str) or len(v) > 128:
        raise BadState(f"pod_uid: {v!r} is not a uid")
    return v


def _ref(d: dict[str, Any], key: str) -> str | None:
    if d.get(key) is None:
        return None
    text = _str(d, key)
    namespace, slash, name = text.partition("/")
    if not slash or not namespace or not name:
        raise BadState(f"{key}: {text!r} is not namespace/name")
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
    return DrainEntry(
        vs=ServiceKey(protocol, _ip(d, "vip"), _port(d, "vport")),
        rs=RealServerKey(_ip(d, "address"), _port(d, "port")),
        service=ServiceRef.parse(service) if service else None,
        reason=reason,
        since=_time(d, "since"),
        deadline=deadline,
        deadline_source=source,
        pod=PodRef.parse(pod, uid) if pod else None,
    )


def parse_state(raw: bytes) -> list[DrainEntry]:
    """The entries of a state file's bytes; BadState for anything ipvsctl did not write."""
    try:
        doc = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except UnicodeDecodeError as exc:
        raise BadState(f"not UTF-8: {exc}") from None
    except json.JSONDecodeError as exc:
        raise BadState(f"not JSON: {exc}") from None
    except RecursionError:
        raise BadState("nested too deeply") from None
    if not isinstance(doc, dict) or doc.get("version") != FORMAT_VERSION:
        version = doc.get("version") if isinstance(doc, dict) else None
        raise BadState(f"unknown version {version!r}")
    entries = doc.get("entries")
    if not isinstance(entries, list):
        raise BadState("entries is not a list")
    return [entry_from_json(e) for e in entries]


class DrainStateFile:
    def __init__(self, state_dir: str | Path) -> None:
        self.dir = Path(state_dir)
        self.path = self.dir / FILE_NAME
        self.load_error: str | None = None  # why the last load found no usable file
        # The longest JSON text one encoder call made while saving: an entry's, never the
        # queue's (the cost tests read it).
        self.longest_encoded = 0

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
        self.load_error = None
        try:
            raw = self._read()
            if raw is None:
                return []
            return parse_state(raw)
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

    def save(self, entries: Iterable[DrainEntry]) -> None:
        """Atomic replace; raises OSError (the caller counts it and retries later)."""
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

"""Structured logging: fixed messages, variable data as key=value fields.

    log.info("drain started", extra=fields(vs=..., rs=..., reason=...))

`--log-format text` prints `msg key=value ...`; `json` prints one object per line.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Hashable
from typing import Any


def fields(**kw: Any) -> dict[str, Any]:
    """The `extra=` argument carrying structured fields."""
    return {"fields": kw}


class FailureStreaks:
    """One log line per failure streak, as Cilium's reflectorHealth: `failed` logs the first
    failure of a run (every failure is still counted, by the caller's metric) and `recovered`
    ends the run, logging once that it did. One streak per key (an nft operation, a Service,
    a port); key None for the only one. Thread-safe."""

    def __init__(self, logger: logging.Logger) -> None:
        self._log = logger
        self._lock = threading.Lock()
        self._failing: dict[Hashable, None] = {}  # insertion-ordered

    def failing(self, key: Hashable = None) -> bool:
        with self._lock:
            return key in self._failing

    def running(self) -> list[Hashable]:
        """The keys whose streak is running, oldest first."""
        with self._lock:
            return list(self._failing)

    def failed(self, level: int, message: str, /, *, key: Hashable = None, **kw: Any) -> bool:
        """A failure: logged when it starts a streak (then True)."""
        with self._lock:
            first = key not in self._failing
            self._failing[key] = None
        if first:
            self._log.log(level, message, extra=fields(**kw), stacklevel=2)
        return first

    def recovered(self, message: str | None, /, *, key: Hashable = None, **kw: Any) -> bool:
        """A success: ends the streak, if one was running (then True, and `message` is
        logged at info; None: ended silently)."""
        with self._lock:
            was = key in self._failing
            self._failing.pop(key, None)
        if was and message is not None:
            self._log.info(message, extra=fields(**kw), stacklevel=2)
        return was


# A value printed bare: printable ASCII but for the characters that would end it or start
# another field. Anything else (a space, `=`, a newline from an object's name or an error
# text) is JSON-quoted, so a value can never forge a field or a log line.
_BARE = re.compile(r"[!#-<>-\[\]-~]+", re.ASCII)


def _value(v: Any) -> str:
    s = str(v)
    return s if _BARE.fullmatch(s) else json.dumps(s)


def _message(msg: str) -> str:
    """Messages are fixed text, but a library's may carry a peer's text: never a new line."""
    return msg if msg.isprintable() else json.dumps(msg)[1:-1]


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        data = getattr(record, "fields", None) or {}
        kv = " ".join(f"{k}={_value(v)}" for k, v in data.items())
        line = f"{ts}.{int(record.msecs):03d}Z {record.levelname:<5} {record.name}: "
        line += _message(record.getMessage()) + (f" {kv}" if kv else "")
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JSONFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for k, v in (getattr(record, "fields", None) or {}).items():
            out[k] = v if isinstance(v, int | float | bool) or v is None else str(v)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out)


LOG_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


def parse_level(name: str) -> int:
    """`--log-level` -> a logging level; ValueError for anything else."""
    try:
        return LOG_LEVELS[name.strip().lower()]
    except KeyError:
        raise ValueError(f"must be one of {'|'.join(LOG_LEVELS)}") from None


def json_configured() -> bool:
    """Whether setup() made the log JSON (a fatal start-up line is then a JSON line too)."""
    return any(isinstance(h.formatter, JSONFormatter) for h in logging.getLogger().handlers)


# The libraries whose own logs are theirs, not ipvsctl's decisions: pyroute2 logs every
# netlink message as a dict at debug (and asyncio its selector, under pyroute2), urllib3
# every connection. Below warning they are left out, whatever --log-level says, unless
# IPVSCTL_LOG_LIBRARIES names them ("pyroute2", "pyroute2,urllib3" or "all"):
# `--log-level debug` reads as ipvsctl's own account.
LIBRARIES = ("pyroute2", "asyncio", "urllib3", "kubernetes")
LIBRARIES_ENV = "IPVSCTL_LOG_LIBRARIES"


class LibraryFilter(logging.Filter):
    """Lets a library's record through at warning and above, or when it is opted in. A
    filter on the handler, not a level on the library's logger: pyroute2 resets its
    logger's level when it is imported, which may come after setup()."""

    def __init__(self, opted_in: str = "") -> None:
        super().__init__()
        wanted = {n.strip() for n in opted_in.split(",") if n.strip()}
        self.quiet = () if "all" in wanted else tuple(n for n in LIBRARIES if n not in wanted)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING or not self.quiet:
            return True
        name = record.name
        return not any(name == n or name.startswith(n + ".") for n in self.quiet)


def setup(fmt: str = "text", level: int | str = logging.INFO) -> None:
    if isinstance(level, str):
        level = parse_level(level)
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(LibraryFilter(os.environ.get(LIBRARIES_ENV, "")))
    handler.setFormatter(JSONFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)

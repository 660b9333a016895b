"""The cyclic garbage collector paused while large structures are built, by any number of
holders at once (the API source decoding a list, the daemon waiting for its first sync):
off while one holds it, back on when the last lets go, and only if it was on when the first
took it. One owner of the process-wide switch, so that two pauses never undo each other."""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

_lock = threading.Lock()
_holders = 0
_was_enabled = False


def hold() -> None:
    global _holders, _was_enabled
    with _lock:
        if _holders == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _holders += 1


def release() -> None:
    global _holders
    with _lock:
        _holders -= 1
        if _holders == 0 and _was_enabled:
            gc.enable()


@contextlib.contextmanager
def paused() -> Iterator[None]:
    hold()
    try:
        yield
    finally:
        release()

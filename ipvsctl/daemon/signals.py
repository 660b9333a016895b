"""The main thread's part in `ipvsctl run` and `ipvsctl shutdown-manager`: start, then wait
for SIGTERM or SIGINT."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable


def serve_until_signal(start: Callable[[], None]) -> None:
    """Call `start` and return once SIGTERM or SIGINT arrives. The handlers are set first,
    so a signal during start-up is not lost; the wait wakes every second because a signal
    handler runs only between bytecodes of the main thread."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    start()
    while not stop.wait(1.0):
        pass

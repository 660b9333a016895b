"""A cheap "is the API server answering?" check, shared by the reflectors of one source.

`GET /readyz` is readable by every client (the `system:public-info-viewer` ClusterRole, bound
to authenticated and unauthenticated users), touches no etcd and returns a few bytes, so
probing it every few seconds during an outage costs the server next to nothing, unlike a
list. Any HTTP answer below 500 (other than 429) counts as "answering": a cluster that removed
the public binding answers 403, which still says the server is up.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

# Sends the request; returns the HTTP status, raises on connection errors and timeouts.
GetStatus = Callable[[], int]


class ReadyProbe:
    """`probe()` -> bool. Results are reused for `max_age` seconds and concurrent callers
    share one request, so two reflectors backed off together send one probe."""

    def __init__(
        self,
        get_status: GetStatus,
        *,
        max_age: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._get_status = get_status
        self._max_age = max_age
        self._clock = clock
        self._lock = threading.Lock()
        self._at: float | None = None
        self._last = False
        self.probes = 0  # requests sent

    def __call__(self) -> bool:
        with self._lock:
            now = self._clock()
            if self._at is not None and now - self._at < self._max_age:
                return self._last
            self.probes += 1
            try:
                status = self._get_status()
                ok = status < 500 and status != 429
            except Exception:  # refused, reset, timed out: not answering
                ok = False
            self._at, self._last = self._clock(), ok
            return ok

"""The reflector's retry rule (kube/retry.py) as a table: what a watch's end leads to."""

from __future__ import annotations

import pytest

from ipvsctl.kube.retry import (
    CLOSED,
    ERROR,
    EXPIRED,
    SUSPECT,
    TIMEOUT,
    Retry,
    Wait,
    decide_retry,
)

NOW, BACKOFF, HERD = Wait.NOW, Wait.BACKOFF, Wait.HERD


# reason, progress, expired_streak before, backed off, transient, have a version -> result
@pytest.mark.parametrize(
    ("reason", "progress", "streak", "backed_off", "transient", "rv", "expected"),
    [
        # a clean end after a working watch: watch again at once, from the resourceVersion
        (CLOSED, True, 0, False, False, True, Retry(NOW, False, 0)),
        # a clean end of a watch that did nothing (ended at once): the backoff, no relist
        (CLOSED, False, 0, True, False, True, Retry(BACKOFF, False, 0)),
        # the first 410: relist at once; after a working watch the streak starts over
        (EXPIRED, False, 0, False, False, True, Retry(NOW, True, 1)),
        (EXPIRED, True, 3, True, False, True, Retry(NOW, True, 1)),
        # a 410 repeated without progress: relist with backoff
        (EXPIRED, False, 1, False, False, True, Retry(BACKOFF, True, 2)),
        # the first 410 after an outage (backed off): the relists spread over the cluster
        (EXPIRED, False, 0, True, False, True, Retry(HERD, True, 1)),
        # a connection error or a 5xx with a version to resume from: no relist
        (ERROR, False, 0, False, True, True, Retry(BACKOFF, False, 0)),
        (TIMEOUT, False, 0, True, True, True, Retry(BACKOFF, False, 0)),
        # ... without one (the first list failed), or another error (bad data): relist
        (ERROR, False, 0, False, True, False, Retry(BACKOFF, True, 0)),
        (ERROR, False, 0, False, False, True, Retry(BACKOFF, True, 0)),
        (TIMEOUT, False, 0, False, False, True, Retry(BACKOFF, True, 0)),
        # an error after a working watch: still the backoff (reset by the caller first)
        (ERROR, True, 2, True, True, True, Retry(BACKOFF, False, 0)),
        # a list refused as suspect: kept out, listed again with backoff
        (SUSPECT, False, 0, False, False, True, Retry(BACKOFF, True, 0)),
    ],
)
def test_decide_retry(reason, progress, streak, backed_off, transient, rv, expected) -> None:
    assert (
        decide_retry(
            reason,
            progress=progress,
            expired_streak=streak,
            backed_off=backed_off,
            transient=transient,
            have_version=rv,
        )
        == expected
    )

"""The `ipvsctl.kube` logger and a helper for the house log style: a fixed message, the
variable data as key=value fields in `extra={"fields": ...}` (the daemon's formatter prints them).
"""

from __future__ import annotations

import logging

LOGGER = logging.getLogger("ipvsctl.kube")


def log(level: int, message: str, /, **fields: object) -> None:
    if LOGGER.isEnabledFor(level):
        LOGGER.log(level, message, extra={"fields": fields}, stacklevel=2)


def describe(exc: BaseException) -> str:
    """One short line for a log field. An API error's str() spans its headers and body, so
    anything with an HTTP `status` and `reason` (kubernetes' ApiException) is shortened."""
    status = getattr(exc, "status", None)
    if isinstance(status, int) and hasattr(exc, "reason"):
        return f"HTTP {status}: {exc.reason}"
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."

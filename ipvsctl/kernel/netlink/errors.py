"""The one place where netlink's errors become KernelErrors (as httpx maps its transport's
exceptions at the adapter): every call into pyroute2 or onto a netlink socket runs inside
`errors()`, so nothing above `kernel/` sees a NetlinkError, OSError or struct.error."""

from __future__ import annotations

import errno
import os
import struct
from collections.abc import Iterator
from contextlib import contextmanager

from pyroute2 import NetlinkError

from ipvsctl.kernel.netlink.wire import MalformedAnswer
from ipvsctl.kernel.port import (
    KernelError,
    KernelExists,
    KernelNotFound,
    KernelPermissionDenied,
    KernelTransient,
)

__all__ = ["NetlinkError", "error_code", "errors", "translate_error"]


def error_code(exc: BaseException) -> int | None:
    """The errno of a NetlinkError (`.code`) or OSError (`.errno`)."""
    if isinstance(exc, NetlinkError):
        return int(exc.code)
    if isinstance(exc, OSError):
        return exc.errno
    return None


def translate_error(exc: BaseException, operation: str, subject: str = "") -> KernelError:
    """The KernelError for a failed netlink call: ENOENT/ESRCH -> KernelNotFound, EEXIST ->
    KernelExists, EPERM/EACCES -> KernelPermissionDenied, anything else -> KernelTransient."""
    code = error_code(exc)
    reason = os.strerror(code) if code else (str(exc) or type(exc).__name__)
    message = f"{operation} {subject}: {reason}" if subject else f"{operation}: {reason}"
    if code in (errno.ENOENT, errno.ESRCH):
        return KernelNotFound(message, operation)
    if code == errno.EEXIST:
        return KernelExists(message, operation)
    if code in (errno.EPERM, errno.EACCES):
        return KernelPermissionDenied(f"{message} (needs CAP_NET_ADMIN)", operation)
    return KernelTransient(message, operation)


@contextmanager
def errors(operation: str, subject: object = "", scheduler: str | None = None) -> Iterator[None]:
    """Run a netlink call, re-raising its failure as the matching KernelError `from` it."""
    try:
        yield
    except KernelError:
        raise
    # RuntimeError: pyroute2 event loop; struct.error/OverflowError: a value that does not
    # fit its netlink field (parsing validates them; this keeps a miss to one Service).
    # MalformedAnswer: a dump answer that does not decode (wire.py).
    except (
        NetlinkError,
        OSError,
        RuntimeError,
        struct.error,
        OverflowError,
        MalformedAnswer,
    ) as exc:
        err = translate_error(exc, operation, str(subject))
        if scheduler is not None and isinstance(err, KernelNotFound):
            # a new/changed service gets ENOENT only for an unknown scheduler
            err = KernelNotFound(
                f"{err} (scheduler {scheduler!r} not available: modprobe ip_vs_{scheduler})",
                operation,
            )
        raise err from exc

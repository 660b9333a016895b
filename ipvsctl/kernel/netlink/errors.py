"""The one place where netlink's errors become KernelErrors (as httpx maps its transport's
exceptions at the adapter): every call into pyroute2 or onto a netlink socket runs inside
`errors()`, so nothing above `kernel/` sees a NetlinkError, OSError or struct.error."""

from __future__ import annotations

import errno
import os
import struct

from pyroute2 import NetlinkError

from ipvsctl.kernel.netlink.wire import MalformedAnswer
from ipvsctl.kernel.port import (
    KernelError,
    KernelExists,
    KernelNotFound,
    KernelPermissionDenied,
    KernelTransient,
)

__all__ = ["DestSubject", "NetlinkError", "error_code", "errors", "translate_error"]


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


class errors:
    """Run a netlink call, re-raising its failure as the matching KernelError `from` it.

    A class, not a @contextmanager generator, and `subject` is formatted only on a
    failure: it wraps every kernel write (110,000 in a 10,000-Service initial sync), where
    the generator and an eagerly built "key -> rs" string were allocations per write."""

    __slots__ = ("operation", "scheduler", "subject")

    def __init__(self, operation: str, subject: object = "", scheduler: str | None = None):
        self.operation = operation
        self.subject = subject
        self.scheduler = scheduler

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        # RuntimeError: pyroute2 event loop; struct.error/OverflowError: a value that does
        # not fit its netlink field (parsing validates them; this keeps a miss to one
        # Service). MalformedAnswer: a dump answer that does not decode (wire.py).
        if exc is None or isinstance(exc, KernelError) or not isinstance(exc, _TRANSLATED):
            return  # None: whatever was raised goes on as it is
        err = translate_error(exc, self.operation, str(self.subject))
        if self.scheduler is not None and isinstance(err, KernelNotFound):
            # a new/changed service gets ENOENT only for an unknown scheduler
            err = KernelNotFound(
                f"{err} (scheduler {self.scheduler!r} not available: "
                f"modprobe ip_vs_{self.scheduler})",
                self.operation,
            )
        raise err from exc


_TRANSLATED = (NetlinkError, OSError, RuntimeError, struct.error, OverflowError, MalformedAnswer)


class DestSubject:
    """ "<virtual server> -> <real server>", formatted only when an error names it."""

    __slots__ = ("key", "rs")

    def __init__(self, key: object, rs: object) -> None:
        self.key = key
        self.rs = rs

    def __str__(self) -> str:
        return f"{self.key} -> {self.rs}"

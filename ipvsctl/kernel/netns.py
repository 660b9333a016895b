"""Running a function inside a named network namespace, for both subsystems: netlink's
sockets and procfs's files are bound to the namespace of the thread that opens them.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable
from typing import TypeVar

from ipvsctl.kernel.port import KernelUnavailable

T = TypeVar("T")

NETNS_DIR = "/run/netns"
_CLONE_NEWNET = 0x40000000


def netns_path(netns: str) -> str:
    """A netns name as `ip netns` keeps it (/run/netns/NAME), or an absolute path."""
    return netns if netns.startswith("/") else os.path.join(NETNS_DIR, netns)


def enter_netns(netns: str) -> None:
    """setns(CLONE_NEWNET) into the named namespace, for the calling thread only (for the
    rest of its life: callers that must come back use run_in_netns)."""
    try:
        fd = os.open(netns_path(netns), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise KernelUnavailable(f"network namespace {netns} not found", "setns") from None
    try:
        setns = getattr(os, "setns", None)  # Python >= 3.12
        if setns is not None:
            setns(fd, _CLONE_NEWNET)
            return
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns {netns}: {os.strerror(err)}")
    finally:
        os.close(fd)


def run_in_netns(netns: str | None, fn: Callable[[], T]) -> T:
    """fn() inside the named network namespace, or here when netns is None.

    setns(CLONE_NEWNET) changes only the calling thread, so fn runs in a short-lived thread
    that enters the namespace and then ends: the caller's namespace never changes. Sockets
    fn creates stay in that namespace for their whole life, whichever thread uses them."""
    if netns is None:
        return fn()
    result: list[T] = []
    error: list[BaseException] = []

    def run() -> None:
        try:
            enter_netns(netns)
            result.append(fn())
        except BaseException as exc:  # re-raised in the caller's thread
            error.append(exc)

    thread = threading.Thread(target=run, name=f"netns-{netns}", daemon=True)
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]

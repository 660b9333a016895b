"""Enter a network namespace for the rest of a thread's life (client and server worker
threads live in one pod's namespace; a socket keeps the namespace it was created in)."""

from __future__ import annotations

import ctypes
import os

from ipvsctl.kernel.host import netns_path

CLONE_NEWNET = 0x40000000


def enter(name: str) -> None:
    """setns(CLONE_NEWNET) for the calling thread only."""
    fd = os.open(netns_path(name), os.O_RDONLY | os.O_CLOEXEC)
    try:
        setns = getattr(os, "setns", None)  # Python >= 3.12
        if setns is not None:
            setns(fd, CLONE_NEWNET)
            return
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns {name}: {os.strerror(err)}")
    finally:
        os.close(fd)

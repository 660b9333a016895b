"""Readers of IPVS's /proc files (the codecs are pure, in `codec`).

The files are per network namespace: they are opened by a thread inside `netns` (a proc
net file stays bound to the namespace it was opened in) and streamed line by line, so a
table of 100,000 connections is never held in memory.
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import IO, TypeVar

from ipvsctl.kernel.netns import run_in_netns
from ipvsctl.kernel.port import KernelError, KernelTransient, KernelUnavailable
from ipvsctl.kernel.procfs.codec import (
    ConnListing,
    TableScan,
    list_connections,
    scan_connections,
    scan_table,
)
from ipvsctl.model import ConnKey, ConnScan, RealServerKey, ServiceKey

# thread-self: the namespace of the thread that opens it (run_in_netns's), not the process's
CONN_FILE = "/proc/thread-self/net/ip_vs_conn"
TABLE_FILE = "/proc/thread-self/net/ip_vs"

T = TypeVar("T")


def _open(path: str, netns: str | None, operation: str) -> IO[str]:
    def open_() -> IO[str]:
        return open(path, encoding="ascii", errors="replace", buffering=1 << 16)

    try:
        return run_in_netns(netns, open_)
    except KernelError:
        raise
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.EACCES, errno.EPERM):
            raise KernelUnavailable(f"{path}: {exc.strerror}", operation) from None
        raise KernelTransient(f"{path}: {exc}", operation) from None


def _stream(f: IO[str], path: str, operation: str, scan: Callable[[Iterator[str]], T]) -> T:
    try:
        with f:
            return scan(iter(f))
    except OSError as exc:
        raise KernelTransient(f"{path}: {exc}", operation) from None


def read_connections(
    pairs: Collection[ConnKey], *, netns: str | None = None, path: str = CONN_FILE
) -> ConnScan:
    """One streamed pass over ip_vs_conn for these (virtual, real server) pairs.
    KernelUnavailable when the file is absent or unreadable (other kernels, permissions)."""
    f = _open(path, netns, "read_ip_vs_conn")
    return _stream(f, path, "read_ip_vs_conn", lambda lines: scan_connections(lines, pairs))


def read_connection_list(
    pairs: Collection[ConnKey], limit: int, *, netns: str | None = None, path: str = CONN_FILE
) -> ConnListing:
    """Up to `limit` connections of each of these pairs (`ipvsctl status --connections`):
    one streamed pass over ip_vs_conn. KernelUnavailable as `read_connections`."""
    f = _open(path, netns, "read_ip_vs_conn")
    return _stream(f, path, "read_ip_vs_conn", lambda lines: list_connections(lines, pairs, limit))


def read_real_servers(
    keys: Collection[ServiceKey] | None = None,
    only: Mapping[ServiceKey, Collection[RealServerKey]] | None = None,
    *,
    netns: str | None = None,
    path: str = TABLE_FILE,
) -> TableScan:
    """The real servers of these virtual servers (all when None), with only these of their
    real servers (`scan_table`): one read of /proc/net/ip_vs."""
    f = _open(path, netns, "read_ip_vs")
    scan = _stream(f, path, "read_ip_vs", lambda lines: scan_table(lines, keys, only))
    if not scan.complete:
        raise KernelTransient(f"{path}: no IPVS header", "read_ip_vs")
    return scan

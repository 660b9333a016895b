"""Host set-up that needs no netlink: the sysctls an IPVS service proxy relies on (written
through /proc/sys), and running a function inside a named network namespace.

No pyroute2 here (that stays in `netlink.py`); `netlink.configure_host` combines these
sysctls with the IPVS timeouts.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import threading
from collections.abc import Callable
from typing import TypeVar

from ipvsctl.kernel.port import KernelError, KernelPermissionDenied, KernelUnavailable

T = TypeVar("T")

PROC_SYS = "/proc/sys"
NETNS_DIR = "/run/netns"
_CLONE_NEWNET = 0x40000000

# What kube-proxy's IPVS mode sets, and why (NOTES §3).
BASE_SYSCTLS: dict[str, str] = {
    # keep netfilter conntrack for IPVS connections: needed for masquerade rules and for
    # deleting a removed UDP real server's conntrack entries
    "net.ipv4.vs.conntrack": "1",
    # packets of a connection whose real server was deleted are dropped and the entry
    # expires, so the client's next attempt is scheduled to a live real server
    "net.ipv4.vs.expire_nodest_conn": "1",
    # persistence templates pointing at a weight-0 real server expire, otherwise ClientIP
    # affinity keeps sending clients to a draining pod (kubernetes#71809)
    "net.ipv4.vs.expire_quiescent_template": "1",
    # NAT forwarding routes between the node and pod interfaces
    "net.ipv4.ip_forward": "1",
}
# Before 5.9, conn_reuse_mode=1 together with conntrack=1 stalled new connections that
# reused a port of an old one by ~1 s; kube-proxy sets 0 there only (fixed upstream in 5.9).
CONN_REUSE_SYSCTL = "net.ipv4.vs.conn_reuse_mode"
CONN_REUSE_FIXED_IN = (5, 9)


def parse_kernel_version(release: str) -> tuple[int, int]:
    """(major, minor) of a `uname -r` string such as "6.1.0-56-amd64"; ValueError if none."""
    m = re.match(r"(\d+)\.(\d+)", release.strip())
    if not m:
        raise ValueError(f"not a kernel release: {release!r}")
    return int(m.group(1)), int(m.group(2))


def wanted_sysctls(release: str | None = None) -> dict[str, str]:
    """The sysctls to set on a kernel of this release (default: the running one)."""
    wanted = dict(BASE_SYSCTLS)
    if parse_kernel_version(release or os.uname().release) < CONN_REUSE_FIXED_IN:
        wanted[CONN_REUSE_SYSCTL] = "0"
    return wanted


def sysctl_path(name: str, proc_sys: str = PROC_SYS) -> str:
    return os.path.join(proc_sys, *name.split("."))


def read_sysctl(name: str, *, netns: str | None = None, proc_sys: str = PROC_SYS) -> str:
    def read() -> str:
        with open(sysctl_path(name, proc_sys)) as f:
            return f.read().strip()

    return _sysctl_errors(name, lambda: run_in_netns(netns, read))


def write_sysctl(
    name: str, value: str, *, netns: str | None = None, proc_sys: str = PROC_SYS
) -> None:
    def write() -> None:
        with open(sysctl_path(name, proc_sys), "w") as f:
            f.write(value)

    _sysctl_errors(name, lambda: run_in_netns(netns, write))


def apply_sysctls(
    wanted: dict[str, str] | None = None, *, netns: str | None = None, proc_sys: str = PROC_SYS
) -> dict[str, str]:
    """Write each sysctl whose value differs; returns {name: new value} of those written.

    /proc/sys/net is per network namespace: with `netns`, the reads and writes happen in
    that namespace."""
    changed: dict[str, str] = {}
    for name, value in (wanted if wanted is not None else wanted_sysctls()).items():
        if read_sysctl(name, netns=netns, proc_sys=proc_sys) != value:
            write_sysctl(name, value, netns=netns, proc_sys=proc_sys)
            changed[name] = value
    return changed


def _sysctl_errors(name: str, fn: Callable[[], T]) -> T:
    try:
        return fn()
    except FileNotFoundError:
        if name.startswith("net.ipv4.vs."):
            raise KernelUnavailable(
                f"sysctl {name} is missing: IPVS is not loaded (modprobe ip_vs on the host)",
                "sysctl",
            ) from None
        raise KernelUnavailable(f"sysctl {name} is missing", "sysctl") from None
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise KernelPermissionDenied(
                f"cannot write sysctl {name} ({os.strerror(exc.errno)}): needs root and a "
                "writable /proc/sys (privileged init container, or set it on the host)",
                "sysctl",
            ) from None
        raise KernelError(f"sysctl {name}: {exc}", "sysctl") from exc


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

"""The sysctls an IPVS service proxy relies on, read and written through /proc/sys (per
network namespace: with `netns`, inside that namespace).

`netlink.configure_host` combines these with the IPVS timeouts at start-up.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from ipvsctl.kernel.netns import run_in_netns
from ipvsctl.kernel.port import KernelError, KernelPermissionDenied, KernelUnavailable

T = TypeVar("T")
log = logging.getLogger("ipvsctl.kernel")

PROC_SYS = "/proc/sys"
EXPIRE_NODEST_CONN = "net.ipv4.vs.expire_nodest_conn"

# What kube-proxy's IPVS mode sets, and why (NOTES §3).
BASE_SYSCTLS: dict[str, str] = {
    # keep netfilter conntrack for IPVS connections: needed for masquerade rules and for
    # deleting a removed UDP real server's conntrack entries
    "net.ipv4.vs.conntrack": "1",
    # 0, where kube-proxy sets 1: with 1 the kernel drops every connection of a deleted
    # real server at once, so a table another program flushes (kube-proxy's start-up
    # cleanup) would lose them all before the daemon puts it back. The daemon's own
    # deletions run with 1 (ExpireOnDelete): a deadline still cuts at once, each client
    # told at its next packet, and a UDP client moves to a live real server.
    EXPIRE_NODEST_CONN: "0",
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
# kube-proxy's --ipvs-strict-arp: no ARP answers for the ClusterIPs on kube-ipvs0 (MetalLB's
# L2 mode needs it)
STRICT_ARP_SYSCTLS = {"net.ipv4.conf.all.arp_ignore": "1", "net.ipv4.conf.all.arp_announce": "2"}


def parse_kernel_version(release: str) -> tuple[int, int]:
    """(major, minor) of a `uname -r` string such as "6.1.0-56-amd64"; ValueError if none."""
    m = re.match(r"(\d+)\.(\d+)", release.strip())
    if not m:
        raise ValueError(f"not a kernel release: {release!r}")
    return int(m.group(1)), int(m.group(2))


def wanted_sysctls(release: str | None = None, *, strict_arp: bool = False) -> dict[str, str]:
    """The sysctls to set on a kernel of this release (default: the running one)."""
    wanted = dict(BASE_SYSCTLS)
    if strict_arp:
        wanted.update(STRICT_ARP_SYSCTLS)
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


HOST_PROC_SYS = "/host/proc/sys"


def writable_proc_sys(netns: str | None = None, host: str = HOST_PROC_SYS) -> str:
    """Where the daemon writes expire_nodest_conn while running: a container's own
    /proc/sys is read-only, so the DaemonSet mounts the host's file under /host/proc/sys
    (where node-prep finds the host's sysctls); elsewhere, and in a network namespace (the
    lab), /proc/sys."""
    if netns is None and os.path.exists(sysctl_path(EXPIRE_NODEST_CONN, host)):
        return host
    return PROC_SYS


class ExpireOnDelete:
    """`around()` a deletion of the daemon's own: expire_nodest_conn at 1 while it runs,
    back to 0 after (also when it fails). The kernel (>= 5.9) queues the expiry of a
    deleted real server's connections when it is deleted with 1, so the deletion cuts
    them as it always did; at 0 between deletions, a foreign flush keeps them (its real
    servers wait in the kernel's trash until the daemon re-adds them).

    A node left at 1 (an operator's choice, node-prep not run) is never written: it keeps
    kube-proxy's behaviour. A sysctl that is missing or not writable is left alone (one
    line) and the deletion goes on. The file stays open (opened in `netns`): a write is one
    pwrite, no namespace switch. Nested and concurrent deletions share one window."""

    def __init__(self, *, netns: str | None = None, proc_sys: str = PROC_SYS) -> None:
        self.netns = netns
        self.proc_sys = proc_sys
        self.writes = 0
        self._fd: int | None = None
        self._broken = False
        self._depth = 0
        self._lock = threading.Lock()

    def _open(self) -> int | None:
        if self._fd is None and not self._broken:
            path = sysctl_path(EXPIRE_NODEST_CONN, self.proc_sys)
            try:
                self._fd = run_in_netns(self.netns, lambda: os.open(path, os.O_RDWR | os.O_CLOEXEC))
            except (OSError, KernelError) as exc:
                self._give_up(exc)
        return self._fd

    def _give_up(self, exc: BaseException) -> None:
        self._broken = True
        log.warning(
            "expire_nodest_conn not settable: deletions keep the node's value",
            extra={"error": str(exc)},
        )

    def _write(self, fd: int, value: bytes) -> None:
        try:
            os.pwrite(fd, value, 0)
            self.writes += 1
        except OSError as exc:
            self._give_up(exc)

    @contextmanager
    def around(self) -> Iterator[None]:
        with self._lock:
            fd = self._open()
            raised = False
            if fd is not None and self._depth == 0:
                try:
                    raised = os.pread(fd, 16, 0).strip() == b"0"
                except OSError as exc:
                    self._give_up(exc)
                if raised:
                    self._write(fd, b"1")
            elif fd is not None:
                raised = True  # a window is open: share it
            if raised:
                self._depth += 1
        try:
            yield
        finally:
            if raised:
                with self._lock:
                    self._depth -= 1
                    if self._depth == 0 and self._fd is not None and not self._broken:
                        self._write(self._fd, b"0")

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

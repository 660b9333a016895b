"""The sysctls an IPVS service proxy relies on, read and written through /proc/sys (per
network namespace: with `netns`, inside that namespace).

`netlink.configure_host` combines these with the IPVS timeouts at start-up.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Callable
from typing import TypeVar

from ipvsctl.kernel.netns import run_in_netns
from ipvsctl.kernel.port import KernelError, KernelPermissionDenied, KernelUnavailable

T = TypeVar("T")

PROC_SYS = "/proc/sys"

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

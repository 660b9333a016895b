"""The kernel boundary: the IPVS operations the engine needs, and their implementations.

Here: `port` (the IPVSKernel, RealServerBatch and ConntrackTable interfaces and their
errors), `fake` (an in-memory kernel for tests and dry runs), `wrappers` (recording and
fault-injecting kernels, the op-log format), `table` (the whole table read through the port,
and its text), `netns` (running inside a named network namespace). One subpackage per kernel
subsystem: `netlink/` (pyroute2: NetlinkKernel, the real IPVSKernel, and the only package
that imports pyroute2) and `procfs/` (the /proc/net/ip_vs* readers and the /proc/sys
sysctls).
"""

from ipvsctl.kernel.port import (
    IPVSKernel,
    KernelError,
    KernelExists,
    KernelNotFound,
    KernelPermissionDenied,
    KernelTransient,
    KernelUnavailable,
)

__all__ = [
    "IPVSKernel",
    "KernelError",
    "KernelExists",
    "KernelNotFound",
    "KernelPermissionDenied",
    "KernelTransient",
    "KernelUnavailable",
]

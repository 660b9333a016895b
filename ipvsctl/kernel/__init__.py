"""The kernel boundary: the IPVS operations the engine needs, and their implementations.

`port` defines the interface and errors; `fake` is an in-memory kernel for tests;
`netlink` (pyroute2) is the real one and the only module that may import pyroute2.
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

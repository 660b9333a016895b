"""This node's IPVS table and ipvsctl's dummy interface, as `ipvsctl cleanup` removes them,
over netlink: IPVS opened lazily, the interface and its addresses through rtnetlink (the
daemon's own interface code), never created. Every failure is a KernelError; a kernel
without IPVS has no virtual servers."""

from __future__ import annotations

import contextlib

from ipvsctl.kernel.netlink.adapter import NetlinkKernel
from ipvsctl.kernel.netlink.interface import DummyInterface
from ipvsctl.kernel.netlink.sockets import Sockets
from ipvsctl.kernel.port import KernelNotFound, KernelUnavailable
from ipvsctl.model import ServiceKey


class SystemIpvsHost:
    def __init__(self, interface: str, *, netns: str | None = None) -> None:
        self.name = interface
        self._sockets = Sockets(netns)
        self._link = DummyInterface(self._sockets, interface)
        self._kernel: NetlinkKernel | None = None
        self._kernel_missing = False

    def _ipvs(self) -> NetlinkKernel | None:
        if self._kernel is None and not self._kernel_missing:
            try:
                self._kernel = NetlinkKernel(
                    self.name, create_interface=False, sockets=self._sockets
                )
            except KernelUnavailable:
                self._kernel_missing = True  # no IPVS module loaded: no virtual servers
        return self._kernel

    def virtual_servers(self) -> list[ServiceKey]:
        k = self._ipvs()
        return [] if k is None else [vs.key for vs in k.list_virtual_servers()]

    def delete_virtual_server(self, key: ServiceKey) -> None:
        k = self._ipvs()
        if k is None:
            return
        with contextlib.suppress(KernelNotFound):
            k.delete_virtual_server(key, bind_address=False)  # the interface goes whole

    def interface(self) -> tuple[str, list[str]] | None:
        """(kind, addresses) of the interface; None when there is none."""
        return self._link.describe()

    def delete_interface(self) -> None:
        self._link.delete()

    def delete_address(self, address: str) -> None:
        """One of ipvsctl's addresses off the interface (bound as /32 or /128)."""
        self._link.delete_address(address)

    def close(self) -> None:
        self._sockets.close()

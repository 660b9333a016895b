"""This node's IPVS table and ipvsctl's dummy interface, as `ipvsctl cleanup` removes them:
IPVS over netlink (opened lazily, never creating the interface), the interface and its
addresses through `ip`. Every failure is a KernelError; a kernel without IPVS has no
virtual servers."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess

from ipvsctl.kernel.netlink.adapter import NetlinkKernel
from ipvsctl.kernel.port import KernelError, KernelNotFound, KernelUnavailable
from ipvsctl.model import ServiceKey


class SystemIpvsHost:
    def __init__(self, interface: str) -> None:
        self.name = interface
        self._kernel: NetlinkKernel | None = None
        self._kernel_missing = False

    def _ipvs(self) -> NetlinkKernel | None:
        if self._kernel is None and not self._kernel_missing:
            try:
                self._kernel = NetlinkKernel(self.name, create_interface=False)
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

    def _ip(self, *args: str) -> str:
        try:
            r = subprocess.run(
                ["ip", *args], capture_output=True, text=True, timeout=30, check=False
            )
        except FileNotFoundError:
            raise KernelError("ip (iproute2) not found", "ip") from None
        if r.returncode != 0:
            raise KernelError(f"ip {' '.join(args)}: {r.stderr.strip() or r.returncode}", "ip")
        return r.stdout

    def interface(self) -> tuple[str, list[str]] | None:
        """(kind, addresses) of the interface; None when there is none."""
        try:
            socket.if_nametoindex(self.name)
        except OSError:
            return None
        links = json.loads(self._ip("-j", "-d", "addr", "show", "dev", self.name) or "[]")
        if not links:
            return None
        link = links[0]
        kind = (link.get("linkinfo") or {}).get("info_kind", "")
        addresses = sorted(a["local"] for a in link.get("addr_info", []) if "local" in a)
        return kind, addresses

    def delete_interface(self) -> None:
        self._ip("link", "delete", "dev", self.name)

    def delete_address(self, address: str) -> None:
        """One of ipvsctl's addresses off the interface (bound as /32 or /128)."""
        self._ip("addr", "delete", f"{address}/{128 if ':' in address else 32}", "dev", self.name)

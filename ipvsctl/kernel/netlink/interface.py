"""The dummy interface (`kube-ipvs0`) that holds the virtual IPs, and the index that says
whether an address still has a virtual server on it (kube-proxy's netlink address code).

The interface is left down, as kube-proxy leaves kube-ipvs0: its addresses are still local
addresses.
"""

from __future__ import annotations

import errno
import ipaddress
import threading
from collections.abc import Callable, Iterable
from typing import TypeVar

from pyroute2 import NetlinkError

from ipvsctl.kernel.netlink import wire
from ipvsctl.kernel.netlink.errors import error_code, errors
from ipvsctl.kernel.netlink.raw import RawRequests
from ipvsctl.kernel.netlink.sockets import Sockets
from ipvsctl.kernel.port import KernelError, KernelTransient
from ipvsctl.model import ServiceKey

DEFAULT_INTERFACE = "kube-ipvs0"
_T = TypeVar("_T")


class DummyInterface:
    """The VIP interface's addresses, through rtnetlink. Its index is looked up once and
    again if the interface was deleted under us (ENODEV)."""

    def __init__(self, sockets: Sockets, name: str = DEFAULT_INTERFACE) -> None:
        self.sockets = sockets
        self.name = name
        self._ifindex: int | None = None
        # add/del packed by hand (wire.py): pyroute2's request path was ~40% of an initial
        # sync under emulation (8.5 ms an address, against 0.5 ms a real server)
        self._raw = RawRequests()

    def ensure(self) -> int:
        """The interface's index, creating the interface if it is missing."""
        ipr = self.sockets.iproute()
        with errors("ensure_interface", self.name):
            found = ipr.link_lookup(ifname=self.name)
            if not found:
                try:
                    ipr.link("add", ifname=self.name, kind="dummy")
                except NetlinkError as exc:
                    if exc.code != errno.EEXIST:  # EEXIST: someone else just created it
                        raise
                found = ipr.link_lookup(ifname=self.name)
        if not found:
            raise KernelTransient(f"interface {self.name} vanished", "ensure_interface")
        self._ifindex = int(found[0])
        return self._ifindex

    def _with_index(self, operation: str, fn: Callable[[int], _T]) -> _T:
        """fn(ifindex), looking the interface up again once if it was deleted under us."""
        for attempt in (1, 2):
            index = self._ifindex if self._ifindex is not None else self.ensure()
            try:
                with errors(operation, self.name):
                    return fn(index)
            except KernelError as exc:
                if attempt == 2 or error_code(exc.__cause__ or exc) != errno.ENODEV:
                    raise
                self._ifindex = None
        raise AssertionError("unreachable")

    def addresses(self) -> list[str]:
        """The addresses on the interface (compressed form, sorted)."""
        return self._with_index("bound_addresses", self._read_addresses)

    def _read_addresses(self, index: int) -> list[str]:
        return sorted(
            {
                ipaddress.ip_address(a.get("IFA_ADDRESS")).compressed
                for a in self.sockets.iproute().get_addr(index=index)
                if a.get("IFA_ADDRESS")
            }
        )

    # --- as it is, never created (`ipvsctl cleanup`) -----------------------------------------
    def lookup(self) -> int | None:
        """The interface's index; None when there is none."""
        with errors("lookup_interface", self.name):
            found = self.sockets.iproute().link_lookup(ifname=self.name)
        return int(found[0]) if found else None

    def present(self) -> bool:
        """Whether the interface exists: one RTM_GETLINK by name, which the kernel answers
        alone (no dump of the node's links), packed by hand: the table guard's every pass."""
        ipr = self.sockets.iproute()
        with errors("lookup_interface", self.name):
            try:
                self._raw.send(ipr, wire.RTM_GETLINK, wire.get_link(self.name))
            except NetlinkError as exc:
                if exc.code == errno.ENODEV:
                    return False
                raise
        return True

    def describe(self) -> tuple[str, list[str]] | None:
        """(kind, addresses) of the interface; None when there is none."""
        index = self.lookup()
        if index is None:
            return None
        with errors("describe_interface", self.name):
            links = self.sockets.iproute().get_links(index)
            info = links[0].get_attr("IFLA_LINKINFO") if links else None
            kind = (info.get_attr("IFLA_INFO_KIND") if info is not None else None) or ""
            return str(kind), self._read_addresses(index)

    def delete(self) -> None:
        """Delete the interface (its addresses go with it); nothing when there is none."""
        index = self.lookup()
        if index is None:
            return
        with errors("delete_interface", self.name):
            try:
                self.sockets.iproute().link("del", index=index)
            except NetlinkError as exc:
                if exc.code != errno.ENODEV:  # gone meanwhile
                    raise
        self._ifindex = None

    def delete_address(self, address: str) -> None:
        """Remove address from the interface if both are there; never creates it."""
        index = self.lookup()
        if index is None:
            return
        self._ifindex = index
        self.unbind(address)

    def bind(self, address: str) -> None:
        """Put address/32 (/128) on the interface; nothing if it is there already."""
        ipr = self.sockets.iproute()

        def add(index: int) -> None:
            try:
                self._raw.send(ipr, wire.RTM_NEWADDR, wire.new_addr(index, address))
            except NetlinkError as exc:
                if exc.code != errno.EEXIST:
                    raise

        self._with_index("bind_address", add)

    def unbind(self, address: str) -> None:
        """Remove address from the interface; nothing if it is not there."""
        ipr = self.sockets.iproute()

        def delete(index: int) -> None:
            try:
                self._raw.send(ipr, wire.RTM_DELADDR, wire.del_addr(index, address))
            except NetlinkError as exc:
                if exc.code not in (errno.EADDRNOTAVAIL, errno.ENOENT):
                    raise

        self._with_index("unbind_address", delete)


class AddressIndex:
    """The kernel's virtual servers by address: whether an address is still in use.

    Read from the kernel at first use and on every full dump (the drift audit makes one
    each round, so changes made by other tools are seen), and kept up to date by this
    adapter's own adds and deletes in between. A dump per question made every virtual
    server deletion cost O(the whole table). Thread-safe."""

    def __init__(self) -> None:
        self._by_address: dict[str, set[ServiceKey]] | None = None
        self._lock = threading.Lock()

    def refresh(self, keys: Iterable[ServiceKey]) -> None:
        """The whole table was read: the index is exactly these keys."""
        by_address: dict[str, set[ServiceKey]] = {}
        for key in keys:
            by_address.setdefault(key.address, set()).add(key)
        with self._lock:
            self._by_address = by_address

    def loaded(self) -> bool:
        with self._lock:
            return self._by_address is not None

    def in_use(self, address: str) -> bool:
        """Whether any indexed virtual server (any protocol or port) has this address; False
        before the first refresh (callers refresh first)."""
        wanted = ipaddress.ip_address(address).compressed
        with self._lock:
            return bool((self._by_address or {}).get(wanted))

    def record(self, key: ServiceKey, present: bool) -> None:
        """`key` now is (or is not) in the kernel."""
        address = ipaddress.ip_address(key.address).compressed  # as dumps spell it
        key = ServiceKey(key.protocol, address, key.port)
        with self._lock:
            if self._by_address is None:
                return  # not read yet: the first read sees the kernel as it is
            keys = self._by_address.setdefault(address, set())
            if present:
                keys.add(key)
            else:
                keys.discard(key)
                if not keys:
                    del self._by_address[address]

"""Regressions the real-kernel lab (tests/lab) found, pinned down on the host: the netlink
adapter's index of addresses on the dummy interface (every virtual server deletion dumped the
whole IPVS table)."""

from __future__ import annotations

import errno
import ipaddress
from typing import Any

import pytest

from ipvsctl.kernel.netlink import NetlinkKernel, adapter
from ipvsctl.kernel.netlink.errors import NetlinkError
from ipvsctl.kernel.port import KernelNotFound
from ipvsctl.model import Protocol, ServiceKey, VirtualServer


# --- every virtual server deletion dumped the whole IPVS table --------------------------------
class ServiceMessage:
    """A service dump message as the adapter reads it (m.get(("service", field)))."""

    def __init__(self, fields: dict[str, Any]) -> None:
        self.fields = fields

    def get(self, key: tuple[str, str]) -> Any:
        return self.fields.get(key[1])

    def get_attr(self, name: str) -> Any:  # GET_CONFIG's timeouts: none set
        return None


class TableIPVS:
    """pyroute2's IPVS for the service commands the adapter sends, on a dict shared by every
    socket (one kernel), counting dumps."""

    prid = 1
    table: dict[tuple[int, str, int], dict[str, Any]] = {}
    dumps = 0

    def __init__(self, **_: Any) -> None:
        pass

    def nlm_request(self, *_: Any, **__: Any) -> list[Any]:  # GET_CONFIG: all defaults
        return [ServiceMessage({})]

    def service(self, cmd: str, service: Any = None) -> list[Any]:
        if cmd == "dump":
            TableIPVS.dumps += 1
            return [ServiceMessage(dict(v, flags={"flags": 0})) for v in self.table.values()]
        key = (service["protocol"], ipaddress.ip_address(service["addr"]).compressed,
               service["port"])
        if cmd == "add":
            if key in self.table:
                raise NetlinkError(errno.EEXIST)
            self.table[key] = {"protocol": key[0], "addr": key[1], "port": key[2],
                               "sched_name": service["sched_name"]}
        elif cmd == "del":
            if key not in self.table:
                raise NetlinkError(errno.ESRCH)
            del self.table[key]
        return []

    def close(self) -> None:
        pass


class AddressIPRoute:
    """pyroute2's IPRoute for the dummy interface's addresses."""

    addresses: set[str] = set()

    def __init__(self, **_: Any) -> None:
        pass

    def link_lookup(self, ifname: str) -> list[int]:
        return [7]

    def addr(self, cmd: str, index: int, address: str, prefixlen: int) -> None:
        if cmd == "add":
            self.addresses.add(address)
        else:
            self.addresses.discard(address)

    def close(self) -> None:
        pass


@pytest.fixture
def kernel(monkeypatch: pytest.MonkeyPatch) -> NetlinkKernel:
    monkeypatch.setattr(TableIPVS, "table", {})
    monkeypatch.setattr(TableIPVS, "dumps", 0)
    monkeypatch.setattr(AddressIPRoute, "addresses", set())
    monkeypatch.setattr(adapter, "IPVS", TableIPVS)
    monkeypatch.setattr(adapter, "IPRoute", AddressIPRoute)
    return NetlinkKernel(create_interface=False)


def vs(address: str, port: int, proto: Protocol = Protocol.TCP) -> VirtualServer:
    return VirtualServer(ServiceKey(proto, address, port))


def test_deleting_virtual_servers_reads_the_table_once_not_once_each(
    kernel: NetlinkKernel,
) -> None:
    # The lab's burst of 1,000 changes spent over half its time in `ipvsadm -Ln`-sized
    # dumps: each deletion asked the kernel whether its address was still in use. At
    # 10,000 Services every deletion cost a dump of the whole table.
    services = [vs(f"10.96.0.{i}", port) for i in range(1, 41) for port in (80, 443)]
    for v in services:
        kernel.add_virtual_server(v, bind_address=True)
    assert len(AddressIPRoute.addresses) == 40
    for v in services:
        kernel.delete_virtual_server(v.key, bind_address=True)
        # the address goes with the last virtual server on it, never before
        assert (v.key.address in AddressIPRoute.addresses) == (v.key.port == 80)
    assert AddressIPRoute.addresses == set() and TableIPVS.table == {}
    assert TableIPVS.dumps == 1


def test_the_address_index_follows_changes_made_by_others(kernel: NetlinkKernel) -> None:
    tcp, udp = vs("10.96.0.10", 80), vs("10.96.0.10", 53, Protocol.UDP)
    kernel.add_virtual_server(tcp, bind_address=True)
    kernel.add_virtual_server(udp, bind_address=True)
    assert kernel.address_in_use("10.96.0.10")  # read from the kernel at first use

    # a restarted daemon (a new adapter) starts from what the kernel holds
    again = NetlinkKernel(create_interface=False)
    again.delete_virtual_server(tcp.key, bind_address=True)
    assert AddressIPRoute.addresses == {"10.96.0.10"}  # the UDP one still uses it

    # someone adds one by hand on the address: seen at the next full dump (the audit's)
    TableIPVS.table[(6, "10.96.0.10", 8080)] = {
        "protocol": 6, "addr": "10.96.0.10", "port": 8080, "sched_name": "rr"}
    again.list_virtual_servers()
    again.delete_virtual_server(udp.key, bind_address=True)
    assert AddressIPRoute.addresses == {"10.96.0.10"}
    again.delete_virtual_server(ServiceKey(Protocol.TCP, "10.96.0.10", 8080), True)
    assert AddressIPRoute.addresses == set()

    # keys spelled another way than the kernel spells them (dumps are compressed)
    v6 = vs("fd96:0:0::10", 80)
    again.add_virtual_server(v6, bind_address=True)
    again.list_virtual_servers()
    again.delete_virtual_server(v6.key, bind_address=True)
    assert AddressIPRoute.addresses == set()

    # and one that is already gone still has its unused address removed
    again.bind_address("10.96.0.12")
    with pytest.raises(KernelNotFound):
        again.delete_virtual_server(ServiceKey(Protocol.TCP, "10.96.0.12", 80), True)
    assert AddressIPRoute.addresses == set()

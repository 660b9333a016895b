"""Regressions the real-kernel lab (tests/lab) found, pinned down on the host: the netlink
adapter's index of addresses on the dummy interface (every virtual server deletion dumped the
whole IPVS table)."""

from __future__ import annotations

import pytest

from devkit.fakenetlink import IPVSModel, model_sockets
from ipvsctl.kernel.netlink import NetlinkKernel
from ipvsctl.kernel.port import KernelNotFound
from ipvsctl.model import Protocol, ServiceKey, VirtualServer


# --- every virtual server deletion dumped the whole IPVS table --------------------------------
@pytest.fixture
def model() -> IPVSModel:
    return IPVSModel()


@pytest.fixture
def kernel(model: IPVSModel) -> NetlinkKernel:
    return NetlinkKernel(create_interface=False, sockets=model_sockets(model))


def vs(address: str, port: int, proto: Protocol = Protocol.TCP) -> VirtualServer:
    return VirtualServer(ServiceKey(proto, address, port))


def test_deleting_virtual_servers_reads_the_table_once_not_once_each(
    model: IPVSModel,
    kernel: NetlinkKernel,
) -> None:
    # The lab's burst of 1,000 changes spent over half its time in `ipvsadm -Ln`-sized
    # dumps: each deletion asked the kernel whether its address was still in use. At
    # 10,000 Services every deletion cost a dump of the whole table.
    services = [vs(f"10.96.0.{i}", port) for i in range(1, 41) for port in (80, 443)]
    for v in services:
        kernel.add_virtual_server(v, bind_address=True)
    assert len(model.addresses) == 40
    for v in services:
        kernel.delete_virtual_server(v.key, bind_address=True)
        # the address goes with the last virtual server on it, never before
        assert (v.key.address in model.addresses) == (v.key.port == 80)
    assert model.addresses == set() and model.table.services == {}
    assert model.service_dumps == 1


def test_the_address_index_follows_changes_made_by_others(
    model: IPVSModel,
    kernel: NetlinkKernel,
) -> None:
    tcp, udp = vs("10.96.0.10", 80), vs("10.96.0.10", 53, Protocol.UDP)
    kernel.add_virtual_server(tcp, bind_address=True)
    kernel.add_virtual_server(udp, bind_address=True)
    assert kernel.address_in_use("10.96.0.10")  # read from the kernel at first use

    # a restarted daemon (a new adapter) starts from what the kernel holds
    again = NetlinkKernel(create_interface=False, sockets=model_sockets(model))
    again.delete_virtual_server(tcp.key, bind_address=True)
    assert model.addresses == {"10.96.0.10"}  # the UDP one still uses it

    # someone adds one by hand on the address: seen at the next full dump (the audit's)
    model.table.add_virtual_server(vs("10.96.0.10", 8080), bind_address=False)
    again.list_virtual_servers()
    again.delete_virtual_server(udp.key, bind_address=True)
    assert model.addresses == {"10.96.0.10"}
    again.delete_virtual_server(ServiceKey(Protocol.TCP, "10.96.0.10", 8080), True)
    assert model.addresses == set()

    # keys spelled another way than the kernel spells them (dumps are compressed)
    v6 = vs("fd96:0:0::10", 80)
    again.add_virtual_server(v6, bind_address=True)
    again.list_virtual_servers()
    again.delete_virtual_server(v6.key, bind_address=True)
    assert model.addresses == set()

    # and one that is already gone still has its unused address removed
    again.bind_address("10.96.0.12")
    with pytest.raises(KernelNotFound):
        again.delete_virtual_server(ServiceKey(Protocol.TCP, "10.96.0.12", 80), True)
    assert model.addresses == set()

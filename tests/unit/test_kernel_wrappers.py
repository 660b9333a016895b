"""The kernel wrappers (recording, fault-injecting), the shared table reading and its text,
and the address index: all on the in-memory kernel."""

from __future__ import annotations

import pytest

from ipvsctl.kernel import table
from ipvsctl.kernel.fake import FakeKernel
from ipvsctl.kernel.fake import FaultyKernel as FaultyFromFake
from ipvsctl.kernel.netlink.interface import AddressIndex
from ipvsctl.kernel.port import IPVSKernel, KernelError, KernelTransient
from ipvsctl.kernel.wrappers import FaultyKernel, RecordingKernel
from ipvsctl.model import Protocol, RealServerKey, ServiceKey, VirtualServer

KEY = ServiceKey(Protocol.TCP, "10.96.0.10", 80)
RS = RealServerKey("10.244.1.1", 8080)


def program(k: IPVSKernel) -> None:
    k.add_virtual_server(VirtualServer(KEY, "rr"), bind_address=True)
    k.add_real_server(KEY, RS, 1)
    k.set_real_server_weight(KEY, RS, 0)
    k.flush_conntrack(KEY, RS)
    k.delete_real_server(KEY, RS)
    k.update_virtual_server(VirtualServer(KEY, "wrr"))
    k.delete_virtual_server(KEY, bind_address=True)


def test_recording_kernel_logs_what_the_fake_logs() -> None:
    fake, inner = FakeKernel(), FakeKernel()
    rec = RecordingKernel(inner)
    program(fake)
    program(rec)
    assert (
        rec.take_ops()
        == fake.take_ops()
        == [
            "add-vs 10.96.0.10:80/TCP rr",
            "add-rs 10.96.0.10:80/TCP -> 10.244.1.1:8080 weight 1",
            "set-rs 10.96.0.10:80/TCP -> 10.244.1.1:8080 weight 0",
            "flush-conntrack 10.96.0.10:80/TCP -> 10.244.1.1:8080",
            "del-rs 10.96.0.10:80/TCP -> 10.244.1.1:8080",
            "set-vs 10.96.0.10:80/TCP wrr",
            "del-vs 10.96.0.10:80/TCP",
        ]
    )
    assert rec.ops == []


def test_recording_kernel_logs_only_calls_that_succeeded() -> None:
    rec = RecordingKernel(FakeKernel())
    with pytest.raises(KernelError):
        rec.add_real_server(KEY, RS, 1)  # no such virtual server
    assert rec.take_ops() == []


def test_faulty_kernel_fails_a_seeded_fraction_of_writes_only() -> None:
    def run(seed: int) -> tuple[int, list[str]]:
        faulty = FaultyKernel(FakeKernel(), 0.5, seed=seed)
        results = []
        for port in range(40):
            try:
                faulty.add_virtual_server(
                    VirtualServer(ServiceKey(Protocol.TCP, "10.0.0.1", port + 1), "rr"), False
                )
                results.append("ok")
            except KernelTransient as exc:
                assert exc.operation == "add_virtual_server"
                results.append("failed")
        assert len(faulty.list_virtual_servers()) == results.count("ok")  # reads pass
        return faulty.failures, results

    failures, results = run(0)
    assert failures == results.count("failed") and 0 < failures < 40
    assert run(0) == (failures, results)  # seeded: repeatable
    assert FaultyFromFake is FaultyKernel  # still importable where it always was


def test_faulty_kernel_never_fails_with_probability_zero() -> None:
    faulty = FaultyKernel(FakeKernel(), 0.0)
    program(faulty)
    assert faulty.failures == 0 and faulty.impl.take_ops()[-1] == "del-vs 10.96.0.10:80/TCP"


def test_table_reads_through_the_port_and_prints_like_the_fake() -> None:
    k = FakeKernel()
    k.add_virtual_server(VirtualServer(KEY, "rr"), False)
    k.add_real_server(KEY, RS, 1)
    k.set_connections(KEY, RS, 3, 1)
    other = ServiceKey(Protocol.UDP, "10.96.0.11", 53)
    k.add_virtual_server(VirtualServer(other, "rr"), False)
    assert (
        table.dump(k)
        == k.dump()
        == (
            "10.96.0.10:80/TCP rr\n"
            "  -> 10.244.1.1:8080 weight 1 active 3 inactive 1\n"
            "10.96.0.11:53/UDP rr\n"
        )
    )
    assert k.table_reads == 1 and k.dumps == 0  # one table read, no per-service dumps
    assert table.format_table([]) == ""


def test_table_falls_back_to_per_service_dumps_when_the_table_file_fails() -> None:
    class NoProcFile(FakeKernel):
        def read_real_servers(self, keys: object, only: object = None) -> dict:  # type: ignore[override]
            raise KernelTransient("no /proc/net/ip_vs", "read_real_servers")

    k = NoProcFile()
    k.add_virtual_server(VirtualServer(KEY, "rr"), False)
    k.add_real_server(KEY, RS, 1)
    assert [len(v.real_servers) for v in table.read_statuses(k)] == [1]
    assert k.dumps == 1


def test_address_index() -> None:
    index = AddressIndex()
    assert not index.loaded() and not index.in_use("10.96.0.10")
    index.record(KEY, True)  # before the first read: ignored, the read sees the kernel
    assert not index.in_use("10.96.0.10")
    index.refresh([KEY, ServiceKey(Protocol.UDP, "fd00::10", 53)])
    assert index.in_use("10.96.0.10") and index.in_use("fd00:0::10")
    index.record(KEY, False)
    assert not index.in_use("10.96.0.10")
    index.record(ServiceKey(Protocol.TCP, "fd00:0:0::10", 80), True)
    index.record(ServiceKey(Protocol.UDP, "fd00::10", 53), False)
    assert index.in_use("fd00::10")  # the TCP one, spelled another way, still uses it

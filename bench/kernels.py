"""Kernels for the benchmarks: the in-memory FakeKernel (host, smoke), ipvsctl's
NetlinkKernel in a throwaway network namespace (lab VM), and the lean RawIPVS client for the
baseline on the same namespace; plus a wrapper that timestamps the operation a change is
waiting for."""

from __future__ import annotations

import collections
import itertools
import socket
import struct
import subprocess
import time
import types
from collections.abc import Callable, Sequence
from typing import Any

from ipvsctl.kernel.fake import FakeKernel
from ipvsctl.kernel.netlink import wire
from ipvsctl.kernel.port import KernelError
from ipvsctl.model import RealServerKey, ServiceKey, VirtualServer

MODULES = ("ip_vs", "ip_vs_rr", "dummy", "veth", "nf_conntrack")
_names = itertools.count(1)


def load_modules() -> None:
    for m in MODULES:
        subprocess.run(["modprobe", m], capture_output=True, check=False)


class Netns:
    """A named network namespace for one benchmark size; deleted (with its IPVS table) by
    close()."""

    def __init__(self, prefix: str = "bench") -> None:
        self.name = f"{prefix}{next(_names)}"
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True, check=False)
        subprocess.run(["ip", "netns", "add", self.name], check=True)
        subprocess.run(["ip", "-n", self.name, "link", "set", "lo", "up"], check=True)

    def close(self) -> None:
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True, check=False)


def netlink_kernel(netns: str) -> Any:
    from ipvsctl.kernel.netlink import NetlinkKernel

    return NetlinkKernel(netns=netns)


def raw_kernel(netns: str) -> Any:
    from devkit.ipvsnl import RawIPVS

    return RawIPVS(netns=netns)


# The generic netlink family id the modelled kernel answers for (any number does).
FAMILY = 0x1C


def ack(seq: int) -> bytes:
    """A netlink ACK (an NLMSG_ERROR with error 0) for request `seq`."""
    return struct.pack("=IHHIIi", 36, 2, 0x100, seq, 0, 0) + bytes(16)


class AckSocket:
    """A socket whose peer acknowledges each request at once (the modelled kernel): a real
    send and a real recv per call, no kernel work."""

    def __init__(self) -> None:
        self.ours, self.peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.ours.setblocking(False)

    def fileno(self) -> int:
        return self.ours.fileno()

    def send(self, data: bytes) -> int:
        # each message that asks for an ACK gets one (a batch: only its last asks)
        for _kind, flags, seq, _msg in wire.split(data):
            if flags & wire.NLM_F_ACK:
                self.peer.send(ack(seq))
        return len(data)

    def recv(self, size: int) -> bytes:
        return self.ours.recv(size)


def wire_calls() -> Any:
    """ipvsctl's own IPVS request path (`IPVSCalls`: messages packed by `kernel/netlink/wire.py`,
    sent, ACK read and checked) on an AckSocket."""
    from ipvsctl.kernel.netlink.ipvs_calls import IPVSCalls

    ipvs = types.SimpleNamespace(asyncore=types.SimpleNamespace(socket=AckSocket()), prid=FAMILY)
    return IPVSCalls(types.SimpleNamespace(ipvs=lambda: ipvs))  # type: ignore[arg-type]


class BenchFakeKernel(FakeKernel):
    """FakeKernel plus the two reads the baselines make that ipvsctl does not: one virtual
    server by key (kube-proxy's GetVirtualServer) and the dummy interface's addresses."""

    def get_virtual_server(self, key: ServiceKey) -> VirtualServer | None:
        svc = self.services.get(key)
        return svc.vs if svc else None

    def list_addresses(self) -> list[str]:
        return list(self.bound)

    def bind_address(self, address: str) -> None:
        self.bound.setdefault(address, 1)


class PackedFakeKernel(BenchFakeKernel):
    """The in-memory kernel, each write also made as ipvsctl makes it over netlink: the
    message packed, sent and its ACK read (`wire_calls`). What a write costs the daemon's
    Python on a real node, less the kernel's own work."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = wire_calls()

    def add_virtual_server(self, vs: VirtualServer, bind_address: bool) -> None:
        super().add_virtual_server(vs, bind_address)
        self.calls.add_service(vs)

    def update_virtual_server(self, vs: VirtualServer) -> None:
        super().update_virtual_server(vs)
        self.calls.set_service(vs)

    def delete_virtual_server(self, key: ServiceKey, bind_address: bool) -> None:
        super().delete_virtual_server(key, bind_address)
        self.calls.delete_service(key)

    def add_real_server(self, key: ServiceKey, rs: RealServerKey, weight: int) -> None:
        super().add_real_server(key, rs, weight)
        self.calls.add_dest(key, rs, weight)

    def add_real_servers(
        self, key: ServiceKey, real_servers: Sequence[RealServerKey], weight: int
    ) -> list[KernelError | None]:
        out: list[KernelError | None] = []
        for rs in real_servers:
            try:
                FakeKernel.add_real_server(self, key, rs, weight)
                out.append(None)
            except KernelError as exc:
                out.append(exc)
        self.calls.add_dests(key, real_servers, weight)  # one batch, as the adapter sends it
        return out

    def set_real_server_weight(self, key: ServiceKey, rs: RealServerKey, weight: int) -> None:
        super().set_real_server_weight(key, rs, weight)
        self.calls.set_dest(key, rs, weight)

    def delete_real_server(self, key: ServiceKey, rs: RealServerKey) -> None:
        super().delete_real_server(key, rs)
        self.calls.delete_dest(key, rs)


def fake_kernel(packed: bool = False) -> BenchFakeKernel:
    """FakeKernel without its op log (tests read it; millions of benchmark calls would only
    grow it); `packed`: each write also packed and sent as over netlink (PackedFakeKernel)."""
    k = PackedFakeKernel() if packed else BenchFakeKernel()
    k.ops = collections.deque(maxlen=0)  # type: ignore[assignment]
    return k


class TimedKernel:
    """Passes every call through, counts calls, and notes when a weight change on one
    (virtual server, real server, weight) completes: the moment a change is done."""

    def __init__(self, impl: Any) -> None:
        self.impl = impl
        self.calls = 0
        self.watch: tuple[ServiceKey, RealServerKey, int] | None = None
        self.done_at: float | None = None

    def expect(self, key: ServiceKey, rs: RealServerKey, weight: int) -> None:
        self.watch, self.done_at = (key, rs, weight), None

    def _counted(self, name: str) -> Callable[..., Any]:
        fn = getattr(self.impl, name)

        def call(*args: Any, **kw: Any) -> Any:
            self.calls += 1
            return fn(*args, **kw)

        return call

    def __getattr__(self, name: str) -> Any:
        return self._counted(name)

    def set_real_server_weight(self, key: ServiceKey, rs: RealServerKey, weight: int) -> None:
        self.calls += 1
        self.impl.set_real_server_weight(key, rs, weight)
        if self.done_at is None and self.watch == (key, rs, weight):
            self.done_at = time.monotonic()

    def add_real_server(self, key: ServiceKey, rs: RealServerKey, weight: int) -> None:
        self.calls += 1
        self.impl.add_real_server(key, rs, weight)
        if self.done_at is None and self.watch == (key, rs, weight):
            self.done_at = time.monotonic()

    def add_real_servers(
        self, key: ServiceKey, real_servers: Sequence[RealServerKey], weight: int
    ) -> list[KernelError | None]:
        self.calls += 1
        out: list[KernelError | None] = self.impl.add_real_servers(key, real_servers, weight)
        w = self.watch
        done = zip(real_servers, out, strict=True)
        if (
            self.done_at is None
            and w is not None
            and (w[0], w[2]) == (key, weight)
            and any(rs == w[1] and e is None for rs, e in done)
        ):
            self.done_at = time.monotonic()
        return out

"""Kernels for the benchmarks: the in-memory FakeKernel (host, smoke), ipvsctl's
NetlinkKernel in a throwaway network namespace (lab VM), and the lean RawIPVS client for the
baseline on the same namespace; plus a wrapper that timestamps the operation a change is
waiting for."""

from __future__ import annotations

import collections
import itertools
import subprocess
import time
from collections.abc import Callable
from typing import Any

from ipvsctl.kernel.fake import FakeKernel
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


def fake_kernel() -> BenchFakeKernel:
    """FakeKernel without its op log (tests read it; millions of benchmark calls would only
    grow it)."""
    k = BenchFakeKernel()
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

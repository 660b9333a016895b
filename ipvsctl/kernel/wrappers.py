"""Kernels that wrap any IPVSKernel: one that records the mutating calls as op-log lines
and one that injects failures (Cilium's FaultyLBMaps). Both are typed against the port and
checked to satisfy it, as kube-proxy checks its fake (`var _ = Interface(&FakeIPVS{})`).

`op_line` is the one op-log format: FakeKernel.ops, RecordingKernel.ops and the tests that
read them all spell a call the same way
("set-rs 10.96.0.10:80/TCP -> 10.244.1.1:8080 weight 0").
"""

from __future__ import annotations

import random
from collections.abc import Collection, Mapping, Sequence
from typing import Generic, TypeVar

from ipvsctl.kernel.port import IPVSKernel, KernelError, KernelTransient
from ipvsctl.model import ConnScan, RealServerKey, RealServerStatus, ServiceKey, VirtualServer

K = TypeVar("K", bound=IPVSKernel)


# --- the op log -----------------------------------------------------------------------------
def add_vs_line(vs: VirtualServer) -> str:
    return f"add-vs {vs}"


def set_vs_line(vs: VirtualServer) -> str:
    return f"set-vs {vs}"


def del_vs_line(key: ServiceKey) -> str:
    return f"del-vs {key}"


def add_rs_line(key: ServiceKey, rs: RealServerKey, weight: int) -> str:
    return f"add-rs {key} -> {rs} weight {weight}"


def set_rs_line(key: ServiceKey, rs: RealServerKey, weight: int) -> str:
    return f"set-rs {key} -> {rs} weight {weight}"


def del_rs_line(key: ServiceKey, rs: RealServerKey) -> str:
    return f"del-rs {key} -> {rs}"


def flush_conntrack_line(key: ServiceKey, rs: RealServerKey) -> str:
    return f"flush-conntrack {key} -> {rs}"


class _Passthrough(Generic[K]):
    """The read half of IPVSKernel, passed through to `impl`."""

    def __init__(self, impl: K) -> None:
        self.impl = impl

    def list_virtual_servers(self) -> list[VirtualServer]:
        return self.impl.list_virtual_servers()

    def list_real_servers(self, key: ServiceKey) -> list[RealServerStatus]:
        return self.impl.list_real_servers(key)

    def read_real_servers(
        self,
        keys: Collection[ServiceKey],
        only: Mapping[ServiceKey, Collection[RealServerKey]] | None = None,
    ) -> dict[ServiceKey, list[RealServerStatus] | None]:
        return self.impl.read_real_servers(keys, only)

    def dump_real_servers(
        self,
        keys: Sequence[ServiceKey],
        only: Mapping[ServiceKey, Collection[RealServerKey]] | None = None,
    ) -> dict[ServiceKey, list[RealServerStatus] | KernelError | None]:
        return self.impl.dump_real_servers(keys, only)

    def read_connections(self, pairs: Collection[tuple[ServiceKey, RealServerKey]]) -> ConnScan:
        return self.impl.read_connections(pairs)


# --- recording ------------------------------------------------------------------------------
class RecordingKernel(_Passthrough[K]):
    """Logs each mutating call that succeeded, in op-log lines; reads pass through. Shows
    what an engine did to a kernel (the real one in the lab), op by op. `impl` is the
    wrapped kernel, for anything beyond the port."""

    def __init__(self, impl: K) -> None:
        super().__init__(impl)
        self.ops: list[str] = []

    def take_ops(self) -> list[str]:
        ops, self.ops = self.ops, []
        return ops

    def add_virtual_server(self, vs: VirtualServer, bind_address: bool) -> None:
        self.impl.add_virtual_server(vs, bind_address)
        self.ops.append(add_vs_line(vs))

    def update_virtual_server(self, vs: VirtualServer) -> None:
        self.impl.update_virtual_server(vs)
        self.ops.append(set_vs_line(vs))

    def delete_virtual_server(self, key: ServiceKey, bind_address: bool) -> None:
        self.impl.delete_virtual_server(key, bind_address)
        self.ops.append(del_vs_line(key))

    def add_real_server(self, key: ServiceKey, rs: RealServerKey, weight: int) -> None:
        self.impl.add_real_server(key, rs, weight)
        self.ops.append(add_rs_line(key, rs, weight))

    def set_real_server_weight(self, key: ServiceKey, rs: RealServerKey, weight: int) -> None:
        self.impl.set_real_server_weight(key, rs, weight)
        self.ops.append(set_rs_line(key, rs, weight))

    def delete_real_server(self, key: ServiceKey, rs: RealServerKey) -> None:
        self.impl.delete_real_server(key, rs)
        self.ops.append(del_rs_line(key, rs))

    def flush_conntrack(self, key: ServiceKey, rs: RealServerKey) -> None:
        self.impl.flush_conntrack(key, rs)
        self.ops.append(flush_conntrack_line(key, rs))


# --- fault injection ------------------------------------------------------------------------
class FaultyKernel(_Passthrough[K]):
    """Fails a fraction (`probability`) of mutating calls with KernelTransient before they
    reach `impl`; reads and conntrack flushes always pass. Seeded: a run is repeatable.
    `failures` counts the injected failures."""

    def __init__(self, impl: K, probability: float, seed: int = 0) -> None:
        super().__init__(impl)
        self.probability = probability
        self.random = random.Random(seed)
        self.failures = 0

    def _maybe_fail(self, operation: str) -> None:
        if self.random.random() < self.probability:
            self.failures += 1
            raise KernelTransient("injected failure", operation)

    def add_virtual_server(self, vs: VirtualServer, bind_address: bool) -> None:
        self._maybe_fail("add_virtual_server")
        self.impl.add_virtual_server(vs, bind_address)

    def update_virtual_server(self, vs: VirtualServer) -> None:
        self._maybe_fail("update_virtual_server")
        self.impl.update_virtual_server(vs)

    def delete_virtual_server(self, key: ServiceKey, bind_address: bool) -> None:
        self._maybe_fail("delete_virtual_server")
        self.impl.delete_virtual_server(key, bind_address)

    def add_real_server(self, key: ServiceKey, rs: RealServerKey, weight: int) -> None:
        self._maybe_fail("add_real_server")
        self.impl.add_real_server(key, rs, weight)

    def set_real_server_weight(self, key: ServiceKey, rs: RealServerKey, weight: int) -> None:
        self._maybe_fail("set_real_server_weight")
        self.impl.set_real_server_weight(key, rs, weight)

    def delete_real_server(self, key: ServiceKey, rs: RealServerKey) -> None:
        self._maybe_fail("delete_real_server")
        self.impl.delete_real_server(key, rs)

    def flush_conntrack(self, key: ServiceKey, rs: RealServerKey) -> None:
        self.impl.flush_conntrack(key, rs)


_recording: type[IPVSKernel] = RecordingKernel  # both satisfy the port
_faulty: type[IPVSKernel] = FaultyKernel

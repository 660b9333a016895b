"""An in-memory IPVS with the kernel's error behaviour, an op log and a sorted dump.

Used by unit tests and by `ipvsctl plan`-style dry runs; the lab tests run the same
scenarios against the real kernel.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from ipvsctl.kernel.port import (
    IPVSKernel,
    KernelExists,
    KernelNotFound,
    KernelTransient,
)
from ipvsctl.model import RealServerKey, RealServerStatus, ServiceKey, VirtualServer

KNOWN_SCHEDULERS = frozenset(
    {"rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq", "fo", "ovf", "mh",
     "twos"}
)


@dataclass
class _Dest:
    weight: int
    active: int = 0
    inactive: int = 0


@dataclass
class _Service:
    vs: VirtualServer
    dests: dict[RealServerKey, _Dest] = field(default_factory=dict)


class FakeKernel:
    """A stateful fake: state by ServiceKey, errors like the kernel's, every call logged."""

    def __init__(self) -> None:
        self.services: dict[ServiceKey, _Service] = {}
        self.bound: dict[str, int] = {}  # address on the dummy interface -> users
        self.ops: list[str] = []  # mutating calls, in order
        self.dumps = 0  # list_real_servers calls
        self.conntrack_flushes: list[tuple[ServiceKey, RealServerKey]] = []

    # --- test helpers -------------------------------------------------------------
    def set_connections(
        self, key: ServiceKey, rs: RealServerKey, active: int, inactive: int = 0
    ) -> None:
        dest = self.services[key].dests[rs]
        dest.active, dest.inactive = active, inactive

    def weight(self, key: ServiceKey, rs: RealServerKey) -> int | None:
        svc = self.services.get(key)
        dest = svc.dests.get(rs) if svc else None
        return dest.weight if dest else None

    def dump(self) -> str:
        """One sorted line per virtual and real server, like `ipvsadm -Ln` made stable."""
        lines = []
        for key in sorted(self.services):
            svc = self.services[key]
            lines.append(str(svc.vs))
            for rs in sorted(svc.dests):
                d = svc.dests[rs]
                lines.append(f"  -> {rs} weight {d.weight} active {d.active} inactive {d.inactive}")
        return "\n".join(lines) + ("\n" if lines else "")

    def take_ops(self) -> list[str]:
        ops, self.ops = self.ops, []
        return ops

    # --- IPVSKernel ---------------------------------------------------------------
    def list_virtual_servers(self) -> list[VirtualServer]:
        return [self.services[k].vs for k in sorted(self.services)]

    def list_real_servers(self, key: ServiceKey) -> list[RealServerStatus]:
        self.dumps += 1
        svc = self._service(key, "list_real_servers")
        return [
            RealServerStatus(rs, d.weight, d.active, d.inactive)
            for rs, d in sorted(svc.dests.items())
        ]

    def add_virtual_server(self, vs: VirtualServer, bind_address: bool) -> None:
        if vs.scheduler not in KNOWN_SCHEDULERS:
            raise KernelNotFound(f"unknown scheduler {vs.scheduler}", "add_virtual_server")
        if vs.key in self.services:
            raise KernelExists(f"{vs.key} exists", "add_virtual_server")
        self.services[vs.key] = _Service(vs)
        if bind_address:
            self.bound[vs.key.address] = self.bound.get(vs.key.address, 0) + 1
        self.ops.append(f"add-vs {vs}")

    def update_virtual_server(self, vs: VirtualServer) -> None:
        if vs.scheduler not in KNOWN_SCHEDULERS:
            raise KernelNotFound(f"unknown scheduler {vs.scheduler}", "update_virtual_server")
        self._service(vs.key, "update_virtual_server").vs = vs
        self.ops.append(f"set-vs {vs}")

    def delete_virtual_server(self, key: ServiceKey, bind_address: bool) -> None:
        self._service(key, "delete_virtual_server")
        del self.services[key]
        if bind_address and key.address in self.bound:
            self.bound[key.address] -= 1
            if self.bound[key.address] <= 0:
                del self.bound[key.address]
        self.ops.append(f"del-vs {key}")

    def add_real_server(self, key: ServiceKey, rs: RealServerKey, weight: int) -> None:
        svc = self._service(key, "add_real_server")
        if rs in svc.dests:
            raise KernelExists(f"{key} -> {rs} exists", "add_real_server")
        svc.dests[rs] = _Dest(weight)
        self.ops.append(f"add-rs {key} -> {rs} weight {weight}")

    def set_real_server_weight(self, key: ServiceKey, rs: RealServerKey, weight: int) -> None:
        self._dest(key, rs, "set_real_server_weight").weight = weight
        self.ops.append(f"set-rs {key} -> {rs} weight {weight}")

    def delete_real_server(self, key: ServiceKey, rs: RealServerKey) -> None:
        self._dest(key, rs, "delete_real_server")
        del self.services[key].dests[rs]
        self.ops.append(f"del-rs {key} -> {rs}")

    def flush_conntrack(self, key: ServiceKey, rs: RealServerKey) -> None:
        self.conntrack_flushes.append((key, rs))
        self.ops.append(f"flush-conntrack {key} -> {rs}")

    # --- internals ----------------------------------------------------------------
    def _service(self, key: ServiceKey, op: str) -> _Service:
        try:
            return self.services[key]
        except KeyError:
            raise KernelNotFound(f"no virtual server {key}", op) from None

    def _dest(self, key: ServiceKey, rs: RealServerKey, op: str) -> _Dest:
        try:
            return self._service(key, op).dests[rs]
        except KeyError:
            raise KernelNotFound(f"no real server {key} -> {rs}", op) from None


class FaultyKernel:
    """Wraps any kernel and fails a fraction of mutating calls before they reach it."""

    _MUTATING = frozenset(
        {"add_virtual_server", "update_virtual_server", "delete_virtual_server",
         "add_real_server", "set_real_server_weight", "delete_real_server"}
    )

    def __init__(self, impl: IPVSKernel, probability: float, seed: int = 0) -> None:
        self.impl = impl
        self.probability = probability
        self.random = random.Random(seed)
        self.failures = 0

    def __getattr__(self, name: str):
        attr = getattr(self.impl, name)
        if name not in self._MUTATING:
            return attr

        def call(*args, **kwargs):
            if self.random.random() < self.probability:
                self.failures += 1
                raise KernelTransient("injected failure", name)
            return attr(*args, **kwargs)

        return call


_: type[IPVSKernel] = FakeKernel  # FakeKernel satisfies the interface

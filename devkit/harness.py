"""An engine on the in-memory kernel with a hand-moved clock, fed raw objects."""

from __future__ import annotations

from typing import Any

from ipvsctl.kernel.fake import FakeKernel
from ipvsctl.model import DrainEntry, NodeContext, Protocol, RealServerKey, ServiceKey
from ipvsctl.obs.metrics import Metrics
from ipvsctl.reconcile.clock import ManualClock
from ipvsctl.reconcile.engine import Engine, EngineConfig
from ipvsctl.source.events import Delete, ObjectKind, Replace, Upsert

NODE = NodeContext("node-a", ("192.0.2.10",), "rr")


def vs(address: str = "10.96.0.10", port: int = 80, proto: str = "TCP") -> ServiceKey:
    return ServiceKey(Protocol(proto), address, port)


def rs(address: str, port: int = 8080) -> RealServerKey:
    return RealServerKey(address, port)


class Harness:
    def __init__(self, kernel: Any = None, drain_timeout: float = 30.0,
                 restored: list[DrainEntry] | None = None, node: NodeContext = NODE) -> None:
        self.kernel = kernel if kernel is not None else FakeKernel()
        self.clock = ManualClock()
        self.metrics = Metrics()
        self.engine = Engine(
            self.kernel, EngineConfig(node, drain_timeout), clock=self.clock,
            metrics=self.metrics, restored_queue=restored or [],
        )

    @property
    def fake(self) -> FakeKernel:
        k = self.kernel
        while not isinstance(k, FakeKernel):
            k = k.impl
        return k

    def start(self, services: list[dict], slices: list[dict]) -> None:
        now = self.clock.monotonic()
        self.engine.handle(Replace(ObjectKind.SERVICE, list(services), now))
        self.engine.handle(Replace(ObjectKind.ENDPOINT_SLICE, list(slices), now))
        self.engine.sync()

    def upsert(self, obj: dict, sync: bool = True) -> None:
        self.engine.handle(Upsert(ObjectKind(obj["kind"]), obj, self.clock.monotonic()))
        if sync:
            self.engine.sync()

    def delete(self, obj: dict, sync: bool = True) -> None:
        meta = obj["metadata"]
        self.engine.handle(Delete(ObjectKind(obj["kind"]), meta.get("namespace", "default"),
                                  meta["name"], self.clock.monotonic()))
        if sync:
            self.engine.sync()

    def check(self, advance: float = 0.0) -> None:
        self.clock.advance(advance)
        self.engine.check_drains()

    def ops(self) -> list[str]:
        return self.fake.take_ops()

    def deletions(self, reason: str) -> float:
        return self.metrics.value("ipvsctl_real_server_deletions_total", {"reason": reason})

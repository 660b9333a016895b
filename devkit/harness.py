"""An engine on the in-memory kernel with a hand-moved clock, fed raw objects."""

from __future__ import annotations

from typing import Any

from ipvsctl.kernel.fake import FakeKernel
from ipvsctl.model import DrainEntry, NodeContext, Protocol, RealServerKey, ServiceKey
from ipvsctl.obs.metrics import Metrics
from ipvsctl.reconcile.clock import ManualClock
from ipvsctl.reconcile.drain_check import DrainCheckResult
from ipvsctl.reconcile.engine import Engine, EngineConfig
from ipvsctl.reconcile.feed import ChangeFeed
from ipvsctl.reconcile.paced import run_once
from ipvsctl.reconcile.view import EngineView
from ipvsctl.source.events import Delete, ObjectKind, Replace, Upsert

NODE = NodeContext("node-a", ("192.0.2.10",), "rr")


def vs(address: str = "10.96.0.10", port: int = 80, proto: str = "TCP") -> ServiceKey:
    return ServiceKey(Protocol(proto), address, port)


def rs(address: str, port: int = 8080) -> RealServerKey:
    return RealServerKey(address, port)


class Harness:
    def __init__(
        self,
        kernel: Any = None,
        drain_timeout: float = 30.0,
        restored: list[DrainEntry] | None = None,
        node: NodeContext = NODE,
        may_take_over: Any = None,
        service_drain_timeout: float = 0.0,
    ) -> None:
        self.kernel = kernel if kernel is not None else FakeKernel()
        self.clock = ManualClock()
        self.metrics = Metrics()
        self.feed = ChangeFeed()  # what the engine tells: subscribe parts under test to it
        self.engine = Engine(
            self.kernel,
            EngineConfig(node, drain_timeout, service_drain_timeout=service_drain_timeout),
            clock=self.clock,
            metrics=self.metrics,
            restored_queue=restored or [],
            feed=self.feed,
            **({"may_take_over": may_take_over} if may_take_over is not None else {}),
        )
        self.view = EngineView(self.engine)

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
        self.engine.handle(
            Delete(
                ObjectKind(obj["kind"]),
                meta.get("namespace", "default"),
                meta["name"],
                self.clock.monotonic(),
            )
        )
        if sync:
            self.engine.sync()

    def check(self, advance: float = 0.0) -> DrainCheckResult | None:
        """One whole drain check in this thread (the daemon's runs on its own); None before
        the first sync or with nothing draining."""
        self.clock.advance(advance)
        return run_once(self.engine.drain_check)

    def audit(self) -> int:
        """One audit step in this thread: the differences it found (and put right)."""
        findings = run_once(self.engine.audit)
        return findings.found if findings is not None else 0

    def ops(self) -> list[str]:
        return self.fake.take_ops()

    def deletions(self, reason: str) -> float:
        return self.metrics.value("ipvsctl_real_server_deletions_total", {"reason": reason})

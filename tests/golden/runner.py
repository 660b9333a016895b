"""Golden cases: Kubernetes objects in, the Engine's kernel operations and the kernel table
out, compared with files checked in next to the objects.

A case is a folder under tests/golden/engine/ (tests/golden/README.md: how to write one):
`case.yaml` (the node, --drain-timeout), an optional `kernel-before.txt` (what an earlier
run left in the kernel, in kernel.txt's format), and numbered step folders (`1-start`,
`2-terminating`, ...; a case without them is one step, its own folder). A step holds
`objects.yaml` (objects that arrive: the first step's are the initial list) and `step.yaml`
(what else happens: deletes, the clock moving, connection counts, node addresses, a drain
check), and what must come out of it:

- desired.txt  `ipvsctl plan -o wide` of every object known so far (the pure planner);
- ops.txt      the kernel operations the step made, in the order they were applied (the
               order is part of the behaviour: a new endpoint's real server is added
               before an old one goes to weight 0);
- kernel.txt   the IPVS table after it (virtual servers with scheduler, persistence and
               flags; real servers with weights; the dummy interface's addresses);
- status.txt   `ipvsctl status -o wide` joined from the engine and that table, and the
               real servers deleted so far by reason.

The Engine is driven only through its public surface (handle, sync, set_node_ips; the drain
check and the audit as background reads, one pass each; the status through its read-only
view), so the cases hold whatever its inside becomes. The same
case runs on the in-memory kernel, on it behind FaultyKernel (10% of the mutating calls
fail; re-synced until clean, as the daemon's loop retries), and in the lab on the real
kernel (tests/lab/test_golden_lab.py).

IPVSCTL_GOLDEN_UPDATE=1 rewrites the expected files instead of comparing them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import zlib
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ipvsctl.cli.render import plan_text
from ipvsctl.cli.status import join_status, render_status
from ipvsctl.daemon.status_json import engine_status
from ipvsctl.kernel.port import IPVSKernel, KernelError, add_each
from ipvsctl.kernel.table import read_statuses
from ipvsctl.kernel.wrappers import RecordingKernel
from ipvsctl.manifests import load_file
from ipvsctl.model import (
    NodeContext,
    Protocol,
    RealServerKey,
    RealServerStatus,
    ServiceKey,
    VirtualServer,
    VirtualServerStatus,
)
from ipvsctl.model.ipvs import SCHED_FLAG_1, SCHED_FLAG_2, SCHED_FLAG_3
from ipvsctl.obs.metrics import Metrics
from ipvsctl.persist.drain_state import FORMAT_VERSION, parse_state
from ipvsctl.plan.ops import DeletionReason
from ipvsctl.reconcile.clock import ManualClock
from ipvsctl.reconcile.cluster import plan_objects
from ipvsctl.reconcile.engine import Engine, EngineConfig
from ipvsctl.reconcile.paced import run_once
from ipvsctl.reconcile.view import EngineView
from ipvsctl.source.events import Delete, ObjectKind, RawObject, Replace, Upsert

ROOT = Path(__file__).parent
ENGINE_CASES = ROOT / "engine"
PLAN_CASES = ROOT / "plan"
UPDATE_ENV = "IPVSCTL_GOLDEN_UPDATE"
OUTPUTS = ("desired.txt", "ops.txt", "kernel.txt", "status.txt")
# Re-syncs (and drain checks) a step may take under faults before it counts as stuck.
MAX_ROUNDS = 60


def updating() -> bool:
    return os.environ.get(UPDATE_ENV) == "1"


def case_names(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("_"))


def seed_of(name: str, n: int) -> int:
    """A fault seed per case and run, stable across Python processes."""
    return zlib.crc32(f"{name}/{n}".encode())


# --- the kernel under test ------------------------------------------------------------------
class GoldenKernel(RecordingKernel[Any]):
    """The kernel under test (FakeKernel, FaultyKernel, NetlinkKernel) recorded as
    RecordingKernel records it, each add of a batch on its own line, with the case's
    connection counts for the real servers it names (the fake keeps none, the lab's kernel
    sees no traffic): the drain check reads them like the kernel's."""

    def __init__(self, impl: Any) -> None:
        super().__init__(impl)
        self.conns: dict[tuple[ServiceKey, RealServerKey], tuple[int, int]] = {}

    def __getattr__(self, name: str) -> Any:  # beyond the port: the dummy interface...
        return getattr(self.impl, name)

    def add_real_servers(
        self, key: ServiceKey, real_servers: Sequence[RealServerKey], weight: int
    ) -> list[KernelError | None]:
        # an add each, so that each is recorded (not passed through to `impl` unseen)
        return add_each(self, key, real_servers, weight)

    def _counted(self, key: ServiceKey, s: RealServerStatus) -> RealServerStatus:
        counts = self.conns.get((key, s.key))
        if counts is None:
            return s
        return dataclasses.replace(s, active_conns=counts[0], inactive_conns=counts[1])

    def list_real_servers(self, key: ServiceKey) -> list[RealServerStatus]:
        return [self._counted(key, s) for s in self.impl.list_real_servers(key)]

    def read_real_servers(
        self,
        keys: Collection[ServiceKey],
        only: Mapping[ServiceKey, Collection[RealServerKey]] | None = None,
    ) -> dict[ServiceKey, list[RealServerStatus] | None]:
        return {
            k: None if v is None else [self._counted(k, s) for s in v]
            for k, v in self.impl.read_real_servers(keys, only).items()
        }

    def dump_real_servers(
        self,
        keys: Sequence[ServiceKey],
        only: Mapping[ServiceKey, Collection[RealServerKey]] | None = None,
    ) -> dict[ServiceKey, list[RealServerStatus] | KernelError | None]:
        return {
            k: v if v is None or isinstance(v, KernelError) else [self._counted(k, s) for s in v]
            for k, v in self.impl.dump_real_servers(keys, only).items()
        }


_: type[IPVSKernel] = GoldenKernel


# --- the table as text ----------------------------------------------------------------------
_FLAGS = {"flag-1": SCHED_FLAG_1, "flag-2": SCHED_FLAG_2, "flag-3": SCHED_FLAG_3}


def table(kernel: Any) -> list[VirtualServerStatus]:
    """The kernel's table through the port, sorted (what `ipvsctl status` reads)."""
    return read_statuses(kernel)


def kernel_text(rows: Iterable[VirtualServerStatus], addresses: Iterable[str]) -> str:
    """kernel.txt: FakeKernel.dump()'s lines without connection counts, and the addresses on
    the dummy interface."""
    lines = []
    for row in rows:
        lines.append(str(row.vs))
        lines += [f"  -> {s.key} weight {s.weight}" for s in row.real_servers]
    lines.append("addresses:" + "".join(f" {a}" for a in sorted(addresses)))
    return "\n".join(lines) + "\n"


def _key(text: str) -> ServiceKey:
    hostport, proto = text.rsplit("/", 1)
    host, port = hostport.rsplit(":", 1)
    return ServiceKey(Protocol(proto), host.strip("[]"), int(port))


def _rs(text: str) -> RealServerKey:
    host, port = text.rsplit(":", 1)
    return RealServerKey(host.strip("[]"), int(port))


def parse_kernel_text(
    text: str,
) -> tuple[list[tuple[VirtualServer, dict[RealServerKey, int]]], set[str]]:
    """kernel.txt (or kernel-before.txt) back into virtual servers, weights and addresses."""
    out: list[tuple[VirtualServer, dict[RealServerKey, int]]] = []
    addresses: set[str] = set()
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        if line.startswith("addresses:"):
            addresses = set(line.split()[1:])
        elif line.lstrip().startswith("->"):
            _, rs, _, weight = line.split()
            out[-1][1][_rs(rs)] = int(weight)
        else:
            words = line.split()
            persistent, flags = 0, 0
            rest = words[2:]
            if rest[:1] == ["persistent"]:
                persistent, rest = int(rest[1]), rest[2:]
            for name in rest[0].split(",") if rest else ():
                flags |= _FLAGS[name]
            out.append((VirtualServer(_key(words[0]), words[1], persistent, flags), {}))
    return out, addresses


def load_kernel(kernel: Any, text: str) -> None:
    """Programs kernel-before.txt into a kernel, as an earlier run would have."""
    servers, addresses = parse_kernel_text(text)
    for vs, weights in servers:
        kernel.add_virtual_server(vs, vs.key.address in addresses)
        for rs, weight in weights.items():
            kernel.add_real_server(vs.key, rs, weight)
    stray = addresses - {vs.key.address for vs, _ in servers}
    assert not stray, f"kernel-before: addresses without a virtual server: {sorted(stray)}"


# --- cases ----------------------------------------------------------------------------------
@dataclass
class Step:
    folder: Path
    objects: dict[tuple[ObjectKind, str, str], RawObject]
    actions: dict[str, Any]

    @property
    def name(self) -> str:
        return self.folder.name


@dataclass
class Case:
    folder: Path
    node: NodeContext
    drain_timeout: float
    steps: list[Step]
    kernel_before: str | None
    xfail: str | None = None
    lab: bool = True  # runs in the lab too
    spec: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.folder.name


_ACTIONS = frozenset(
    {"delete", "advance", "connections", "node_ips", "drain_check", "description", "restart"}
)


def load_case(folder: Path) -> Case:
    spec = yaml.safe_load((folder / "case.yaml").read_text()) or {}
    n = spec.get("node", {})
    node = NodeContext(
        n.get("name", "node-a"),
        tuple(n.get("ips", ["192.0.2.10"])),
        n.get("scheduler", "rr"),
        service_proxy_name=n.get("service_proxy_name"),
    )
    numbered = sorted(
        (p for p in folder.iterdir() if p.is_dir() and p.name[:1].isdigit()),
        key=lambda p: int(p.name.split("-", 1)[0]),
    )
    steps = []
    for f in numbered or [folder]:
        objects = load_file(f / "objects.yaml").objects if (f / "objects.yaml").exists() else {}
        actions = {}
        if (f / "step.yaml").exists():
            actions = yaml.safe_load((f / "step.yaml").read_text()) or {}
            unknown = set(actions) - _ACTIONS
            assert not unknown, f"{f}/step.yaml: unknown actions {sorted(unknown)}"
        steps.append(Step(f, dict(objects), actions))
    before = folder / "kernel-before.txt"
    return Case(
        folder,
        node,
        float(spec.get("drain_timeout", 30)),
        steps,
        before.read_text() if before.exists() else None,
        spec.get("xfail"),
        spec.get("lab", True),
        spec,
    )


# --- running one ----------------------------------------------------------------------------
@dataclass
class StepResult:
    outputs: dict[str, str]  # file name -> text


class Run:
    """One case through one kernel. `kernel` is what the engine talks to, unwrapped;
    `addresses` reads the dummy interface's addresses; `faulty`: the kernel fails calls;
    `base`: the kernel under the faults, where kernel-before.txt is loaded."""

    def __init__(
        self,
        case: Case,
        kernel: Any,
        addresses: Callable[[], Iterable[str]],
        faulty: bool = False,
        base: Any = None,
    ) -> None:
        self.case = case
        self.kernel = GoldenKernel(kernel)
        self.addresses = addresses
        self.faulty = faulty
        self.clock = ManualClock()
        self.node = case.node  # with the node IPs steps set
        self.known: dict[tuple[ObjectKind, str, str], RawObject] = {}
        if case.kernel_before is not None:
            load_kernel(base if base is not None else kernel, case.kernel_before)
        self.metrics = Metrics()
        self.config = EngineConfig(
            case.node,
            case.drain_timeout,
            service_drain_timeout=float(case.spec.get("service_drain_timeout", 0)),
        )
        self.engine = Engine(self.kernel, self.config, clock=self.clock, metrics=self.metrics)

    def restart(self) -> None:
        """The daemon restarts: a new engine over the same kernel, its drain queue read
        back from the state file's bytes (persist/drain_state.py) as the daemon does."""
        data = json.dumps(
            {"version": FORMAT_VERSION, "entries": [e.to_json() for e in self.engine.drains.queue]}
        )
        self.config = dataclasses.replace(self.config, node=self.node)
        self.engine = Engine(
            self.kernel,
            self.config,
            clock=self.clock,
            metrics=self.metrics,
            restored_queue=parse_state(data.encode()),
        )

    def steps(self) -> Iterable[tuple[Step, StepResult]]:
        for i, step in enumerate(self.case.steps):
            yield step, self.step(step, first=i == 0)

    def step(self, step: Step, first: bool) -> StepResult:
        a = step.actions
        self.clock.advance(float(a.get("advance", 0)))
        for c in a.get("connections", ()):
            self.kernel.conns[(_key(c["vs"]), _rs(c["rs"]))] = (
                int(c.get("active", 0)),
                int(c.get("inactive", 0)),
            )
        if "node_ips" in a:
            self.node = dataclasses.replace(self.node, node_ips=tuple(a["node_ips"]))
            self.engine.set_node_ips(self.node.node_ips)
        now = self.clock.monotonic()
        self.known.update(step.objects)
        if a.get("restart"):
            self.restart()
        if first or a.get("restart"):
            listed = self.known if a.get("restart") else step.objects
            for kind in (ObjectKind.NODE, ObjectKind.SERVICE, ObjectKind.ENDPOINT_SLICE):
                objs = [o for (k, _, _), o in listed.items() if k is kind]
                if objs or kind in (ObjectKind.SERVICE, ObjectKind.ENDPOINT_SLICE):
                    self.engine.handle(Replace(kind, objs, now))
        else:
            for (kind, _, _), obj in step.objects.items():
                self.engine.handle(Upsert(kind, obj, now))
        for d in a.get("delete", ()):
            kind, ns = ObjectKind(d["kind"]), d.get("namespace", "default")
            self.known.pop((kind, ns, d["name"]), None)
            self.engine.handle(Delete(kind, ns, d["name"], now))
        self.sync()
        if a.get("drain_check"):
            self.check_drains()
        return StepResult(self.outputs())

    def sync(self) -> None:
        """Re-sync until a sync leaves nothing to retry and an audit round finds the
        kernel as the engine believes it, as the daemon's loop does (a sync that met an
        unexpected kernel entry asks for one more; under faults the audit is how a failed
        orphan deletion is found). Without faults the audit must never find anything and
        two syncs must be enough."""
        rounds = MAX_ROUNDS if self.faulty else 2
        for _ in range(rounds):
            failed = self.engine.sync().pending  # failed, or left for another pass
            drift = self.audit_round()
            assert self.faulty or drift == 0, f"the audit found {drift} differences"
            if not failed and drift == 0:
                return
        raise AssertionError(f"still not clean after {rounds} syncs")

    def audit_round(self) -> int:
        """Audit steps enough for a whole round (audit_batch virtual servers a step)."""
        steps = len(self.kernel.list_virtual_servers()) // self.config.audit_batch + 2
        return sum(f.found for _ in range(steps) if (f := run_once(self.engine.audit)) is not None)

    def check_drains(self) -> None:
        rounds = MAX_ROUNDS if self.faulty else 1
        for _ in range(rounds):
            result = run_once(self.engine.drain_check)
            if result is None or not result.failed:
                self.sync()
                return
        raise AssertionError(f"drain check not clean after {rounds} tries")

    def outputs(self) -> dict[str, str]:
        plan, problems = plan_objects(self._by_kind(), self.node)
        # The engine cases' tables keep their columns (the plan cases hold the details)
        desired = plan_text(plan, wide=True, details=False) + "".join(
            f"{p.kind.value} {p.name} {'skipped' if p.fatal else 'warning'}: {p.reason}\n"
            for p in problems
        )
        rows = table(self.kernel)
        doc = join_status(rows, None, engine_status(EngineView(self.engine)), None, "golden")
        return {
            "desired.txt": desired,
            "ops.txt": "".join(f"{op}\n" for op in self.kernel.take_ops()),
            "kernel.txt": kernel_text(rows, self.addresses()),
            "status.txt": render_status(doc, wide=True) + self._deletions(),
        }

    def _deletions(self) -> str:
        """Real servers deleted so far, by reason (drained, deadline, udp, ...)."""
        counts = [
            (r, self.metrics.value("ipvsctl_real_server_deletions_total", {"reason": r.value}))
            for r in DeletionReason
        ]
        return "deletions: " + (", ".join(f"{r} {n:g}" for r, n in counts if n) or "none") + "\n"

    def _by_kind(self) -> dict[ObjectKind, list[RawObject]]:
        out: dict[ObjectKind, list[RawObject]] = {k: [] for k in ObjectKind}
        for (kind, _, _), obj in self.known.items():
            out[kind].append(obj)
        return out


# --- comparing ------------------------------------------------------------------------------
def compare(folder: Path, got: dict[str, str], names: Iterable[str], write: bool) -> list[str]:
    """Differences between `got` and the files in `folder` (or, when `write`, rewrite them
    and report none)."""
    problems = []
    for name in names:
        path = folder / name
        if write:
            path.write_text(got[name])
            continue
        if not path.exists():
            problems.append(f"{path}: missing (run with {UPDATE_ENV}=1 to write it)")
            continue
        want = path.read_text()
        if want != got[name]:
            problems.append(f"{path} differs:\n{_diff(want, got[name], str(path))}")
    return problems


def _diff(want: str, got: str, name: str) -> str:
    import difflib

    return "".join(
        difflib.unified_diff(
            want.splitlines(True), got.splitlines(True), f"{name} (expected)", f"{name} (got)"
        )
    )

"""The golden cases of tests/golden/engine/ on the real kernel: the same objects and steps
drive an Engine on a NetlinkKernel in a fresh node namespace, and what it did (ops.txt), what
the kernel holds after each step (kernel.txt: schedulers, flags, persistence, weights, the
dummy interface's addresses, read back through the kernel and `ip addr`) and the status
joined from both (status.txt) must be the files the in-memory runs were checked against.
Connection counts are the case's (no traffic here); the clock is the case's too."""

from __future__ import annotations

import pytest

from devkit.labkit import Node
from tests.golden.runner import ENGINE_CASES, Run, case_names, compare, load_case

pytestmark = pytest.mark.lab

CASES = [load_case(ENGINE_CASES / name) for name in case_names(ENGINE_CASES)]


def addresses(node: Node) -> set[str]:
    """The dummy interface's addresses as `ip addr` shows them (link-local ones aside)."""
    return {a for a in node.interface_addresses(node.kernel.interface) if not a.startswith("fe80:")}


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(
            c, id=c.name, marks=[pytest.mark.xfail(reason=c.xfail, strict=True)] if c.xfail else []
        )
        for c in CASES
        if c.lab
    ],
)
def test_golden_case_on_the_real_kernel(case, node: Node) -> None:
    run = Run(case, node.kernel, lambda: addresses(node))
    problems: list[str] = []
    for step, result in run.steps():
        problems += [
            f"real kernel: {p}"
            for p in compare(
                step.folder, result.outputs, ("ops.txt", "kernel.txt", "status.txt"), write=False
            )
        ]
    assert not problems, "\n".join(problems)

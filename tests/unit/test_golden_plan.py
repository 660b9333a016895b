"""Golden `ipvsctl plan --json` cases, one per rule of CONTRACT.md "What becomes a virtual
server" and of the Service semantics: tests/golden/plan/<case>/ holds the manifests
(objects.yaml), the command's flags (case.yaml `args`) and what it must print: plan.json
(stdout, keys sorted) and warnings.txt (stderr). The real command runs, in-process.
IPVSCTL_GOLDEN_UPDATE=1 rewrites the expected files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from ipvsctl.cli.app import app
from tests.golden.runner import PLAN_CASES, case_names, compare, updating

CASES = case_names(PLAN_CASES)


def run_plan(folder: Path) -> dict[str, str]:
    spec = yaml.safe_load((folder / "case.yaml").read_text()) or {}
    args = ["plan", "-f", str(folder / "objects.yaml"), "--json", *map(str, spec["args"])]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, (result.exit_code, result.stdout, result.stderr)
    return {
        "plan.json": json.dumps(json.loads(result.stdout), indent=1, sort_keys=True) + "\n",
        "warnings.txt": result.stderr,
    }


@pytest.mark.parametrize("case", CASES)
def test_golden_plan(case: str) -> None:
    problems = compare(
        PLAN_CASES / case, run_plan(PLAN_CASES / case), ("plan.json", "warnings.txt"), updating()
    )
    assert not problems, "\n".join(problems)


def test_there_are_plan_cases() -> None:
    assert len(CASES) >= 15

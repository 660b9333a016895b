"""The import contracts in .importlinter (run by `make lint`) hold, and catch a violation."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).parent / "lint-imports"

pytestmark = pytest.mark.skipif(not LINT.exists(), reason="import-linter not installed")


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT), "--config", str(REPO / ".importlinter")],
        cwd=root,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_tree_keeps_every_contract() -> None:
    result = _lint(REPO)
    assert result.returncode == 0, result.stdout + result.stderr


FLOORS = "every package on a floor"
RECONCILE = "reconcile/: the loop, the view, the engine"
NETLINK = "kernel/netlink/: the adapter on the calls"
DAEMON = "daemon/: the wiring on the features"
FEATURES = "daemon/features/: a feature knows no other"


def _copy(tmp_path: Path) -> None:
    for package in ("ipvsctl", "devkit", "bench", "demo", "clusterlab", "tests"):
        shutil.copytree(
            REPO / package,
            tmp_path / package,
            ignore=shutil.ignore_patterns("__pycache__", "results", "golden"),
        )


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        ("model/keys.py", "import typer", "only cli/ imports typer"),
        ("daemon/wiring.py", "import typer", "only cli/ imports typer"),
        ("httpd/server.py", "import kubernetes", "only kube/ imports the Kubernetes client"),
        ("kernel/netns.py", "import prometheus_client", "only obs/ and daemon/ import prometheus"),
        ("cli/app.py", "import prometheus_client", "only obs/ and daemon/ import prometheus"),
        ("plan/diff.py", "import ipvsctl.kernel.netlink", "the pure core does no I/O"),
        ("source/convert.py", "import ipvsctl.reconcile.engine", FLOORS),
        ("source/convert.py", "import ipvsctl.manifests.files", FLOORS),
        ("plan/desired.py", "import ipvsctl.source.convert", FLOORS),
        # the adapters: nothing above them, and none knows another
        ("kernel/table.py", "import ipvsctl.reconcile.engine", FLOORS),
        ("netfilter/nft.py", "import ipvsctl.daemon.wiring", FLOORS),
        ("kube/backoff.py", "import ipvsctl.kernel.port", FLOORS),
        ("httpd/request.py", "import ipvsctl.healthcheck.state", FLOORS),
        ("daemon/api.py", "import ipvsctl.cli.output", FLOORS),
        ("kernel/table.py", "import pyroute2", "only kernel/netlink imports pyroute2"),
        ("kernel/procfs/ipvs.py", "import pyroute2", "only kernel/netlink imports pyroute2"),
        ("kernel/fake.py", "import ipvsctl.kernel.netlink.wire", "know nothing of netlink"),
        # inside the packages: a cycle, a reader importing the loop, a feature another
        ("kernel/netlink/wire.py", "import ipvsctl.kernel.netlink.adapter", NETLINK),
        ("kernel/netlink/codec.py", "import ipvsctl.kernel.netlink.errors", NETLINK),
        ("reconcile/node_drain.py", "import ipvsctl.reconcile.loop", RECONCILE),
        ("reconcile/conntrack_sweeper.py", "import ipvsctl.reconcile.loop", RECONCILE),
        ("reconcile/service_traffic.py", "import ipvsctl.reconcile.engine", RECONCILE),
        ("reconcile/applied.py", "import ipvsctl.reconcile.apply", RECONCILE),
        ("daemon/features/node_drain.py", "import ipvsctl.daemon.features.netfilter", FEATURES),
        ("daemon/feature.py", "import ipvsctl.daemon.wiring", DAEMON),
        ("../devkit/harness.py", "import bench.run", "the dev tools import downward"),
        ("../demo/cluster.py", "import bench.run", "the dev tools import downward"),
        ("../demo/app.py", "import clusterlab.scenarios", "the dev tools import downward"),
        ("../devkit/builders.py", "import tests.unit", "nothing outside tests/ imports tests/"),
    ],
)
def test_a_planted_violation_fails(tmp_path: Path, module: str, line: str, contract: str) -> None:
    _copy(tmp_path)
    target = tmp_path / "ipvsctl" / module
    target.write_text(target.read_text() + f"\n{line}  # planted\n")
    result = _lint(tmp_path)
    assert result.returncode != 0
    assert contract in result.stdout


@pytest.mark.parametrize(
    ("module", "contract"),
    [("reconcile/newpart.py", RECONCILE), ("kernel/netlink/newcall.py", NETLINK)],
)
def test_a_module_without_a_layer_fails(tmp_path: Path, module: str, contract: str) -> None:
    _copy(tmp_path)
    (tmp_path / "ipvsctl" / module).write_text("")
    result = _lint(tmp_path)
    assert result.returncode != 0
    assert contract in result.stdout


def test_a_package_without_a_floor_fails(tmp_path: Path) -> None:
    _copy(tmp_path)
    (tmp_path / "ipvsctl" / "newroom").mkdir()
    (tmp_path / "ipvsctl" / "newroom" / "__init__.py").write_text("")
    result = _lint(tmp_path)
    assert result.returncode != 0
    assert FLOORS in result.stdout and "ipvsctl.newroom" in result.stdout

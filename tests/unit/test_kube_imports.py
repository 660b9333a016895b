"""What the daemon and the CLI import of the `kubernetes` client, each in a fresh interpreter.

The generated API classes (`kubernetes.client.api.*`: CoreV1Api alone is a 4.4 MB module that
imports ~250 model modules) cost the daemon ~21 MB of RSS; it lists and watches without them
(`kube.listwatch`), and a change that brings one back fails here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

DAEMON = """
    from ipvsctl.daemon.options import DaemonOptions, SourceOptions
    from ipvsctl.daemon.adapters import open_event_writer, open_source
    from ipvsctl.model import NodeContext
    from ipvsctl.obs.metrics import Metrics

    node = NodeContext("node-a", ("192.0.2.10",))
    o = DaemonOptions(node=node, source=SourceOptions(apiserver="http://127.0.0.1:9"))
    m = Metrics()
    source = open_source(o, m)  # the KubeSource with its Service, EndpointSlice and Node requests
    assert open_event_writer(o, source, m) is not None
"""

SHUTDOWN_MANAGER = """
    from ipvsctl.cli.shutdown_manager import *  # noqa: F403
    from ipvsctl.kube.config import load_configuration, new_api_client
    from ipvsctl.kube.events import EventWriter

    cfg = load_configuration(None, "http://127.0.0.1:9", environ={}, proxy=False)
    EventWriter(new_api_client(cfg), instance="shutdown-manager-p")  # as open_events
"""

STATUS = """
    import ipvsctl.cli.app
    import ipvsctl.cli.status
"""


def loaded(code: str) -> list[str]:
    """The `kubernetes` modules loaded after running `code` in a fresh interpreter."""
    probe = textwrap.dedent(code) + textwrap.dedent("""
        import json, sys
        print(json.dumps(sorted(n for n in sys.modules if n.split(".")[0] == "kubernetes")))
    """)
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "PYTHONPATH")}
    env["PYTHONPATH"] = str(REPO)
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return list(json.loads(out.stdout.strip().splitlines()[-1]))


def generated_api_classes(modules: list[str]) -> list[str]:
    return [m for m in modules if m.startswith("kubernetes.client.api.")]


@pytest.mark.parametrize("code", [DAEMON, SHUTDOWN_MANAGER], ids=["daemon", "shutdown-manager"])
def test_the_api_client_without_the_generated_api_classes(code: str) -> None:
    modules = loaded(code)
    assert "kubernetes.client.api_client" in modules  # the probe did reach the client
    assert generated_api_classes(modules) == []
    assert not [m for m in modules if m.startswith("kubernetes.client.models.")]


def test_the_status_command_does_not_import_kubernetes() -> None:
    assert loaded(STATUS) == []

"""ipvsctl's own rollout under live connections, on the real kernel (CONTRACT.md "Draining":
a restart never cuts a connection that a running daemon would have let finish).

The real `ipvsctl run` command in the node's netns, as a DaemonSet update runs it: a first
daemon SIGKILLed in the middle of a drain, and while none runs a Service is deleted and a
pod removed from its slice; a second daemon adopts the table, then is replaced by a third
(SIGTERM, a new daemon adopting). Every connection held open through all of it still
carries data at the end, and no deletion cut one.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from devkit.builders import endpoint_slice, service
from devkit.labkit import Connection, Node, Pod, http_get, wait_for
from tests.lab.test_daemon_lab import (
    RunCommand,
    _status,
    eps,
    metric_sum,
    weights,
    write_manifests,
)

pytestmark = pytest.mark.lab

WEB, API = "10.96.0.10", "10.96.0.11"


def connections_to(client: Pod, vip: str, pods: list[Pod]) -> dict[str, Connection]:
    """One held connection to each of `pods` through `vip` (round robin spreads them)."""
    held: dict[str, Connection] = {}
    for _ in range(4 * len(pods)):
        c = client.connect(vip, 80)
        if c.pod in held:
            c.close()
        else:
            held[c.pod] = c
        if len(held) == len(pods):
            return held
    raise AssertionError(f"connections reached only {sorted(held)}")


def test_a_rollout_with_a_sigkill_mid_drain_and_deletions_in_the_gap_cuts_nothing(
    node: Node, client: Pod, tmp_path: Path
) -> None:
    web = [node.make_pod(f"10.244.1.{i}", name=f"web-{i}") for i in (1, 2, 3)]
    api = [node.make_pod("10.244.1.9", name="api-1")]
    folder = tmp_path / "manifests"
    folder.mkdir()
    api_objects = (
        service("api", cluster_ip=API),
        endpoint_slice("api", eps(*api), name="api-abc"),
    )
    write_manifests(folder, service("web"), endpoint_slice("web", eps(*web)), *api_objects)
    port = 19797
    url = f"http://127.0.0.1:{port}"
    args = [
        *("--manifests", str(folder), "--state-dir", str(tmp_path / "state")),
        *("--listen", f"127.0.0.1:{port}", "--drain-check-interval", "0.2"),
        *("--drain-timeout", "600", "--service-drain-timeout", "600"),
        *("--node-name", "node-a", "--node-ip", "192.0.2.10"),
    ]
    runs: list[RunCommand] = []

    def start(n: int) -> RunCommand:
        run = RunCommand(node, args, tmp_path / f"run{n}.log")
        runs.append(run)

        def ready() -> bool:
            if run.proc.poll() is not None:
                raise AssertionError(f"ipvsctl run exited {run.proc.returncode}:\n{run.tail()}")
            answer = _status(node, url, "/readyz")
            return answer is not None and answer[0] == 200

        wait_for(ready, timeout=300, interval=0.5, what=f"run #{n}: /readyz 200")
        return run

    def all_alive(held: dict[str, Connection], when: str) -> None:
        dead = [name for name, c in held.items() if not c.echo(when)]
        assert dead == [], f"{when}: cut {dead}"

    try:
        first = start(1)
        held = {f"web/{k}": c for k, c in connections_to(client, WEB, web).items()}
        held |= {f"api/{k}": c for k, c in connections_to(client, API, api).items()}
        all_alive(held, "before")

        # web-1 leaves its slice (its pod still serves): a drain, then SIGKILL in it
        write_manifests(folder, service("web"), endpoint_slice("web", eps(*web[1:])), *api_objects)
        wait_for(lambda: weights(node)[f"{WEB}:80/TCP"]["10.244.1.1:8080"] == 0, what="drain")
        first.stop(signal.SIGKILL)
        all_alive(held, "after SIGKILL")

        # in the gap: the api Service deleted, web-2 removed from its slice
        write_manifests(folder, service("web"), endpoint_slice("web", eps(web[2])))
        second = start(2)
        table = weights(node)
        assert table[f"{API}:80/TCP"] == {"10.244.1.9:8080": 0}  # drains, not deleted
        assert table[f"{WEB}:80/TCP"] == {
            "10.244.1.1:8080": 0,
            "10.244.1.2:8080": 0,
            "10.244.1.3:8080": 1,
        }
        all_alive(held, "after run #2 adopted")

        # a DaemonSet update: SIGTERM, a new daemon adopting
        assert second.stop() == 0, second.tail()
        all_alive(held, "between run #2 and run #3")
        start(3)
        assert weights(node) == table
        all_alive(held, "after run #3 adopted")
        metrics = http_get(url + "/metrics", node.name)[1]
        assert metric_sum(metrics, "ipvsctl_drain_connections_cut_total") == 0
        assert metric_sum(metrics, "ipvsctl_real_server_deletions_total") == 0
    finally:
        for run in runs:
            if run.proc.poll() is None:
                run.stop()

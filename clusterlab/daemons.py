"""ipvsctl as shipped, one node at a time: `ipvsctl run` as a process in the node's netns with
the flags its DaemonSet gives it (daemonset/daemonset.yaml: `--listen 0.0.0.0:9796
--state-dir ... --log-format json --healthz-bind-address 0.0.0.0:10256`, NODE_NAME and
IPVSCTL_APISERVER from the environment), plus the cluster's own settings (`--cluster-cidr`,
`--lb-grace` from the load balancer's health check). The lab never imports the daemon: it
starts, signals and reads it as an operator would (its HTTP ports, its log).

`ipvsctl node-drain --wait` runs the same way, in the node's netns against its daemon.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clusterlab.net import CLUSTER_CIDR, ClusterNode

BIN = Path(sys.executable).parent
METRICS_PORT = 9796
NODRAIN_ARGS = ("--drain-timeout", "0", "--service-drain-timeout", "0")


@dataclass
class DaemonRun:
    """One process's life: when it was started, ready, signalled and how it ended."""

    started: float
    ready: float | None = None
    signals: list[tuple[float, str]] = field(default_factory=list)
    exited: float | None = None
    returncode: int | None = None


class NodeDaemon:
    """`ipvsctl run` for one node; restartable on the same state dir (a DaemonSet's pod
    replaced: same hostPath). Its log (JSON lines) accumulates in `log_path` over restarts."""

    def __init__(
        self,
        node: ClusterNode,
        apiserver: str,
        state_dir: Path,
        log_path: Path,
        clock: Callable[[], float],
        extra_args: tuple[str, ...] = (),
        lb_grace: float = 4.0,
    ) -> None:
        self.node = node
        self.apiserver = apiserver
        self.state_dir = state_dir
        self.log_path = log_path
        self.clock = clock
        self.extra_args = extra_args
        self.lb_grace = lb_grace
        self.proc: subprocess.Popen[bytes] | None = None
        self.runs: list[DaemonRun] = []
        state_dir.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        """The daemon's HTTP base as pods and the harness reach it (the node's address)."""
        return f"http://{self.node.ip}:{METRICS_PORT}"

    def argv(self) -> list[str]:
        return [
            "ip", "netns", "exec", self.node.netns, str(BIN / "ipvsctl"), "run",
            "--listen", f"0.0.0.0:{METRICS_PORT}",
            "--state-dir", str(self.state_dir),
            "--log-format", "json",
            "--healthz-bind-address", "0.0.0.0:10256",
            "--cluster-cidr", CLUSTER_CIDR,
            "--lb-grace", f"{self.lb_grace:g}",
            *self.extra_args,
        ]  # fmt: skip

    def start(self) -> None:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        env = dict(os.environ, NODE_NAME=self.node.name, IPVSCTL_APISERVER=self.apiserver)
        with open(self.log_path, "ab") as log:
            # `ip netns exec` execs ipvsctl in place: the pid is the daemon's own
            self.proc = subprocess.Popen(
                self.argv(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=env,
            )  # fmt: skip
        self.runs.append(DaemonRun(self.clock()))

    def cpu_seconds(self) -> tuple[int, float] | None:
        """(pid, CPU time so far, user + system) of the running process."""
        if not self.running():
            return None
        assert self.proc is not None
        used = process_cpu_seconds(self.proc.pid)
        return None if used is None else (self.proc.pid, used)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def get(self, path: str, timeout: float = 5.0) -> tuple[int, str] | None:
        """GET on the daemon's --listen port from the harness; None when it does not answer."""
        try:
            with urllib.request.urlopen(self.url + path, timeout=timeout) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()
        except OSError:
            return None

    def is_ready(self) -> bool:
        answer = self.get("/readyz")
        return answer is not None and answer[0] == 200

    def wait_ready(self, timeout: float = 600.0) -> float:
        """Until /readyz answers 200 (its first full list applied); the time it did."""
        deadline = time.monotonic() + timeout
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.node.name}: ipvsctl run exited {self.proc.returncode}:\n{self.tail()}"
                )
            if self.is_ready():
                run = self.runs[-1]
                if run.ready is None:
                    run.ready = self.clock()
                return run.ready
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.node.name}: not ready after {timeout}s\n{self.tail()}")
            time.sleep(0.5)

    def send(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        self.runs[-1].signals.append((self.clock(), sig.name))
        self.proc.send_signal(sig)

    def stop(self, sig: signal.Signals = signal.SIGTERM, timeout: float = 120.0) -> int:
        """Signal and wait for the exit (SIGKILL if it outlives `timeout`); its code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.send(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.send(signal.SIGKILL)
                self.proc.wait(30)
        run = self.runs[-1]
        run.exited, run.returncode = self.clock(), self.proc.returncode
        return self.proc.returncode

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def log_offset(self) -> int:
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def log_records(self, wall0: float, offset: int = 0) -> list[dict[str, Any]]:
        """The daemon's JSON log lines from byte `offset` on, each with `t` on the lab's
        clock (`wall0`: the wall time at its 0); other lines (tracebacks) as {"raw": ...}."""
        out: list[dict[str, Any]] = []
        try:
            with open(self.log_path, "rb") as f:
                f.seek(offset)
                text = f.read().decode(errors="replace")
        except OSError:
            return out
        for line in text.splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                out.append({"raw": line})
                continue
            if not isinstance(rec, dict):
                continue
            stamp = rec.get("time")
            if isinstance(stamp, str):
                wall = datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%fZ").replace(
                    tzinfo=datetime.UTC
                )
                rec["t"] = round(wall.timestamp() - wall0, 3)
            out.append(rec)
        return out


def process_cpu_seconds(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class NodeDrainRun:
    """`ipvsctl node-drain --wait` on a node: its output lines (with times) and exit code."""

    started: float
    lines: list[tuple[float, str]] = field(default_factory=list)
    ended: float | None = None
    returncode: int | None = None


def node_drain_wait(
    node: ClusterNode, clock: Callable[[], float], timeout: float = 300.0
) -> NodeDrainRun:
    """What a node's lifecycle hook runs before the machine goes (docs/node-drain.md): waits
    until the daemon says quiesced (exit 0) or the timeout (exit 1)."""
    run = NodeDrainRun(clock())
    proc = subprocess.Popen(
        [
            "ip", "netns", "exec", node.netns, str(BIN / "ipvsctl"), "node-drain", "--wait",
            "--timeout", f"{timeout:g}s", "--endpoint", f"http://127.0.0.1:{METRICS_PORT}",
        ],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.stdout is not None

    def read() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            run.lines.append((clock(), raw.decode(errors="replace").rstrip()))

    reader = threading.Thread(target=read, daemon=True, name=f"node-drain-{node.name}")
    reader.start()
    run.returncode = proc.wait(timeout + 300)  # + the command's own start in the guest
    reader.join(10)
    run.ended = clock()
    return run

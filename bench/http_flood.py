"""The kubelet's /healthz under a scrape flood (issue 39, item 1), and what the scrapes cost.

    python -m bench.http_flood host [--services 1000] [--opted 200] [--seconds 30]
                                    [--runs 2] [--before DIR] [--out FILE]
    python -m bench.http_flood vm   [--services 200] [--opted 200] [--seconds 30]
                                    [--runs 1] [--before DIR] [--out FILE]

The flood as the issue found it: `opted` Services annotated `ipvsctl.io/metrics: "true"`
(the first of `services`, 10 endpoints each), 64 connections scraping `/metrics` back to
back from four source addresses (16 each: within the per-peer bound, so none is refused
or evicted by it), devkit/httpflood.py in a process of its own. The node's probe is this
process asking `/healthz` every 0.1 s from the node itself (127.0.0.1 in the daemon's
network namespace: trusted, as the kubelet's), timed from connect to the whole answer; the
same probing with no flood first, as the yardstick. `:10256/healthz`
(`--healthz-bind-address`) is probed the same way in `vm`.

Network: the daemon's namespace ("node") holds the daemon (and, on the host, the fake API
server); a veth pair joins it to a "flood" namespace holding the four source addresses
(198.51.100.11-14; the node side 198.51.100.1). Nothing leaves the two namespaces.

`host`: the daemon is ipvsctl's `Daemon` on the in-memory kernel whose service dump is
parsed from the kernel's bytes (bench/service_metrics.py `WireStatsKernel`: what a scrape
costs in Python), following the fake API server (bench/fakeapi_proc.py) in the same
namespace: bench/flood_daemon.py. `--before DIR` runs that same file against the ipvsctl of
another checkout (DIR, e.g. a worktree of main) too, alternating before and after `runs`
times in one window.

`vm` (inside the lab VM, `python -m tests.lab.boot --run 'python -m bench.http_flood vm'`):
the real `ipvsctl run` (`python -m ipvsctl run`, with PYTHONPATH at the checkout measured)
on the real kernel, from a manifests folder, in the node namespace, from an empty table each
run; `--before DIR` alternates another checkout's as on the host.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.common import REPO, log, machine, write_json
from devkit.fakeapi import objects
from devkit.httpflood import probe, summary
from ipvsctl.kernel.netns import run_in_netns

NODE_IP = "198.51.100.1"
SOURCES = [f"198.51.100.{i}" for i in (11, 12, 13, 14)]
PORT = 9796
HEALTH_PORT = 10256
PYTHON = str(REPO / ".venv" / "bin" / "python") if (REPO / ".venv").exists() else sys.executable


def sh(*argv: str, input: str | None = None) -> str:
    return subprocess.run(argv, input=input, text=True, capture_output=True, check=True).stdout


class Namespaces:
    def __init__(self) -> None:
        tag = uuid.uuid4().hex[:6]
        self.node, self.flood = f"h39-node-{tag}", f"h39-flood-{tag}"
        sh("ip", "netns", "add", self.node)
        sh("ip", "netns", "add", self.flood)
        sh("ip", "-n", self.node, "link", "add", "lan0", "type", "veth", "peer", "name", "eth0")
        sh("ip", "-n", self.node, "link", "set", "eth0", "netns", self.flood)
        sh(
            "ip",
            "-n",
            self.node,
            "-batch",
            "-",
            input=f"link set lo up\naddr add {NODE_IP}/24 dev lan0\nlink set lan0 up\n",
        )
        batch = ["link set lo up", "link set eth0 up"]
        batch += [f"addr add {a}/24 dev eth0" for a in SOURCES]
        sh("ip", "-n", self.flood, "-batch", "-", input="\n".join(batch) + "\n")

    def close(self) -> None:
        for ns in (self.node, self.flood):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def _connect(netns: str, port: int) -> Any:
    def make() -> socket.socket:
        return socket.create_connection(("127.0.0.1", port), timeout=30)

    return lambda: run_in_netns(netns, make)


def _get(netns: str, port: int, path: str) -> str:
    with _connect(netns, port)() as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(262144):
            data += chunk
    return data.partition(b"\r\n\r\n")[2].decode()


def _metric(text: str, name: str) -> float | None:
    m = re.search(rf"^{name} (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _wait_ready(netns: str, port: int, proc: subprocess.Popen[bytes], timeout: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"the daemon exited {proc.returncode}")
        try:
            with _connect(netns, port)() as s:
                s.sendall(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
                if s.recv(64).startswith(b"HTTP/1.1 200"):
                    return time.monotonic() - t0
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError("the daemon never became ready")


def measure(ns: Namespaces, pid: int, seconds: float, health_port: int | None) -> dict[str, Any]:
    """Probes with no flood (a third of the time), then under the flood."""
    out: dict[str, Any] = {}
    idle, idle_codes = probe(_connect(ns.node, PORT), "/healthz", max(5.0, seconds / 3))
    out["healthz_idle_ms"], out["healthz_idle_codes"] = summary(idle), dict(idle_codes)
    flood = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            ns.flood,
            PYTHON,
            "-m",
            "devkit.httpflood",
            "--host",
            NODE_IP,
            "--port",
            str(PORT),
            "--sources",
            ",".join(SOURCES),
            "--seconds",
            str(seconds + 4),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    time.sleep(2.0)  # the flood's connections are all in
    cpu0, t0 = _cpu_seconds(pid), time.monotonic()
    times, codes = probe(_connect(ns.node, PORT), "/healthz", seconds)
    cpu1, t1 = _cpu_seconds(pid), time.monotonic()
    out["healthz_flood_ms"], out["healthz_flood_codes"] = summary(times), dict(codes)
    if health_port is not None:
        times, codes = probe(_connect(ns.node, health_port), "/healthz", 5.0)
        out["proxy_healthz_flood_ms"], out["proxy_healthz_flood_codes"] = (
            summary(times),
            dict(codes),
        )
    stdout, _ = flood.communicate(timeout=seconds + 120)
    out["flood"] = json.loads(stdout.strip().splitlines()[-1])
    out["daemon_cpu_share_during_flood"] = round((cpu1 - cpu0) / (t1 - t0), 2)
    try:
        text = _get(ns.node, PORT, "/metrics")
    except OSError as exc:  # a daemon still buried in the flood's backlog
        out["metrics_after_flood"] = repr(exc)
        text = ""
    out["metrics_renders"] = _metric(text, "ipvsctl_metrics_renders_total")
    out["last_render_s"] = _metric(text, "ipvsctl_metrics_render_seconds")
    out["metrics_body_kb"] = round(len(text) / 1024, 1)
    out["http_refused"] = {
        m.group(1): float(m.group(2))
        for m in re.finditer(
            r'^ipvsctl_http_refused_total\{reason="(\w+)",server="daemon"\} (\S+)$', text, re.M
        )
    }
    out["load_avg_1m"] = round(os.getloadavg()[0], 2)
    return out


def run_host_once(ns: Namespaces, api_url: str, code: Path, seconds: float) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(code), PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            ns.node,
            PYTHON,
            str(REPO / "bench" / "flood_daemon.py"),
            "--apiserver",
            api_url,
            "--listen",
            f"0.0.0.0:{PORT}",
        ],
        cwd=tempfile.gettempdir(),
        env=env,
        stdin=subprocess.PIPE,
    )
    try:
        ready = _wait_ready(ns.node, PORT, proc, 900)
        r = measure(ns, proc.pid, seconds, None)
        r["ready_s"] = round(ready, 1)
        return r
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run_host(args: argparse.Namespace) -> dict[str, Any]:
    ns = Namespaces()
    api = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            ns.node,
            PYTHON,
            "-m",
            "bench.fakeapi_proc",
            "--services",
            str(args.services),
            "--annotated",
            str(args.opted),
        ],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    out: dict[str, Any] = {
        "machine": machine(),
        "services": args.services,
        "opted_in": args.opted,
        "seconds": args.seconds,
        "runs": [],
    }
    try:
        assert api.stdout is not None
        url = api.stdout.readline().strip()
        codes = [("after", REPO)]
        if args.before:
            codes.insert(0, ("before", Path(args.before).resolve()))
        for i in range(args.runs):
            for label, code in codes:
                log(f"http flood host run {i} {label} ({code})")
                r = run_host_once(ns, url, code, args.seconds)
                r.update(run=i, code=label, tree=str(code))
                log(json.dumps(r))
                out["runs"].append(r)
    finally:
        assert api.stdin is not None
        api.stdin.write("quit\n")
        api.stdin.close()
        api.wait(60)
        ns.close()
    return out


def write_cluster(folder: Path, services: int, opted: int) -> int:
    items = []
    n = 0
    for obj in objects.cluster(services, 10):
        if obj["kind"] == "Service" and n < opted:
            obj["metadata"].setdefault("annotations", {})["ipvsctl.io/metrics"] = "true"
            n += 1
        items.append(obj)
    (folder / "cluster.json").write_text(
        json.dumps({"apiVersion": "v1", "kind": "List", "items": items})
    )
    return n


def run_vm_once(manifests: Path, code: Path, seconds: float) -> dict[str, Any]:
    """`ipvsctl run` of the checkout `code` (`python -m ipvsctl` with PYTHONPATH=code) on
    the real kernel, in fresh namespaces (the table starts empty)."""
    ns = Namespaces()
    workdir = Path(tempfile.mkdtemp(prefix="h39-flood-"))
    log_file = open(workdir / "run.log", "w")  # noqa: SIM115 - closed below
    env = dict(os.environ, PYTHONPATH=str(code), PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            ns.node,
            PYTHON,
            "-m",
            "ipvsctl",
            "run",
            "--manifests",
            str(manifests),
            "--state-dir",
            str(workdir / "state"),
            "--listen",
            f"0.0.0.0:{PORT}",
            "--healthz-bind-address",
            f"0.0.0.0:{HEALTH_PORT}",
            "--node-name",
            "node-a",
            "--node-ip",
            NODE_IP,
        ],
        cwd="/",
        env=env,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    try:
        ready = _wait_ready(ns.node, PORT, proc, 1800)
        out = measure(ns, proc.pid, seconds, HEALTH_PORT)
        out["ready_s"] = round(ready, 1)
        return out
    finally:
        proc.terminate()
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log_file.close()
        ns.close()


def run_vm(args: argparse.Namespace) -> dict[str, Any]:
    for mod in ("ip_vs", "ip_vs_rr", "dummy", "veth", "nf_conntrack", "nf_tables"):
        subprocess.run(["modprobe", mod], capture_output=True)
    manifests = Path(tempfile.mkdtemp(prefix="h39-manifests-"))
    n = write_cluster(manifests, args.services, args.opted)
    out: dict[str, Any] = {
        "machine": machine(),
        "services": args.services,
        "opted_in": n,
        "seconds": args.seconds,
        "runs": [],
    }
    codes = [("after", REPO)]
    if args.before:
        codes.insert(0, ("before", Path(args.before).resolve()))
    for i in range(args.runs):
        for label, code in codes:
            log(f"http flood vm run {i} {label} ({code})")
            try:
                r = run_vm_once(manifests, code, args.seconds)
            except Exception as exc:  # one run failing (its probes past every timeout)
                r = {"error": repr(exc)}
            r.update(run=i, code=label, tree=str(code))
            log(json.dumps(r))
            out["runs"].append(r)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.http_flood")
    p.add_argument("where", choices=("host", "vm"))
    p.add_argument("--services", type=int, default=None)
    p.add_argument("--opted", type=int, default=200)
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--before", default=None, help="another checkout's root, run alternately")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if args.where == "vm" and args.runs == 2 and not args.before:
        args.runs = 1
    if args.services is None:
        args.services = 1000 if args.where == "host" else 200
    result = run_host(args) if args.where == "host" else run_vm(args)
    text = json.dumps(result, indent=1)
    if args.out:
        write_json(Path(args.out), result)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

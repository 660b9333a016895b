"""The daemon's peak memory and CPU time following N Services x E endpoints from the fake
API server (another process): the initial list, then `events` watch events (EndpointSlice
updates). RSS peak is the daemon process's VmHWM; CPU time its utime+stime, both from /proc.
"""

from __future__ import annotations

import http.client
import os
import subprocess
import sys
import time
import urllib.request
from typing import Any

from bench.common import REPO, log, summary


def _proc(pid: int) -> dict[str, float]:
    with open(f"/proc/{pid}/status") as f:
        status = f.read()
    kb = {
        ln.split(":")[0]: int(ln.split()[1])
        for ln in status.splitlines()
        if ln.startswith(("VmHWM", "VmRSS"))
    }
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return {
        "rss_peak_mb": kb.get("VmHWM", 0) / 1024,
        "rss_mb": kb.get("VmRSS", 0) / 1024,
        "cpu_s": (int(fields[11]) + int(fields[12])) / tick,
    }


def _metric(port: int, name: str) -> float:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read()
    total = 0.0
    for line in body.decode().splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _buckets(port: int) -> dict[float, float]:
    """ipvsctl_event_to_kernel_seconds's cumulative buckets: upper bound -> count."""
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read()
    out: dict[float, float] = {}
    for line in body.decode().splitlines():
        if line.startswith("ipvsctl_event_to_kernel_seconds_bucket{"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            out[float(le)] = float(line.rsplit(" ", 1)[1])
    return out


def _backlog(port: int) -> dict[str, int]:
    import json

    url = f"http://127.0.0.1:{port}/bench/backlog"
    # waits for the loop's lock: a batch under tracemalloc holds it for many seconds
    return json.loads(urllib.request.urlopen(url, timeout=600).read())


def _trace(port: int, at: str) -> Any:
    import json

    url = f"http://127.0.0.1:{port}/bench/memory?at={at}"
    return json.loads(urllib.request.urlopen(url, timeout=600).read())


def _latencies(port: int) -> list[float]:
    """Exact event-to-kernel seconds since the last call (bench.daemon_proc's route)."""
    import json

    url = f"http://127.0.0.1:{port}/bench/latencies"
    return json.loads(urllib.request.urlopen(url, timeout=30).read())


def quantile(before: dict[float, float], after: dict[float, float], q: float) -> float | None:
    """The bucket upper bound (seconds) under which `q` of the observations made between
    the two readings fall."""
    les = sorted(after)
    delta = [after[le] - before.get(le, 0.0) for le in les]
    total = delta[-1] if delta else 0.0
    if total <= 0:
        return None
    return next(le for le, n in zip(les, delta, strict=True) if n >= q * total)


class StatusPollers:
    """`n` clients fetching /status in a loop (each reads the whole body), as four
    dashboards or `watch ipvsctl status` would."""

    def __init__(self, port: int, n: int) -> None:
        import threading

        self.url = f"http://127.0.0.1:{port}/status"
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.done = 0
        self.bytes = 0
        self.errors = 0
        self.threads = [threading.Thread(target=self._poll, daemon=True) for _ in range(n)]
        for t in self.threads:
            t.start()

    def _poll(self) -> None:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        while not self.stop.is_set():
            try:
                with opener.open(self.url, timeout=60) as resp:
                    n = len(resp.read())
                with self.lock:  # `+=` around a slow read would lose the other threads' counts
                    self.bytes += n
                    self.done += 1
            except (OSError, ValueError, http.client.HTTPException):
                with self.lock:
                    self.errors += 1
                time.sleep(0.1)

    def close(self) -> dict[str, Any]:
        self.stop.set()
        for t in self.threads:
            t.join(60)
        return {
            "status_clients": len(self.threads),
            "status_responses": self.done,
            "status_errors": self.errors,
            "status_mb_per_response": round(self.bytes / max(1, self.done) / 2**20, 1),
        }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


def run_memory(
    services: int,
    endpoints: int,
    events: int,
    netns: str | None = None,
    timeout: float = 3600,
    rate: float = 0.0,
    status_clients: int = 0,
    annotated: int = 0,
    wire_stats: bool = False,
    scrape_interval: float = 0.0,
    trace: bool = False,
    idle_seconds: float = 0.0,
) -> dict[str, Any]:
    """One run; `rate` paces the watch events (0: as fast as the fake API sends them);
    `status_clients` poll /status in a loop while the events come. `annotated` Services opt
    in to per-Service traffic metrics, whose service dump the daemon parses in the kernel's
    bytes with `wire_stats` (bench/service_metrics.py), and with `scrape_interval` a scraper
    GETs /metrics that often while the events come. `trace`: tracemalloc in the daemon
    (bench/memprofile.py), its readings after the list, at the peak and at the end.
    `idle_seconds`: the daemon's CPU over that long with nothing changing, after the list."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    api = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bench.fakeapi_proc",
            "--services",
            str(services),
            "--endpoints",
            str(endpoints),
            "--annotated",
            str(annotated),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
    )
    daemon = None
    try:
        assert api.stdout and api.stdin
        url = api.stdout.readline().strip()
        log(f"memory: fake API with {services} services up at {url}")
        cmd = [sys.executable, "-m", "bench.daemon_proc", "--apiserver", url]
        if netns:
            cmd += ["--netns", netns]
        if wire_stats:
            cmd += ["--wire-stats"]
        if trace:
            cmd += ["--tracemalloc"]
        t0 = time.monotonic()
        daemon = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=REPO
        )
        assert daemon.stdout
        port = int(daemon.stdout.readline().split()[1])
        ready_line = daemon.stdout.readline().split()
        ready_s, imported_s = float(ready_line[1]), float(ready_line[3])
        after_list = _proc(daemon.pid)
        log(f"memory: daemon ready in {ready_s:.1f}s, rss {after_list['rss_mb']:.0f} MB")
        n0 = -1.0  # the initial sync's own observations may still be landing
        while True:
            n = _metric(port, "ipvsctl_event_to_kernel_seconds_count")
            if n == n0:
                break
            n0 = n
            time.sleep(1.0)
        idle: dict[str, Any] = {}
        if idle_seconds:
            c0, w0 = _proc(daemon.pid)["cpu_s"], time.monotonic()
            time.sleep(idle_seconds)
            c1, w1 = _proc(daemon.pid)["cpu_s"], time.monotonic()
            idle = {"idle_cpu_percent": round(100 * (c1 - c0) / (w1 - w0), 2)}
            idle["idle_seconds"] = round(w1 - w0, 1)
        traced: dict[str, Any] = {}
        if trace:
            traced["after_list"] = _trace(port, "after_list")
        pollers = StatusPollers(port, status_clients) if status_clients else None
        scraper = None
        if scrape_interval:
            from bench.service_metrics import Scraper

            scraper = Scraper(port, scrape_interval)
        buckets0 = _buckets(port)
        _latencies(port)  # drop the initial sync's
        t1 = time.monotonic()
        api.stdin.write(f"churn {events} {rate}\n")
        api.stdin.flush()
        churned = api.stdout.readline().split()
        deadline = time.monotonic() + timeout
        applied = 0.0
        rss_max = 0.0
        quiet = 0
        while time.monotonic() < deadline:
            rss_max = max(rss_max, _proc(daemon.pid)["rss_mb"])
            if trace:
                _trace(port, "poll")
            last, applied = applied, _metric(port, "ipvsctl_event_to_kernel_seconds_count") - n0
            if applied >= events:
                break
            # Versions merged in the backlog that end where they began (a flip and its
            # flip back) reach no kernel and are never observed: done once nothing waits.
            quiet = quiet + 1 if applied == last and _backlog(port)["waiting"] == 0 else 0
            if quiet >= 4:
                break
            time.sleep(0.5)
        t_events = time.monotonic() - t1
        polled = pollers.close() if pollers else {}
        if scraper is not None:
            polled |= scraper.close()
        buckets1 = _buckets(port)
        exact = sorted(_latencies(port))
        time.sleep(1.0)
        end = _proc(daemon.pid)
        if trace:
            traced["peak"] = _trace(port, "peak")
            traced["end"] = _trace(port, "end")
        restarts = _metric(port, "ipvsctl_watch_restarts_total")
        merged = _backlog(port)["merged"]
        applied = _metric(port, "ipvsctl_event_to_kernel_seconds_count") - n0
        out = {
            "services": services,
            "endpoints": services * endpoints,
            "watch_events": events,
            "event_rate": rate or "as fast as sent",
            "kernel": "netlink (lab VM)" if netns else "FakeKernel (in-memory, host)",
            "time_to_ready_s": round(ready_s, 2),
            "import_s": round(imported_s, 2),
            "rss_after_list_mb": round(after_list["rss_mb"], 1),
            "rss_peak_after_list_mb": round(after_list["rss_peak_mb"], 1),
            "cpu_after_list_s": round(after_list["cpu_s"], 2),
            "events_applied": int(applied),
            "events_merged_in_backlog": merged,
            "watch_restarts": int(restarts),
            "events_seconds": round(t_events, 2),
            "api_churn_seconds": float(churned[2]) if len(churned) > 2 else None,
            "rss_peak_mb": round(end["rss_peak_mb"], 1),
            "rss_end_mb": round(end["rss_mb"], 1),
            "cpu_total_s": round(end["cpu_s"], 2),
            "cpu_events_s": round(end["cpu_s"] - after_list["cpu_s"], 2),
            "wall_total_s": round(time.monotonic() - t0, 2),
            "rss_max_during_events_mb": round(rss_max, 1),
            "event_to_kernel_ms": summary(exact) if exact else None,
            "event_to_kernel_p50_le_ms": _ms(quantile(buckets0, buckets1, 0.5)),
            "event_to_kernel_p99_le_ms": _ms(quantile(buckets0, buckets1, 0.99)),
            **polled,
            **idle,
        }
        if trace:
            out["tracemalloc"] = traced
        log(
            f"memory: peak RSS {out['rss_peak_mb']} MB, CPU {out['cpu_total_s']} s, "
            f"{int(applied)}/{events} events applied in {t_events:.1f}s"
        )
        return out
    finally:
        if daemon is not None:
            if daemon.stdin:
                daemon.stdin.close()
            try:
                daemon.wait(timeout=30)
            except subprocess.TimeoutExpired:
                daemon.kill()
        if api.stdin:
            try:
                api.stdin.write("quit\n")
                api.stdin.close()
            except OSError:
                pass
        try:
            api.wait(timeout=30)
        except subprocess.TimeoutExpired:
            api.kill()

"""`ipvsctl shutdown-manager` end to end, in-process: the real HTTP server and barrier thread
against fake daemons (local HTTP servers answering /v1/quiesced) and a fake /proc/net.

Synchronisation is by conditions on what the fakes have seen (queries answered, connection
counts read), never by sleeping; the barrier polls with a short real interval."""

from __future__ import annotations

import dataclasses
import json
import logging
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from ipvsctl.cli.shutdown_manager import (
    ManagerOptions,
    ShutdownManager,
    parse_duration,
    register,
)
from ipvsctl.httpd import HTTPServer, as_json
from ipvsctl.shutdown.barrier import BarrierConfig

POD = "10.244.1.5"
HEADER = (
    "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  "
    "timeout inode\n"
)
LISTEN_8080 = (
    "   0: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  "
    "1000        0 1582 1 0000000000000001 100 0 0 10 0\n"
)


def established_8080(n: int) -> str:
    """n clients (10.0.0.2:50000+i) connected to the pod's 10.244.1.5:8080."""
    return "".join(
        f"   {i + 1}: 0501F40A:1F90 0200000A:{50000 + i:04X} 01 00000000:00000000 "
        f"02:000AF0A3 00000000  1000        0 {2000 + i} 2 0000000000000002 20 4 30 10 -1\n"
        for i in range(n)
    )


def write_proc(folder: Path, connections: int) -> None:
    tmp = folder / ".tcp.tmp"
    tmp.write_text(HEADER + LISTEN_8080 + established_8080(connections))
    tmp.rename(folder / "tcp")  # atomic: the counter never reads half a file


class FakeDaemon:
    """One node's ipvsctl: /v1/quiesced from `quiesced`/`ready`, counting the queries."""

    def __init__(self, node: str, quiesced: bool = False, ready: bool = True) -> None:
        self.node, self.quiesced, self.ready = node, quiesced, ready
        self.queries = 0
        self.cond = threading.Condition()
        self.http = HTTPServer("127.0.0.1:0", {"/v1/quiesced": self.handle})
        self.url = f"http://127.0.0.1:{self.http.port}"
        self.http.start()

    def handle(self, q: dict[str, list[str]]) -> tuple[int, str, bytes]:
        ip = q["ip"][0]
        with self.cond:
            doc = {
                "ip": ip,
                "node": self.node,
                "ready": self.ready,
                "quiesced": self.ready and self.quiesced,
                "real_servers_with_weight": 0 if self.quiesced else 1,
                "since": None,
                "for_seconds": None,
            }
            self.queries += 1
            self.cond.notify_all()
        return as_json(200, doc)

    def set(self, **kw: bool) -> None:
        with self.cond:
            for k, v in kw.items():
                setattr(self, k, v)

    def answered_more(self, than: int | None = None, by: int = 2) -> None:
        """Block until this daemon has answered `by` more queries (proof of polling)."""
        with self.cond:
            base = self.queries if than is None else than
            assert self.cond.wait_for(lambda: self.queries >= base + by, 10)


class CountSpy:
    """Wraps the connection counter: records each count read, with a condition."""

    def __init__(self, inner: Callable[[], int]) -> None:
        self.inner = inner
        self.counts: list[int] = []
        self.cond = threading.Condition()

    def __call__(self) -> int:
        n = self.inner()
        with self.cond:
            self.counts.append(n)
            self.cond.notify_all()
        return n

    def wait_reads(self, n: int) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.counts) >= n, 10)


def get(url: str, timeout: float = 20) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            body = r.read().decode()
            return r.status, json.loads(body) if body.startswith("{") else body
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


class Caller(threading.Thread):
    """A preStop hook: GET /shutdown, remembering the answer and when it came."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.answer: tuple[int, Any] | None = None
        self.at = 0.0

    def run(self) -> None:
        self.answer = get(self.url + "/shutdown")
        self.at = time.monotonic()


@pytest.fixture
def daemons() -> Iterator[list[FakeDaemon]]:
    ds = [FakeDaemon("node-a"), FakeDaemon("node-b")]
    yield ds
    for d in ds:
        d.http.stop()


def manager(tmp_path: Path, daemons: list[str], **barrier: Any) -> ShutdownManager:
    cfg = {"check_interval": 0.02, "timeout": 30.0, **barrier}
    return ShutdownManager(
        ManagerOptions(
            pod_ips=(POD,),
            listen="127.0.0.1:0",
            daemons=tuple(daemons),
            proc_net=str(tmp_path),
            barrier=BarrierConfig(**cfg),
        )
    )


def test_shutdown_returns_as_soon_as_every_daemon_is_quiesced_and_connections_drain(
    tmp_path, daemons
):
    a, b = daemons
    write_proc(tmp_path, connections=1)
    m = manager(tmp_path, [a.url, b.url])
    spy = CountSpy(m.barrier.probes.connections)  # type: ignore[attr-defined]
    m.barrier.probes.connections = spy  # type: ignore[attr-defined]
    m.start()
    base = f"http://127.0.0.1:{m.port}"
    try:
        assert get(base + "/healthz") == (200, "ok\n")
        assert get(base + "/status")[1]["state"] == "idle"
        # The app's preStop hook and the sidecar's own call /shutdown at the same time.
        callers = [Caller(base), Caller(base)]
        for c in callers:
            c.start()
        assert m.barrier.wait_for_waiters(2, 10)
        a.answered_more()
        b.answered_more()
        assert not any(c.answer for c in callers)  # both daemons still send it traffic

        a.set(quiesced=True)
        b.answered_more()
        b.set(ready=False, quiesced=True)  # restarting: knows nothing yet, so not quiesced
        b.answered_more()
        assert not any(c.answer for c in callers)
        status = get(base + "/status")[1]
        assert status["state"] == "running" and status["stage"] == "daemons"
        assert status["daemons"]["not_quiesced"] == {b.url: "not ready (no first sync yet)"}

        b.set(ready=True)
        spy.wait_reads(2)  # the connections stage is polling /proc/net/tcp
        assert spy.counts[:2] == [1, 1]
        assert get(base + "/status")[1]["stage"] == "connections"
        assert not any(c.answer for c in callers)

        released = time.monotonic()
        write_proc(tmp_path, connections=0)
        for c in callers:
            c.join(10)
        # Returned within a few polling intervals of the last client leaving, nowhere near
        # the 30 s timeout: no fixed delay anywhere.
        assert all(c.answer for c in callers)
        assert max(c.at for c in callers) - released < 2.0
        answers = [c.answer for c in callers]
        assert answers[0] == answers[1]  # one barrier, one result
        code, doc = answers[0]  # type: ignore[misc]
        assert code == 200 and doc["outcome"] == "drained"
        assert doc["daemons"] == {
            "total": 2,
            "quiesced": 2,
            "not_quiesced": {},
            "discovery_error": None,
        }
        assert doc["connections"]["established"] == 0 and doc["elapsed_seconds"] < 30
        assert set(doc["stages"]) == {"daemons", "connections"}
        # A hook that comes late gets an answer of its own (a new barrier, never a result
        # from before it came); the daemons are still quiesced, so it is drained again.
        code, late = get(base + "/shutdown")
        assert code == 200 and late["outcome"] == "drained" and late != doc
        status = get(base + "/status")[1]
        assert status["state"] == "done" and status["runs"] == 2
    finally:
        m.finish()  # SIGTERM's path: the barrier is done, so this returns at once


def test_a_daemon_that_never_answers_is_named_and_the_hook_returns_at_the_timeout(
    tmp_path, daemons, caplog
):
    a, _ = daemons
    a.set(quiesced=True)
    closed = socket.create_server(("127.0.0.1", 0))
    silent = f"http://127.0.0.1:{closed.getsockname()[1]}"
    closed.close()
    write_proc(tmp_path, connections=0)
    m = manager(tmp_path, [a.url, silent], timeout=0.5)
    m.start()
    try:
        with caplog.at_level(logging.INFO, logger="ipvsctl.shutdown"):
            started = time.monotonic()
            code, doc = get(f"http://127.0.0.1:{m.port}/shutdown")
            took = time.monotonic() - started
        assert code == 200 and doc["outcome"] == "timeout" and doc["stage"] == "daemons"
        assert 0.5 <= took < 3.0
        assert list(doc["daemons"]["not_quiesced"]) == [silent]
        assert doc["daemons"]["not_quiesced"][silent].startswith("unreachable: ")
        named = [r for r in caplog.records if r.getMessage() == "daemon not quiesced at timeout"]
        assert [r.fields["daemon"] for r in named] == [silent]  # type: ignore[attr-defined]
    finally:
        m.stop()


def test_daemons_are_found_through_dns(tmp_path, daemons):
    a, _ = daemons
    a.set(quiesced=True)
    write_proc(tmp_path, connections=0)
    asked: list[tuple[str, int]] = []

    def resolve(name: str, port: int) -> list[str]:
        asked.append((name, port))
        return ["127.0.0.1"]

    m = ShutdownManager(
        ManagerOptions(
            pod_ips=(POD,),
            listen="127.0.0.1:0",
            daemon_services=("ipvsctl-metrics.test",),
            daemon_port=a.http.port,
            proc_net=str(tmp_path),
            barrier=BarrierConfig(check_interval=0.02, timeout=10),
        ),
        resolve=resolve,
    )
    m.start()
    try:
        code, doc = get(f"http://127.0.0.1:{m.port}/shutdown")
        assert code == 200 and doc["outcome"] == "drained"
        assert asked[0] == ("ipvsctl-metrics.test", a.http.port)
        assert doc["daemons"]["total"] == 1
    finally:
        m.stop()


def test_by_default_the_daemons_are_found_in_kube_system_too(tmp_path, daemons, cli, monkeypatch):
    """The kube-proxy takeover runs the daemons in kube-system: the command's defaults look
    there as well as in ipvsctl-system, and a name that does not exist is no failure (the
    system resolver's NXDOMAIN, stubbed under getaddrinfo)."""
    a, _ = daemons
    a.set(quiesced=True)
    write_proc(tmp_path, connections=0)
    seen: list[ManagerOptions] = []
    monkeypatch.setattr("ipvsctl.cli.shutdown_manager.run", lambda o: seen.append(o) or 0)
    monkeypatch.setattr("ipvsctl.obs.logging.setup", lambda fmt, level=None: None)
    r = CliRunner().invoke(cli, ["shutdown-manager", "--pod-ip", POD])
    assert r.exit_code == 0, r.output
    (options,) = seen
    real_getaddrinfo = socket.getaddrinfo

    def getaddrinfo(host, port, *args, **kwargs):
        if host == "ipvsctl-metrics.kube-system.svc.cluster.local":
            return real_getaddrinfo("127.0.0.1", port, *args, **kwargs)
        if str(host).startswith("ipvsctl-metrics."):
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return real_getaddrinfo(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    m = ShutdownManager(
        dataclasses.replace(
            options,
            listen="127.0.0.1:0",
            daemon_port=a.http.port,
            proc_net=str(tmp_path),
            barrier=BarrierConfig(check_interval=0.02, timeout=5),
        )
    )
    m.start()
    try:
        code, doc = get(f"http://127.0.0.1:{m.port}/shutdown")
        assert code == 200 and doc["outcome"] == "drained", doc
        assert doc["daemons"]["total"] == 1
    finally:
        m.stop()


def test_on_sigterm_a_running_barrier_is_seen_through_and_its_hook_answered(tmp_path, daemons):
    a, b = daemons  # neither quiesces
    write_proc(tmp_path, connections=0)
    m = manager(tmp_path, [a.url, b.url], timeout=0.4)
    m.start()
    caller = Caller(f"http://127.0.0.1:{m.port}")
    caller.start()
    assert m.barrier.wait_for_waiters(1, 10)
    m.finish()  # what run() does on SIGTERM
    caller.join(10)
    assert caller.answer is not None and caller.answer[0] == 200
    assert caller.answer[1]["outcome"] == "timeout"


def test_on_sigterm_with_no_barrier_it_stops_at_once(tmp_path, daemons):
    m = manager(tmp_path, [daemons[0].url])
    m.start()
    m.finish()
    assert not m.barrier.started


# --- the command --------------------------------------------------------------------------


@pytest.fixture
def cli() -> typer.Typer:
    app = typer.Typer(add_completion=False)

    @app.callback()
    def _root() -> None:
        """test root"""

    register(app)
    return app


def test_the_command_and_its_flags(cli, monkeypatch):
    monkeypatch.delenv("POD_IP", raising=False)
    runner = CliRunner()
    r = runner.invoke(cli, ["shutdown-manager", "--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0
    for flag in (
        "--pod-ip",
        "--listen",
        "--daemon",
        "--daemon-service",
        "--daemon-port",
        "--port",
        "--min-open-connections",
        "--check-interval",
        "--check-delay",
        "--timeout",
        "--proc-net",
        "--wait-connections",
        "--log-format",
    ):
        assert flag in r.output, flag
    r = runner.invoke(cli, ["shutdown-manager"])
    assert r.exit_code == 2 and "--pod-ip" in r.output
    r = runner.invoke(cli, ["shutdown-manager", "--pod-ip", "nope"])
    assert r.exit_code == 2 and "not an IP address" in r.output
    r = runner.invoke(cli, ["shutdown-manager", "--pod-ip", POD, "--timeout", "soon"])
    assert r.exit_code == 2 and "not a duration" in r.output
    r = runner.invoke(cli, ["shutdown-manager", "--pod-ip", POD, "--check-interval", "0"])
    assert r.exit_code == 2 and "must be > 0" in r.output
    r = runner.invoke(cli, ["shutdown-manager", "--pod-ip", POD, "--daemon", "10.0.0.1:9796"])
    assert r.exit_code == 2 and "--daemon" in r.output


def test_a_listen_address_in_use_is_a_start_up_error(cli, monkeypatch):
    taken = socket.create_server(("127.0.0.1", 0))
    # keep pytest's logging
    monkeypatch.setattr("ipvsctl.obs.logging.setup", lambda fmt, level=None: None)
    try:
        monkeypatch.setenv("POD_IP", f"{POD},fd00::5")
        r = CliRunner().invoke(
            cli, ["shutdown-manager", "--listen", f"127.0.0.1:{taken.getsockname()[1]}"]
        )
        assert r.exit_code == 1 and "--listen" in r.output
    finally:
        taken.close()


def test_durations_take_seconds_or_go_style_units():
    assert parse_duration("25") == 25 and parse_duration("2.5s") == 2.5
    assert parse_duration("500ms") == 0.5 and parse_duration("1m") == 60
    assert parse_duration("1h") == 3600 and parse_duration("1m30s") == 90
    for bad in ("", "-1", "1d", "s", "nan", "inf"):
        with pytest.raises(ValueError):
            parse_duration(bad)


def test_the_example_manifest_is_consistent_with_the_command(cli):
    """daemonset/examples/app-with-shutdown-manager.yaml: its args parse, both hooks hit the
    sidecar's port, and the grace period covers --timeout."""
    import yaml

    path = Path(__file__).resolve().parents[2] / "daemonset/examples/app-with-shutdown-manager.yaml"
    pod = yaml.safe_load(path.read_text())["spec"]["template"]["spec"]
    app, sidecar = pod["containers"]
    args = sidecar["args"]
    assert args[0] == "shutdown-manager"
    command = typer.main.get_command(cli).commands["shutdown-manager"]  # type: ignore[attr-defined]
    params = command.make_context("shutdown-manager", list(args[1:])).params
    listen_port = int(params["listen"].rpartition(":")[2])
    for c in (app, sidecar):
        assert c["lifecycle"]["preStop"]["httpGet"] == {"path": "/shutdown", "port": listen_port}
    assert params["port"] == [app["ports"][0]["containerPort"]]
    env = {e["name"]: e for e in sidecar["env"]}
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] in ("status.podIP", "status.podIPs")
    assert parse_duration(params["timeout"]) < pod["terminationGracePeriodSeconds"]


def _open(port: int, peer: str, request: bytes | None = None) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=20, source_address=(peer, 0))
    if request:
        s.sendall(request)
    return s


def _threads() -> int:
    """The process's threads but the barrier's daemon queries (each check makes a pool of
    its own, `quiesced_*`, one thread per daemon, that comes and goes whatever the callers)
    and the fake daemons' own servers (`http`, `http-worker_*`: a worker pool starts when
    the first query reaches it, which on a loaded machine can be after the first count)."""
    return sum(1 for t in threading.enumerate() if not t.name.startswith(("quiesced", "http")))


def test_no_strays_or_flood_end_the_prestop_before_the_barrier(tmp_path, daemons):
    """Regression: 64 stray GET /shutdown held open made the real preStop get 503 in 1 ms,
    and an idle flood evicted preStop connections unanswered (the kubelet takes either as
    "done"). Now: 64 strays from four addresses are parked (no thread each), a flood of
    idle connections comes from a fifth, and the preStop from the kubelet's address (not
    trusted here: per-peer bounds alone) still waits for quiesced, then gets 200."""
    a, b = daemons
    write_proc(tmp_path, connections=0)
    m = manager(tmp_path, [a.url, b.url])
    # Every 127.0.0.0/8 address is loopback, so trusted: only 127.0.0.1 is, here.
    m.http.server.trusted = lambda peer: peer == "127.0.0.1"
    m.start()
    shutdown = b"GET /shutdown HTTP/1.1\r\nHost: x\r\n\r\n"
    held: list[socket.socket] = []
    try:
        strays = [_open(m.port, f"127.0.0.{3 + i // 16}", shutdown) for i in range(64)]
        held += strays
        assert m.barrier.wait_for_waiters(64, 10)
        threads = _threads()
        kubelet = _open(m.port, "127.0.0.2", shutdown)  # the preStop, as the kubelet sends it
        held.append(kubelet)
        held += [_open(m.port, "127.0.0.9") for _ in range(300)]  # the idle flood
        assert m.barrier.wait_for_waiters(65, 10)
        a.answered_more()
        b.answered_more()
        assert _threads() <= threads + 1  # no thread per waiting caller
        kubelet.settimeout(0.2)
        with pytest.raises(TimeoutError):
            kubelet.recv(1)  # no answer (no 503, no reset) while the daemons send traffic
        a.set(quiesced=True)
        b.set(quiesced=True)
        kubelet.settimeout(20)
        data = b""
        while chunk := kubelet.recv(65536):
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 ")
        assert json.loads(body)["outcome"] == "drained"
        assert m.http.server.connections_of("127.0.0.9") <= 16
    finally:
        for s in held:
            s.close()
        m.stop()


def _recv_all(s: socket.socket, timeout: float = 20) -> bytes:
    s.settimeout(timeout)
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    return data


def test_a_crowd_of_strangers_never_closes_a_parked_prestop(tmp_path, daemons):
    """The documented setup on a bridge CNI: the app's and the sidecar's preStops both come
    from the kubelet's address on the bridge (neither loopback nor --node-ip: not trusted)
    and wait parked. Strangers take every other slot of the 1,024, one stray call each
    from as many addresses; then more strangers come. The kubelet's address, holding two,
    was the heaviest peer, so a newcomer closed a parked preStop with no answer (the
    kubelet takes that as "done"). A parked /shutdown is never closed now: the newcomers
    are refused instead, and both preStops get the barrier's answer."""
    a, b = daemons
    write_proc(tmp_path, connections=0)
    m = manager(tmp_path, [a.url, b.url])
    m.http.server.trusted = lambda peer: peer == "127.0.0.1"
    m.start()
    shutdown = b"GET /shutdown HTTP/1.1\r\nHost: x\r\n\r\n"
    cap = m.http.server.limits.max_connections
    held: list[socket.socket] = []
    try:
        app = _open(m.port, "127.0.0.2", shutdown)
        sidecar = _open(m.port, "127.0.0.2", shutdown)
        held += [app, sidecar]
        assert m.barrier.wait_for_waiters(2, 10)
        strangers = [f"127.1.{i // 250}.{i % 250 + 1}" for i in range(cap - 2 + 20)]
        for start in range(0, cap - 2, 100):  # batches the accept backlog can hold
            batch = strangers[start : min(start + 100, cap - 2)]
            held += [_open(m.port, peer, shutdown) for peer in batch]
            assert m.barrier.wait_for_waiters(2 + start + len(batch), 30)
        assert m.http.server.open_connections() == cap
        late = [_open(m.port, peer, shutdown) for peer in strangers[cap - 2 :]]
        held += late
        deadline = time.monotonic() + 20
        while sum(m.http.server.refused.values()) < len(late):  # each made room, or not
            assert time.monotonic() < deadline, m.http.server.refused
            time.sleep(0.01)
        for prestop in (app, sidecar):
            prestop.settimeout(0.2)
            with pytest.raises(TimeoutError):
                prestop.recv(1)  # still waiting: no answer, no close
        for s in late:  # refused at once: every slot holds a parked call
            assert _recv_all(s).startswith(b"HTTP/1.1 503 ")
        a.set(quiesced=True)
        b.set(quiesced=True)
        for prestop in (app, sidecar):
            head, _, body = _recv_all(prestop).partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200 ")
            assert json.loads(body)["outcome"] == "drained"
    finally:
        for s in held:
            s.close()
        m.stop()


def test_the_pods_default_gateway_is_trusted_as_the_nodes_address(tmp_path, daemons):
    """On a bridge CNI the kubelet's probes and preStops come from the bridge's address,
    the pod's default gateway: trusted like --node-ip (never refused, no slot taken)."""
    write_proc(tmp_path, connections=0)
    (tmp_path / "route").write_text(
        "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
        "eth0\t00000000\t0101F40A\t0003\t0\t0\t0\t00000000\t0\t0\t0\n"
    )
    m = manager(tmp_path, [d.url for d in daemons])
    try:
        assert m.http.server.trusted("10.244.1.1")
        assert not m.http.server.trusted("10.244.1.7")  # another pod
    finally:
        m.stop()

"""The shutdown barrier's adapters: /proc/net/tcp(6) parsing on sample text and on this
sandbox's own netns, daemon discovery through a stub resolver, and /v1/quiesced over real
HTTP (ipvsctl's own HTTPServer playing the daemon)."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from ipvsctl.httpd import HTTPServer, as_json, text
from ipvsctl.shutdown.barrier import DaemonReport, Failure
from ipvsctl.shutdown.probes import (
    TCP_ESTABLISHED,
    TCP_LISTEN,
    ConnectionCounter,
    DnsDaemons,
    NameNotFound,
    ProbeError,
    ShutdownProbes,
    StaticDaemons,
    TcpSocket,
    count_established,
    daemon_urls,
    decode_address,
    fetch_quiesced,
    listening_ports,
    merge_lookups,
    normalize_daemon_url,
    parse_proc_net_tcp,
    parse_quiesced,
    query_daemons,
    resolve_addresses,
)

POD, POD6 = "10.244.1.5", "fd00:10:244::5"

# A pod's netns: the app listens on 0.0.0.0:8080 (1F90) and 0.0.0.0:9090 (2382), the
# shutdown-manager on 0.0.0.0:9797 (2645). Two clients are connected to 8080, one to 9090
# is in TIME_WAIT (06), the kubelet's preStop request is connected to 9797, and the app has
# an outgoing connection from ephemeral port 48000 (BB80) to a database on 5432 (1538).
TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 1582 1 00000000974b72f1 100 0 0 10 0
   1: 00000000:2382 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 1583 1 00000000974b72f2 100 0 0 10 0
   2: 00000000:2645 00000000:0000 0A 00000000:00000000 00:00000000 00000000 10001        0 1584 1 00000000974b72f3 100 0 0 10 0
   3: 0501F40A:1F90 0200000A:D431 01 00000000:00000000 02:000AF0A3 00000000  1000        0 2001 2 0000000000000001 20 4 30 10 -1
   4: 0501F40A:1F90 0300000A:D432 01 00000000:00000000 02:000AF0A3 00000000  1000        0 2002 2 0000000000000002 20 4 30 10 -1
   5: 0501F40A:2382 0300000A:D433 06 00000000:00000000 03:00000289 00000000     0        0 0 3 0000000000000003
   6: 0501F40A:2645 010010AC:A000 01 00000000:00000000 00:00000000 00000000 10001        0 2003 1 0000000000000004 20 4 30 10 -1
   7: 0501F40A:BB80 0900000A:1538 01 00000000:00000000 02:000AF0A3 00000000  1000        0 2004 2 0000000000000005 20 4 30 10 -1
garbage line
"""  # noqa: E501 (lines as the kernel writes them)

# IPv6: the app also listens on [::]:8080; one IPv6 client and one IPv4 client seen through
# the dual-stack socket (::ffff:10.0.0.4) are connected to it.
TCP6 = """\
  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000000000000:1F90 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 3001 1 0000000000000006 100 0 0 10 0
   1: 0000FDFD000000000000000005000000:1F90 0000FDFD000000000000000009000000:C350 01 00000000:00000000 02:000AF0A3 00000000  1000        0 3002 2 0000000000000007 20 4 30 10 -1
   2: 0000000000000000FFFF00000501F40A:1F90 0000000000000000FFFF00000400000A:C351 01 00000000:00000000 02:000AF0A3 00000000  1000        0 3003 2 0000000000000008 20 4 30 10 -1
"""  # noqa: E501


def test_addresses_are_decoded_from_host_byte_order_words():
    assert decode_address("0100007F") == "127.0.0.1"
    assert decode_address("0501F40A") == "10.244.1.5"
    assert decode_address("00000000000000000000000001000000") == "::1"
    assert decode_address("0000000000000000FFFF00000501F40A") == "::ffff:10.244.1.5"
    assert decode_address("B80D0120000000000000000001000000") == "2001:db8::1"
    with pytest.raises(ValueError):
        decode_address("0100")


def test_proc_net_tcp_is_parsed():
    sockets = parse_proc_net_tcp(TCP)
    assert len(sockets) == 8  # header and garbage skipped
    assert sockets[3] == TcpSocket("10.244.1.5", 8080, "10.0.0.2", 54321, TCP_ESTABLISHED)
    assert sockets[0] == TcpSocket("0.0.0.0", 8080, "0.0.0.0", 0, TCP_LISTEN)
    assert listening_ports(sockets) == {8080, 9090, 9797}
    six = parse_proc_net_tcp(TCP6)
    assert six[1].local_address == "fdfd::5" and six[1].remote_port == 50000
    assert six[2].remote_address == "::ffff:10.0.0.4"


def test_only_established_connections_on_the_watched_ports_count():
    sockets = parse_proc_net_tcp(TCP) + parse_proc_net_tcp(TCP6)
    assert count_established(sockets, frozenset({8080})) == 4  # 2 over IPv4, 2 over tcp6
    assert count_established(sockets, frozenset({9090})) == 0  # TIME_WAIT is not counted
    assert count_established(sockets, frozenset({5432})) == 0  # outgoing: remote port
    assert count_established(sockets, frozenset({8080, 9797})) == 5


@pytest.fixture
def proc_net(tmp_path: Path) -> Path:
    (tmp_path / "tcp").write_text(TCP)
    (tmp_path / "tcp6").write_text(TCP6)
    return tmp_path


def test_counter_watches_every_listening_port_but_its_own_by_default(proc_net):
    counter = ConnectionCounter(proc_net, exclude=[9797])
    assert counter() == 4  # 8080's four; 9797 (the preStop request itself) left out
    assert ConnectionCounter(proc_net, ports=[9797])() == 1
    # The app closes its listeners (and tcp6 disappears): 8080's connections still count.
    (proc_net / "tcp").write_text(
        "\n".join(line for line in TCP.splitlines() if " 0A " not in line)
    )
    (proc_net / "tcp6").unlink()
    assert counter() == 2


def test_counter_fails_cleanly_without_proc_files(tmp_path):
    with pytest.raises(ProbeError, match="no tcp or tcp6"):
        ConnectionCounter(tmp_path)()
    probes = ShutdownProbes(lambda: [], [POD], ConnectionCounter(tmp_path))
    assert isinstance(probes.count_connections(), Failure)


def test_counter_reads_this_netns_for_real():
    if not Path("/proc/net/tcp").exists():
        pytest.skip("no /proc/net/tcp here")
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    counter = ConnectionCounter(ports=[port])
    try:
        assert counter() == 0
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = server.accept()
        assert counter() == 1  # the server side; the client's local port is ephemeral
        client.close()
        accepted.close()
        assert counter() == 0
    finally:
        server.close()


# --- discovery ----------------------------------------------------------------------------


def test_dns_discovery_turns_a_and_aaaa_records_into_daemon_urls():
    asked = []

    def stub(name: str, port: int) -> list[str]:
        asked.append((name, port))
        return ["192.0.2.2", "192.0.2.1", "2001:db8:0::1", "192.0.2.1"]

    d = DnsDaemons("ipvsctl-metrics.ipvsctl-system.svc.cluster.local", 9796, stub)
    assert d() == ["http://192.0.2.1:9796", "http://192.0.2.2:9796", "http://[2001:db8::1]:9796"]
    assert asked == [("ipvsctl-metrics.ipvsctl-system.svc.cluster.local", 9796)]
    assert str(d) == "dns:ipvsctl-metrics.ipvsctl-system.svc.cluster.local:9796"


def test_dns_discovery_failures_become_probe_failures():
    empty = DnsDaemons("x", 9796, lambda name, port: [])
    with pytest.raises(ProbeError, match="no A/AAAA records"):
        empty()

    def nxdomain(name: str, port: int) -> list[str]:
        raise ProbeError(f"cannot resolve {name}: Name or service not known")

    probes = ShutdownProbes(DnsDaemons("x", 9796, nxdomain), [POD], lambda: 0)
    assert probes.discover() == Failure("cannot resolve x: Name or service not known")


@pytest.mark.parametrize(
    ("lookups", "want"),
    [
        # ipvsctl in its own namespace: kube-system's name does not exist
        ([("own", ["192.0.2.1"]), ("kube-system", NameNotFound("nx"))], ["192.0.2.1"]),
        # the kube-proxy takeover: the other way round
        ([("own", NameNotFound("nx")), ("kube-system", ["192.0.2.2"])], ["192.0.2.2"]),
        # both (a move between them): every daemon of both
        ([("own", ["192.0.2.1"]), ("kube-system", ["192.0.2.2"])], ["192.0.2.1", "192.0.2.2"]),
        # a name that failed otherwise may hide daemons: the round fails, whatever else answered
        ([("own", ["192.0.2.1"]), ("kube-system", ProbeError("timed out"))], "timed out"),
        ([("own", ProbeError("SERVFAIL")), ("kube-system", NameNotFound("nx"))], "SERVFAIL"),
        # no name exists
        (
            [("own", NameNotFound("nx")), ("kube-system", NameNotFound("nx"))],
            "no daemon found: own or kube-system has no A/AAAA records",
        ),
    ],
)
def test_daemons_are_those_of_every_name_that_exists(lookups, want):
    if isinstance(want, list):
        assert merge_lookups(lookups) == want
    else:
        with pytest.raises(ProbeError, match=want):
            merge_lookups(lookups)


def test_the_default_names_find_the_daemons_in_kube_system():
    """The kube-proxy takeover runs the daemons in kube-system: the default lookup finds them
    there (and tells a name that does not exist from a lookup that failed)."""
    from ipvsctl.shutdown import DEFAULT_DAEMON_SERVICES

    records = {"ipvsctl-metrics.kube-system.svc.cluster.local": ["192.0.2.7", "192.0.2.8"]}

    def dns(name: str, port: int) -> list[str]:
        if name not in records:
            raise NameNotFound(f"cannot resolve {name}: Name or service not known")
        return records[name]

    d = DnsDaemons(DEFAULT_DAEMON_SERVICES, 9796, dns)
    assert d() == ["http://192.0.2.7:9796", "http://192.0.2.8:9796"]
    assert "ipvsctl-metrics.ipvsctl-system.svc.cluster.local" in str(d)


def test_the_resolver_tells_a_missing_name_from_a_failed_lookup(monkeypatch):
    def raising(errno: int):
        def getaddrinfo(*args, **kwargs):
            raise socket.gaierror(errno, "stub")

        return getaddrinfo

    monkeypatch.setattr(socket, "getaddrinfo", raising(socket.EAI_NONAME))
    with pytest.raises(NameNotFound):
        resolve_addresses("ipvsctl-metrics.kube-system.svc.cluster.local", 9796)
    monkeypatch.setattr(socket, "getaddrinfo", raising(socket.EAI_AGAIN))
    with pytest.raises(ProbeError) as failed:
        resolve_addresses("ipvsctl-metrics.kube-system.svc.cluster.local", 9796)
    assert not isinstance(failed.value, NameNotFound)


def test_the_system_resolver_answers_for_literal_addresses():
    assert resolve_addresses("127.0.0.1", 9796) == ["127.0.0.1"]
    assert daemon_urls(["fe80::1%eth0"], 1) == ["http://[fe80::1]:1"]


def test_static_daemon_urls_are_normalised():
    assert StaticDaemons(["http://b:1/", "http://a:1", "http://a:1"])() == [
        "http://a:1",
        "http://b:1",
    ]
    assert normalize_daemon_url(" https://[::1]:9796/ ") == "https://[::1]:9796"
    for bad in ("192.0.2.1:9796", "ftp://x", "http://"):
        with pytest.raises(ValueError):
            normalize_daemon_url(bad)
    with pytest.raises(ValueError):
        StaticDaemons([])


# --- asking the daemons -------------------------------------------------------------------


def answer(ip: str, ready: bool = True, quiesced: bool = True, live: int = 0) -> dict:
    return {
        "ip": ip,
        "node": "node-a",
        "ready": ready,
        "quiesced": quiesced,
        "real_servers_with_weight": live,
        "since": None,
        "for_seconds": None,
    }


def test_quiesced_answers_are_parsed():
    assert parse_quiesced(json.dumps(answer(POD)), POD) == DaemonReport(True, True, "node-a")
    r = parse_quiesced(json.dumps(answer(POD, quiesced=False, live=3)), POD)
    assert not r.done and r.real_servers_with_weight == 3
    r = parse_quiesced(json.dumps(answer(POD, ready=False, quiesced=True)), POD)
    assert not r.done and r.why_not == "not ready (no first sync yet)"
    with pytest.raises(ProbeError, match="not JSON"):
        parse_quiesced(b"<html>", POD)
    with pytest.raises(ProbeError, match=r"not 10\.244\.1\.5"):
        parse_quiesced(json.dumps(answer("10.0.0.9")), POD)
    with pytest.raises(ProbeError, match="boolean"):
        parse_quiesced(json.dumps({"ip": POD}), POD)


class FakeDaemon:
    """A daemon's /v1/quiesced on ipvsctl's own HTTP server; `state` is per IP."""

    def __init__(self) -> None:
        self.state: dict[str, dict] = {}
        self.hang = threading.Event()  # set: requests block until `release`
        self.release = threading.Event()
        self.status = 200
        self.http = HTTPServer("127.0.0.1:0", {"/v1/quiesced": self.handle})
        self.url = f"http://127.0.0.1:{self.http.port}"

    def handle(self, q: dict[str, list[str]]) -> tuple[int, str, bytes]:
        if self.hang.is_set():
            self.release.wait(10)
        ip = q["ip"][0]
        if self.status != 200:
            return text(self.status, "unavailable\n")
        return as_json(200, self.state.get(ip, answer(ip)))


@pytest.fixture
def daemon() -> Iterator[FakeDaemon]:
    d = FakeDaemon()
    d.http.start()
    yield d
    d.release.set()
    d.http.stop()


def test_fetch_over_http(daemon):
    assert fetch_quiesced(daemon.url, POD, 2).done
    daemon.state[POD] = answer(POD, quiesced=False, live=1)
    assert fetch_quiesced(daemon.url, POD, 2).why_not == "1 real server with weight > 0"
    daemon.status = 503
    with pytest.raises(ProbeError, match="HTTP 503"):
        fetch_quiesced(daemon.url, POD, 2)


def test_fetch_failures_are_probe_errors(daemon):
    closed = socket.create_server(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    with pytest.raises(ProbeError):
        fetch_quiesced(f"http://127.0.0.1:{port}", POD, 2)
    daemon.hang.set()
    with pytest.raises(ProbeError, match="timed out"):
        fetch_quiesced(daemon.url, POD, 0.2)


def test_query_combines_a_dual_stack_pods_ips_per_daemon(daemon):
    other = FakeDaemon()
    other.http.start()
    try:
        other.state[POD6] = answer(POD6, quiesced=False, live=1)
        probes = ShutdownProbes(StaticDaemons([daemon.url, other.url]), [POD, POD6], lambda: 0)
        answers = probes.query(probes.discover(), 2)  # type: ignore[arg-type]
        assert answers[daemon.url] == DaemonReport(True, True, "node-a", 0)
        assert answers[other.url] == DaemonReport(True, False, "node-a", 1)
    finally:
        other.http.stop()
    # A daemon that is gone is a Failure, not an exception.
    gone = query_daemons([other.url], [POD], 1)
    assert isinstance(gone[other.url], Failure)
    assert query_daemons([], [POD], 1) == {}


ROUTE = (
    "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
    "eth0\t00000000\t0101F40A\t0003\t0\t0\t0\t00000000\t0\t0\t0\n"  # default via 10.244.1.1
    "eth0\t0001F40A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n"  # on-link: no gateway
    "eth0\t00000000\tzz\t0003\t0\t0\t0\t00000000\t0\t0\t0\n"  # malformed: skipped
)
IPV6_ROUTE = (
    "fd000000000000000000000000000000 40 00000000000000000000000000000000 00 "
    "00000000000000000000000000000000 00000100 00000001 00000000 00000001 eth0\n"
    "00000000000000000000000000000000 00 00000000000000000000000000000000 00 "
    "fd000000000000000000000000000001 00000400 00000002 00000000 00000003 eth0\n"
)


def test_default_gateways_are_the_node_as_the_pod_sees_it(tmp_path):
    from ipvsctl.shutdown.probes import default_gateways, parse_default_gateways

    assert parse_default_gateways(ROUTE, IPV6_ROUTE) == {"10.244.1.1", "fd00::1"}
    assert parse_default_gateways("", "") == frozenset()
    (tmp_path / "route").write_text(ROUTE)  # no ipv6_route: an IPv4-only pod
    assert default_gateways(tmp_path) == {"10.244.1.1"}
    assert default_gateways(tmp_path / "missing") == frozenset()

"""Adapters for the shutdown barrier: find the daemons, ask them, count the pod's connections.

Every parser here is a pure function on text (unit-tested on samples); the functions that
do I/O are small and take what they touch as arguments (a resolver function, a timeout, a
/proc/net folder), so tests and the real-kernel lab can point them elsewhere. Foreign errors
(socket.gaierror, urllib's, OSError, bad JSON) become `ProbeError` here and go no further.
"""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.parse
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ipvsctl.httpd import direct_opener
from ipvsctl.model import normalize_ip
from ipvsctl.shutdown.barrier import DaemonAnswer, DaemonReport, Failure

QUIESCED_PATH = "/v1/quiesced"


class ProbeError(Exception):
    """A probe failed; the message says why in a few words."""


# --- finding the daemons ------------------------------------------------------------------


class NameNotFound(ProbeError):
    """The name does not exist, or has no address (NXDOMAIN, NODATA): nothing runs behind
    it. Any other failure (a timeout, SERVFAIL) says nothing about what runs there."""


Resolver = Callable[[str, int], Sequence[str]]

_NOT_FOUND = {socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)}


def resolve_addresses(name: str, port: int) -> list[str]:
    """A and AAAA records of `name`, as addresses (the system resolver, so /etc/resolv.conf's
    search list and ndots apply as for any client in the pod)."""
    try:
        infos = socket.getaddrinfo(name, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        kind = NameNotFound if exc.errno in _NOT_FOUND else ProbeError
        raise kind(f"cannot resolve {name}: {exc}") from None
    except UnicodeError as exc:
        raise ProbeError(f"cannot resolve {name}: {exc}") from None
    return [str(info[4][0]) for info in infos]


def daemon_url(address: str, port: int) -> str:
    """http://ADDRESS:PORT, with IPv6 addresses in brackets (and in compressed form)."""
    ip = normalize_ip(address.split("%", 1)[0])
    return f"http://[{ip}]:{port}" if ":" in ip else f"http://{ip}:{port}"


def daemon_urls(addresses: Iterable[str], port: int) -> list[str]:
    """Sorted, duplicate-free daemon base URLs for resolved addresses."""
    return sorted({daemon_url(a, port) for a in addresses})


Lookup = Sequence[str] | ProbeError
"""One name's lookup: its addresses, or why there are none (NameNotFound: no such name)."""


def merge_lookups(lookups: Sequence[tuple[str, Lookup]]) -> list[str]:
    """The daemons' addresses from the lookups of every name they may be behind (one per
    namespace ipvsctl may run in): the union of the names that exist. A name that does not
    exist is skipped; a lookup that failed otherwise fails the whole round (its daemons may
    exist, and a barrier that forgot them would end early); no address at all fails too.
    Raises ProbeError with the message the barrier logs."""
    found: list[str] = []
    for _, lookup in lookups:
        if isinstance(lookup, ProbeError) and not isinstance(lookup, NameNotFound):
            raise ProbeError(str(lookup))
        if not isinstance(lookup, ProbeError):
            found.extend(lookup)
    if not found:
        names = " or ".join(name for name, _ in lookups)
        raise ProbeError(f"no daemon found: {names} has no A/AAAA records")
    return found


class DnsDaemons:
    """The daemons behind headless Services: one A/AAAA record per ready daemon pod (or
    every daemon pod with `publishNotReadyAddresses: true`), under any of `names` (the
    namespaces ipvsctl may run in; merge_lookups). Looked up again each round, so nodes that
    come and go during a shutdown are followed."""

    def __init__(
        self, names: str | Sequence[str], port: int, resolve: Resolver = resolve_addresses
    ) -> None:
        self.names = (names,) if isinstance(names, str) else tuple(dict.fromkeys(names))
        if not self.names:
            raise ValueError("at least one daemon service name is needed")
        self.port, self.resolve = port, resolve

    def _lookup(self, name: str) -> Lookup:
        try:
            addresses = self.resolve(name, self.port)
        except ProbeError as exc:
            return exc
        return addresses if addresses else NameNotFound(f"{name} has no A/AAAA records")

    def __call__(self) -> list[str]:
        return daemon_urls(merge_lookups([(n, self._lookup(n)) for n in self.names]), self.port)

    def __str__(self) -> str:
        return "dns:" + ",".join(self.names) + f":{self.port}"


class StaticDaemons:
    """A fixed list of daemon base URLs (--daemon), for tests and unusual set-ups."""

    def __init__(self, urls: Sequence[str]) -> None:
        if not urls:
            raise ValueError("at least one daemon URL is needed")
        self.urls = sorted({normalize_daemon_url(u) for u in urls})

    def __call__(self) -> list[str]:
        return list(self.urls)

    def __str__(self) -> str:
        return "static:" + ",".join(self.urls)


def normalize_daemon_url(url: str) -> str:
    """`http://host:port` without a trailing slash; ValueError if it is not an http(s) URL."""
    parts = urllib.parse.urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"{url!r} is not an http:// or https:// URL")
    return f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}"


# --- asking them --------------------------------------------------------------------------


def parse_quiesced(body: bytes | str, ip: str) -> DaemonReport:
    """A daemon's /v1/quiesced answer for `ip` (daemon/status_json.py's quiesced_json)."""
    try:
        doc = json.loads(body)
    except ValueError:
        raise ProbeError("answer is not JSON") from None
    if not isinstance(doc, dict):
        raise ProbeError("answer is not a JSON object")
    if doc.get("ip") != ip:
        raise ProbeError(f"answer is about {doc.get('ip')!r}, not {ip}")
    ready, quiesced = doc.get("ready"), doc.get("quiesced")
    if not isinstance(ready, bool) or not isinstance(quiesced, bool):
        raise ProbeError("answer lacks boolean 'ready'/'quiesced'")
    live = doc.get("real_servers_with_weight", 0)
    return DaemonReport(
        ready=ready,
        quiesced=ready and quiesced,
        node=str(doc.get("node") or ""),
        real_servers_with_weight=live if isinstance(live, int) else 0,
    )


def combine(reports: Sequence[DaemonReport]) -> DaemonReport:
    """One daemon's answers for each of the pod's IPs (dual-stack) as one: quiesced if every
    IP is."""
    return DaemonReport(
        ready=all(r.ready for r in reports),
        quiesced=all(r.quiesced for r in reports),
        node=next((r.node for r in reports if r.node), ""),
        real_servers_with_weight=sum(r.real_servers_with_weight for r in reports),
    )


def fetch_quiesced(base_url: str, ip: str, timeout: float) -> DaemonReport:
    url = f"{base_url}{QUIESCED_PATH}?{urllib.parse.urlencode({'ip': ip})}"
    try:
        with direct_opener().open(url, timeout=timeout) as resp:
            return parse_quiesced(resp.read(), ip)
    except urllib.error.HTTPError as exc:
        raise ProbeError(f"HTTP {exc.code}") from None
    except urllib.error.URLError as exc:
        raise ProbeError(str(exc.reason)) from None
    except (OSError, ValueError) as exc:  # timeouts, resets, bad status lines
        raise ProbeError(str(exc) or type(exc).__name__) from None


Fetch = Callable[[str, str, float], DaemonReport]


def query_daemons(
    daemons: Sequence[str],
    ips: Sequence[str],
    timeout: float,
    fetch: Fetch = fetch_quiesced,
    workers: int = 32,
) -> dict[str, DaemonAnswer]:
    """Ask every daemon about every IP, in parallel; each answer within `timeout`."""

    def one(daemon: str) -> DaemonAnswer:
        try:
            return combine([fetch(daemon, ip, timeout) for ip in ips])
        except ProbeError as exc:
            return Failure(str(exc))

    if not daemons:
        return {}
    with ThreadPoolExecutor(
        max_workers=max(1, min(workers, len(daemons))), thread_name_prefix="quiesced"
    ) as pool:
        return dict(zip(daemons, pool.map(one, daemons), strict=True))


# --- the pod's own connections ------------------------------------------------------------

TCP_ESTABLISHED = 0x01
TCP_LISTEN = 0x0A


@dataclass(frozen=True, slots=True)
class TcpSocket:
    local_address: str
    local_port: int
    remote_address: str
    remote_port: int
    state: int


def decode_address(hex_address: str) -> str:
    """/proc/net/tcp{,6}'s address: 32-bit words in host (little-endian) byte order."""
    raw = bytes.fromhex(hex_address)
    if len(raw) not in (4, 16):
        raise ValueError(f"bad address {hex_address!r}")
    host_order = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    family = socket.AF_INET if len(raw) == 4 else socket.AF_INET6
    return socket.inet_ntop(family, host_order)


def parse_proc_net_tcp(text: str) -> list[TcpSocket]:
    """The sockets in a /proc/net/tcp or /proc/net/tcp6 text; malformed lines are skipped."""
    sockets = []
    for line in text.splitlines()[1:]:
        cols = line.split()
        if len(cols) < 4 or not cols[0].endswith(":"):
            continue
        try:
            local, lport = cols[1].rsplit(":", 1)
            remote, rport = cols[2].rsplit(":", 1)
            sockets.append(
                TcpSocket(
                    decode_address(local),
                    int(lport, 16),
                    decode_address(remote),
                    int(rport, 16),
                    int(cols[3], 16),
                )
            )
        except ValueError:
            continue
    return sockets


def listening_ports(sockets: Iterable[TcpSocket]) -> frozenset[int]:
    return frozenset(s.local_port for s in sockets if s.state == TCP_LISTEN)


def count_established(sockets: Iterable[TcpSocket], ports: frozenset[int]) -> int:
    """Established connections whose local port is one of `ports` (connections to the pod's
    servers; the pod's own outgoing connections have ephemeral local ports)."""
    return sum(1 for s in sockets if s.state == TCP_ESTABLISHED and s.local_port in ports)


class ConnectionCounter:
    """Counts the pod's established connections on the watched ports, read from the
    network namespace's /proc/net/tcp and tcp6 (a sidecar shares the pod's netns).

    `ports` empty: every port something listens on, as seen on any read so far (a server
    that closed its listener still has its connections counted), less `exclude` (the
    shutdown-manager's own port: the kubelet's preStop request is a connection to it).
    """

    FILES = ("tcp", "tcp6")

    def __init__(
        self,
        proc_net: str | Path = "/proc/net",
        ports: Iterable[int] = (),
        exclude: Iterable[int] = (),
    ) -> None:
        self.proc_net = Path(proc_net)
        self.ports = frozenset(ports)
        self.exclude = frozenset(exclude)
        self.seen_listening: frozenset[int] = frozenset()

    def read(self) -> list[TcpSocket]:
        sockets: list[TcpSocket] = []
        readable = 0
        errors = []
        for name in self.FILES:
            try:
                text = (self.proc_net / name).read_text()
            except FileNotFoundError:
                continue  # no IPv6 in this kernel or netns
            except OSError as exc:
                errors.append(f"{self.proc_net / name}: {exc.strerror or exc}")
                continue
            readable += 1
            sockets.extend(parse_proc_net_tcp(text))
        if errors or not readable:
            raise ProbeError("; ".join(errors) or f"no tcp or tcp6 in {self.proc_net}")
        return sockets

    def watched(self, sockets: Sequence[TcpSocket]) -> frozenset[int]:
        if self.ports:
            return self.ports
        self.seen_listening |= listening_ports(sockets)
        return self.seen_listening - self.exclude

    def __call__(self) -> int:
        sockets = self.read()
        return count_established(sockets, self.watched(sockets))


# --- everything the runner needs ----------------------------------------------------------


class ShutdownProbes:
    """The probes a runner uses: daemon discovery, daemon queries, connection counts."""

    def __init__(
        self,
        daemons: Callable[[], list[str]],
        pod_ips: Sequence[str],
        connections: Callable[[], int],
        fetch: Fetch = fetch_quiesced,
    ) -> None:
        self.daemons = daemons
        self.pod_ips = tuple(pod_ips)
        self.connections = connections
        self.fetch = fetch

    def discover(self) -> list[str] | Failure:
        try:
            return self.daemons()
        except ProbeError as exc:
            return Failure(str(exc))

    def query(self, daemons: Sequence[str], timeout: float) -> dict[str, DaemonAnswer]:
        return query_daemons(daemons, self.pod_ips, timeout, self.fetch)

    def count_connections(self) -> int | Failure:
        try:
            return self.connections()
        except ProbeError as exc:
            return Failure(str(exc))


def parse_default_gateways(route: str, ipv6_route: str) -> frozenset[str]:
    """The default routes' gateways in /proc/net/route (IPv4: little-endian hex words) and
    /proc/net/ipv6_route (IPv6: plain hex); malformed lines are skipped. In a pod, these are
    the node as the pod sees it: with a bridge CNI the bridge's address, from which the
    kubelet's probes and preStops come."""
    found: set[str] = set()
    for line in route.splitlines()[1:]:
        cols = line.split()
        if len(cols) < 8 or cols[1] != "00000000" or cols[7] != "00000000":
            continue
        try:
            gateway = decode_address(cols[2])
        except ValueError:
            continue
        if gateway != "0.0.0.0":
            found.add(gateway)
    for line in ipv6_route.splitlines():
        cols = line.split()
        if len(cols) < 5 or cols[0] != "0" * 32 or cols[1] != "00":
            continue
        try:
            raw = bytes.fromhex(cols[4])
            gateway = socket.inet_ntop(socket.AF_INET6, raw) if len(raw) == 16 else "::"
        except ValueError:
            continue
        if gateway != "::":
            found.add(gateway)
    return frozenset(found)


def default_gateways(proc_net: str | Path = "/proc/net") -> frozenset[str]:
    """parse_default_gateways of this network namespace's route files (one that cannot be
    read counts as having none)."""
    texts = []
    for name in ("route", "ipv6_route"):
        try:
            texts.append((Path(proc_net) / name).read_text())
        except OSError:
            texts.append("")
    return parse_default_gateways(*texts)

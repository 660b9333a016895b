"""Building blocks for real-kernel tests: a node (network namespace with a NetlinkKernel in
it), pods (namespaces joined to the node by veth, with small TCP/UDP/SCTP servers that say
which pod answered), clients that open, hold and close connections, and `wait_for`.

How namespaces are entered:
- pyroute2 objects belong to the netns their socket was opened in. `NetlinkKernel(netns=N)`
  passes `netns=N, flags=0` to pyroute2, which forks a child that enters /run/netns/N, opens
  the netlink socket and hands it back; everything after that runs in our process.
- Plain sockets (servers, clients) are opened by `ipvsctl.kernel.netns.run_in_netns`: a short
  thread setns()es into the namespace, creates the socket and ends. setns(CLONE_NEWNET)
  changes only that thread, and a socket stays in its namespace for life, so servers and
  clients all live in the test process: no subprocess (a Python start costs seconds in the
  emulated guest).
- Commands (`ip`, `ipvsadm`, `conntrack`, `nft`, `sysctl`) run with `ip netns exec`/`ip -n`;
  they are the independent witnesses of what the kernel holds.

Closing connections: IPVS keeps a closed TCP connection as InActConn for 2 minutes
(TIME_WAIT; `--ipvs-tcpfin-timeout` only shortens FIN_WAIT, which a normal close passes
through at once). A connection closed with a reset (`Connection.abort()`,
`request(..., reset=True)`) stays 10 s (CLOSE): drain tests that wait for a real server's
counts to reach zero close every connection to it that way.

Routing (NOTES §6): the pod address is a /32 (/128) on the pod's eth0 with a default route
via 169.254.1.1 (fe80::1); the node side of the veth holds 169.254.1.1/32 (fe80::1/64) and a
host route to the pod.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import os
import re
import signal
import socket
import struct
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ipvsctl.daemon.options import DrainOptions, HTTPOptions
from ipvsctl.kernel.netlink import NetlinkKernel
from ipvsctl.kernel.netns import run_in_netns
from ipvsctl.kernel.wrappers import RecordingKernel as RecordingKernel  # for the lab tests

T = TypeVar("T")

IPPROTO_SCTP = 132
NODE_GW4 = "169.254.1.1"
NODE_GW6 = "fe80::1"
_names = itertools.count(1)


# --- commands and waiting -------------------------------------------------------------------
def sh(
    *argv: str,
    netns: str | None = None,
    check: bool = True,
    stdin: str | None = None,
    timeout: float = 120,
) -> str:
    """Run a command (inside `netns` if given); its stdout. Raises with stderr on failure."""
    cmd = ["ip", "netns", "exec", netns, *argv] if netns else list(argv)
    r = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} -> {r.returncode}: {r.stderr.strip()}")
    return r.stdout


def wait_for(
    predicate: Callable[[], T],
    timeout: float = 60.0,
    interval: float = 0.25,
    what: str = "condition",
) -> T:
    """Poll until predicate() is truthy and return its value. Generous default: the guest is
    emulated and ~15x slower than the host; never use this to assert a duration."""
    deadline = time.monotonic() + timeout
    last: T = predicate()
    while not last:
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")
        time.sleep(interval)
        last = predicate()
    return last


def http_get(url: str, netns: str | None = None, timeout: float = 30.0) -> tuple[int, str]:
    """GET url from inside `netns` (the socket is opened there); (status, body). Connection
    errors are raised; HTTP errors are returned like any status."""

    def get() -> tuple[int, str]:
        try:
            with urllib.request.urlopen(url, timeout=timeout) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    return run_in_netns(netns, get)


def http_json(url: str, netns: str | None = None, timeout: float = 30.0) -> Any:
    code, body = http_get(url, netns, timeout)
    assert code == 200, f"GET {url} -> {code}: {body}"
    return json.loads(body)


def _family(address: str) -> int:
    return socket.AF_INET6 if ":" in address else socket.AF_INET


# --- witnesses ------------------------------------------------------------------------------
@dataclass(frozen=True)
class IpvsadmRealServer:
    forward: str
    weight: int
    active: int
    inactive: int


@dataclass
class IpvsadmService:
    scheduler: str
    flags: str
    real_servers: dict[str, IpvsadmRealServer] = field(default_factory=dict)


_VS_LINE = re.compile(r"^(TCP|UDP|SCTP)\s+(\S+)\s+(\S+)\s*(.*)$")
_RS_LINE = re.compile(r"^\s+->\s+(\S+)\s+(\S+)\s+(\d+)\s+(\d+)\s+(\d+)")


def parse_ipvsadm(text: str) -> dict[str, IpvsadmService]:
    """`ipvsadm -Ln` as {"10.96.0.10:80/TCP": IpvsadmService} with real servers keyed
    "10.244.0.1:8080" ("[fd00::1]:8080"): the same spelling as str(ServiceKey/RealServerKey)."""
    out: dict[str, IpvsadmService] = {}
    current: IpvsadmService | None = None
    for line in text.splitlines():
        if m := _VS_LINE.match(line):
            current = out[f"{m.group(2)}/{m.group(1)}"] = IpvsadmService(
                m.group(3), m.group(4).strip()
            )
        elif (m := _RS_LINE.match(line)) and current is not None:
            current.real_servers[m.group(1)] = IpvsadmRealServer(
                m.group(2), int(m.group(3)), int(m.group(4)), int(m.group(5))
            )
    return out


# --- namespaces -----------------------------------------------------------------------------
class Netns:
    """A named network namespace (`ip netns add`) with loopback up."""

    def __init__(self, name: str) -> None:
        self.name = name
        sh("ip", "netns", "add", name)
        sh("ip", "-n", name, "link", "set", "lo", "up")

    def run(self, *argv: str, check: bool = True) -> str:
        return sh(*argv, netns=self.name, check=check)

    def ip_batch(self, commands: list[str]) -> None:
        """Several `ip` commands in one process (each exec costs ~0.2 s in the guest)."""
        sh("ip", "-n", self.name, "-batch", "-", stdin="\n".join(commands) + "\n")

    def socket(self, family: int, type: int, proto: int = 0) -> socket.socket:
        return run_in_netns(self.name, lambda: socket.socket(family, type, proto))

    def sysctl(self, name: str, value: str | None = None) -> str:
        path = "/proc/sys/" + name.replace(".", "/")

        def rw() -> str:
            if value is not None:
                with open(path, "w") as f:
                    f.write(value)
            with open(path) as f:
                return f.read().strip()

        return run_in_netns(self.name, rw)

    def delete(self) -> None:
        sh("ip", "netns", "del", self.name, check=False)


# --- servers --------------------------------------------------------------------------------
class _Server:
    """Answers in a pod: TCP/SCTP send "<pod>\\n" on accept then echo lines until the peer
    closes; UDP replies "<pod>" to each datagram. One dual-stack socket serves v4 and v6.
    With `report_peer` the answer is "<pod> <peer address>", so tests can check what
    masquerading did to the source address."""

    def __init__(self, pod: Pod, proto: str, port: int, report_peer: bool = False) -> None:
        self.pod, self.proto, self.port = pod, proto, port
        self.report_peer = report_peer
        self.stop = threading.Event()
        self.connections: set[socket.socket] = set()
        self.accepted = 0
        self.lock = threading.Lock()
        kind, number = {
            "tcp": (socket.SOCK_STREAM, 0),
            "udp": (socket.SOCK_DGRAM, 0),
            "sctp": (socket.SOCK_STREAM, IPPROTO_SCTP),
        }[proto]
        s = pod.netns.socket(socket.AF_INET6, kind, number)
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("::", port))
        if kind == socket.SOCK_STREAM:
            s.listen(64)
        s.settimeout(0.5)
        self.sock = s
        target = self._serve_dgram if proto == "udp" else self._serve_stream
        self.thread = threading.Thread(
            target=target, daemon=True, name=f"{pod.name}-{proto}-{port}"
        )
        self.thread.start()

    def _answer(self, peer: str) -> bytes:
        if not self.report_peer:
            return self.pod.name.encode()
        peer = peer.removeprefix("::ffff:")  # a v4 client on the dual-stack socket
        return f"{self.pod.name} {peer}".encode()

    def _serve_dgram(self) -> None:
        while not self.stop.is_set():
            try:
                _data, peer = self.sock.recvfrom(2048)
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted += 1
            self.sock.sendto(self._answer(peer[0]), peer)

    def _serve_stream(self) -> None:
        while not self.stop.is_set():
            try:
                conn, peer = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self.lock:
                self.accepted += 1
                self.connections.add(conn)
            threading.Thread(target=self._echo, args=(conn, peer[0]), daemon=True).start()

    def _echo(self, conn: socket.socket, peer: str) -> None:
        try:
            conn.sendall(self._answer(peer) + b"\n")
            while True:
                data = conn.recv(4096)
                if not data:
                    break
                conn.sendall(data)
        except OSError:
            pass
        finally:
            with self.lock:
                self.connections.discard(conn)
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self.sock.close()
        with self.lock:
            conns = list(self.connections)
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)


class Pod:
    """A network namespace joined to the node by a veth pair, with servers in it."""

    def __init__(self, node: Node, name: str, ip: str, ip6: str | None, index: int) -> None:
        self.node, self.name, self.ip, self.ip6 = node, name, ip, ip6
        self.netns = Netns(f"{node.name}-{name}")
        self.host_if = f"veth{index}"
        self.servers: list[_Server] = []
        self._holder: subprocess.Popen[bytes] | None = None
        sh(
            "ip",
            "-n",
            node.name,
            "link",
            "add",
            self.host_if,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            self.netns.name,
        )
        pod_cmds = [
            f"addr add {ip}/32 dev eth0",
            "link set eth0 up",
            f"route add {NODE_GW4} dev eth0",
            f"route add default via {NODE_GW4} dev eth0",
        ]
        node_cmds = [
            f"addr add {NODE_GW4}/32 dev {self.host_if}",
            f"link set {self.host_if} up",
            f"route add {ip}/32 dev {self.host_if}",
        ]
        if ip6:
            pod_cmds[1:1] = [f"addr add {ip6}/128 dev eth0 nodad"]
            pod_cmds.append(f"route add default via {NODE_GW6} dev eth0")
            node_cmds[1:1] = [f"addr add {NODE_GW6}/64 dev {self.host_if} nodad"]
            node_cmds.append(f"route add {ip6}/128 dev {self.host_if}")
        self.netns.ip_batch(pod_cmds)
        node.netns.ip_batch(node_cmds)

    def address(self, family: int = 4) -> str:
        if family == 6:
            assert self.ip6, f"pod {self.name} has no IPv6 address"
            return self.ip6
        return self.ip

    def serve(self, proto: str, port: int, report_peer: bool = False) -> _Server:
        server = _Server(self, proto, port, report_peer)
        self.servers.append(server)
        return server

    def open_connections(self) -> int:
        return sum(len(s.connections) for s in self.servers)

    def proc_net(self) -> str:
        """/proc/PID/net of a process that lives in this pod's netns (a `sleep`, started
        on first use): the pod's own /proc/net, as a sidecar in the pod sees it."""
        if self._holder is None:
            self._holder = subprocess.Popen(
                ["ip", "netns", "exec", self.netns.name, "sleep", "infinity"]
            )
            pid = self._holder.pid
            own = os.readlink("/proc/self/ns/net")
            # `ip netns exec` enters the netns, then execs sleep in the same process
            wait_for(
                lambda: (
                    os.readlink(f"/proc/{pid}/ns/net") != own
                    and os.readlink(f"/proc/{pid}/exe").endswith("sleep")
                ),
                timeout=60,
                interval=0.05,
                what="netns holder process",
            )
        return f"/proc/{self._holder.pid}/net"

    # client side: any pod can be a client
    def connect(
        self, address: str, port: int, proto: str = "tcp", timeout: float = 20.0
    ) -> Connection:
        return open_connection(self.netns, address, port, proto, timeout)

    def request(self, address: str, port: int, proto: str = "tcp", reset: bool = False) -> str:
        """Connect, read which pod answered, close (with a reset if `reset`: the IPVS entry
        then lasts 10 s instead of TIME_WAIT's 2 minutes)."""
        conn = self.connect(address, port, proto)
        try:
            return conn.pod
        finally:
            if reset:
                conn.abort()
            else:
                conn.close()

    def udp_socket(self, family: int = 4) -> socket.socket:
        s = self.netns.socket(socket.AF_INET6 if family == 6 else socket.AF_INET, socket.SOCK_DGRAM)
        s.bind(("::" if family == 6 else "0.0.0.0", 0))
        return s

    def udp(
        self, address: str, port: int, sock: socket.socket | None = None, timeout: float = 3.0
    ) -> str | None:
        """Send one datagram (from `sock`, to keep a fixed source port) and return which pod
        answered, or None if nothing came back in time (UDP can be dropped: retry)."""
        own = sock is None
        s = sock or self.udp_socket(6 if ":" in address else 4)
        try:
            s.settimeout(timeout)
            s.sendto(b"ping", (address, port))
            data, _ = s.recvfrom(2048)
            return data.decode()
        except TimeoutError:
            return None
        finally:
            if own:
                s.close()

    def close(self) -> None:
        for server in self.servers:
            server.close()
        if self._holder is not None:
            self._holder.send_signal(signal.SIGKILL)
            self._holder.wait()
        self.netns.delete()


class Connection:
    """A client connection held open until closed."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.pod = ""
        self._buf = b""

    def readline(self) -> str:
        while b"\n" not in self._buf:
            data = self.sock.recv(4096)
            if not data:
                raise ConnectionError("closed by peer")
            self._buf += data
        line, _, self._buf = self._buf.partition(b"\n")
        return line.decode()

    def echo(self, text: str = "ping") -> bool:
        """Whether the connection still works end to end (the pod echoes a line)."""
        try:
            self.sock.sendall(text.encode() + b"\n")
            return self.readline() == text
        except OSError:
            return False

    def close(self) -> None:
        self.sock.close()

    def abort(self) -> None:
        """Close with a reset (SO_LINGER 0): IPVS moves the connection to CLOSE (10 s)
        instead of TIME_WAIT (2 minutes), so a drain can see its counts reach zero soon."""
        with contextlib.suppress(OSError):
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --- the node -------------------------------------------------------------------------------
_CONNTRACK_RULES = """\
table inet ipvsctl_lab {
    chain pre { type filter hook prerouting priority 0; ct state new counter; }
    chain out { type filter hook output priority 0; ct state new counter; }
}
"""


def open_connection(
    netns: Netns, address: str, port: int, proto: str = "tcp", timeout: float = 20.0
) -> Connection:
    """Open a TCP or SCTP connection from `netns` and read the greeting: the answering
    pod's name (for pods and for clients that are not pods)."""
    number = IPPROTO_SCTP if proto == "sctp" else 0
    s = netns.socket(_family(address), socket.SOCK_STREAM, number)
    s.settimeout(timeout)
    try:
        s.connect((address, port))
        conn = Connection(s)
        conn.pod = conn.readline()
    except BaseException:
        s.close()
        raise
    return conn


class Node:
    """A fresh network namespace standing for one node: its own IPVS table, sysctls and
    conntrack, a NetlinkKernel bound to it (`kernel`), and pods hanging off it."""

    def __init__(
        self, interface: str = "kube-ipvs0", conntrack: bool = True, kernel: bool = True
    ) -> None:
        self.name = f"lab{next(_names)}"
        self.netns = Netns(self.name)
        self.pods: list[Pod] = []
        self.netns.sysctl("net.ipv4.ip_forward", "1")
        self.netns.sysctl("net.ipv6.conf.all.forwarding", "1")
        if conntrack:
            # conntrack hooks exist in a netns only once a rule needs them (on a real node,
            # kube-proxy's or the CNI's); without one there are no entries to flush
            sh("nft", "-f", "-", netns=self.name, stdin=_CONNTRACK_RULES)
        # kernel=False: a node whose table a daemon process programs (the cluster lab);
        # the witnesses below (ipvsadm, conntrack) still work
        self.kernel = NetlinkKernel(interface, netns=self.name) if kernel else None

    def make_pod(
        self,
        ip: str,
        ip6: str | None = None,
        name: str | None = None,
        tcp: tuple[int, ...] = (8080,),
        udp: tuple[int, ...] = (),
        sctp: tuple[int, ...] = (),
    ) -> Pod:
        pod = Pod(self, name or f"pod{len(self.pods) + 1}", ip, ip6, len(self.pods))
        self.pods.append(pod)
        for port in tcp:
            pod.serve("tcp", port)
        for port in udp:
            pod.serve("udp", port)
        for port in sctp:
            pod.serve("sctp", port)
        return pod

    def make_client(
        self, ip: str = "10.0.0.100", ip6: str | None = "fd01::100", name: str = "client"
    ) -> Pod:
        """A pod without servers, to send traffic to virtual servers from outside the node."""
        return self.make_pod(ip, ip6, name=name, tcp=())

    def run(self, *argv: str, check: bool = True) -> str:
        return self.netns.run(*argv, check=check)

    def ipvsadm(self) -> dict[str, IpvsadmService]:
        return parse_ipvsadm(self.run("ipvsadm", "-Ln"))

    def ipvs_connections(self) -> list[tuple[str, str, str, str, str]]:
        """`ipvsadm -Lnc`: IPVS's connection entries as (protocol, state, client, virtual,
        real server), e.g. ("TCP", "TIME_WAIT", "10.0.0.100:40000", "10.96.0.10:80",
        "10.244.1.1:8080")."""
        rows = []
        for line in self.run("ipvsadm", "-Lnc").splitlines():
            cols = line.split()
            if len(cols) == 6 and cols[0] in ("TCP", "UDP", "SCTP"):
                rows.append((cols[0], cols[2], cols[3], cols[4], cols[5]))
        return rows

    def conntrack(self, *args: str) -> str:
        """`conntrack -L ARGS` in the node (the entries, one per line; no summary)."""
        out = sh("conntrack", "-L", *args, netns=self.name, check=False)
        return "\n".join(line for line in out.splitlines() if "flow entries" not in line)

    def interface_addresses(self, interface: str = "kube-ipvs0") -> set[str]:
        out = self.run("ip", "-o", "addr", "show", "dev", interface)
        return {line.split()[3].split("/")[0] for line in out.splitlines()}

    def close(self) -> None:
        if self.kernel is not None:
            self.kernel.close()
        for pod in self.pods:
            pod.close()
        self.netns.delete()


# --- the daemon, in-process -----------------------------------------------------------------
def start_daemon(
    node: Node,
    source: Any,
    state_dir: str,
    *,
    kernel: Any = None,
    drain_timeout: float = 600.0,
    service_drain_timeout: float = 600.0,
    drain_check_interval: float = 0.1,
    node_name: str = "node-a",
    node_ips: tuple[str, ...] = ("192.0.2.10",),
    metrics: Any = None,
    conntrack: Any = None,
    events: bool = False,
    real_ownership: bool = False,
    max_table_entries: int | None = None,
) -> Any:
    """A started `Daemon` (ipvsctl.daemon.wiring) programming `node.kernel` (or `kernel`)
    from `source`. Its HTTP server is bound in the node's netns (0.0.0.0, a free port):
    pods reach it at 169.254.1.1, tests with `daemon_get(node, daemon, path)`. The loop and
    source threads run in the test process's own netns (a fake API server on its 127.0.0.1
    is reachable). `conntrack`: the table the stale-entry sweep works on (None: no sweep).
    `events`: write Events through the source's API client, as `ipvsctl run` does.
    `real_ownership`: which virtual servers are ours and which may be taken over, as
    `ipvsctl run` decides (its interface's and the proxy interfaces' addresses, read in the
    node); else every one (the defaults of an in-process Daemon). The caller shuts it down
    (the `make_daemon` fixture does)."""
    from ipvsctl.daemon.adapters import open_event_writer
    from ipvsctl.daemon.options import DaemonOptions
    from ipvsctl.daemon.wiring import Daemon
    from ipvsctl.model import NodeContext
    from ipvsctl.obs.metrics import Metrics
    from ipvsctl.reconcile.loop import LoopConfig

    node_context = NodeContext(node_name, node_ips)
    if max_table_entries is not None:  # `run --max-table-entries`
        node_context = dataclasses.replace(node_context, max_table_entries=max_table_entries)
    opts = DaemonOptions(
        node=node_context,
        drain=DrainOptions(
            state_dir=state_dir,
            timeout=drain_timeout,
            service_timeout=service_drain_timeout,
            check_interval=drain_check_interval,
        ),
        http=HTTPOptions(listen="0.0.0.0:0"),
    )
    metrics = metrics if metrics is not None else Metrics()
    writer = open_event_writer(opts, source, metrics) if events else None
    ownership: dict[str, Any] = {}
    if real_ownership:
        from ipvsctl.kernel.netlink import interface_addresses
        from ipvsctl.plan.ownership import is_owned, may_take_over

        bound = set(node.kernel.bound_addresses())
        proxies = bound | set(run_in_netns(node.name, interface_addresses))

        def owned(key: Any) -> bool:
            return is_owned(key, bound, node_ips)

        ownership = {
            "owned": owned,
            "may_take_over": lambda key: may_take_over(key, owned(key), proxies),
        }
    daemon = run_in_netns(
        node.name,
        lambda: Daemon(
            opts,
            kernel if kernel is not None else node.kernel,
            source,
            metrics=metrics,
            conntrack=conntrack,
            event_writer=writer,
            **ownership,
            loop_config=LoopConfig(
                drain_check_interval=drain_check_interval, audit_interval=0.5, idle_wakeup=0.1
            ),
        ),
    )
    daemon.start()
    return daemon


def daemon_get(node: Node, daemon: Any, path: str) -> tuple[int, str]:
    return http_get(f"http://127.0.0.1:{daemon.http.port}{path}", node.name)


def daemon_url_from_pods(daemon: Any) -> str:
    """The daemon's base URL as a pod on its node reaches it (the veth gateway)."""
    return f"http://{NODE_GW4}:{daemon.http.port}"

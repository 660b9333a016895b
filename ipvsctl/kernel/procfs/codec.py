"""Pure codecs for IPVS's /proc files: `/proc/net/ip_vs` (every virtual and real server with
its connection counts, one read) and `/proc/net/ip_vs_conn` (one line per connection).

No I/O here: the readers in `procfs/ipvs.py` stream the files' lines in. Formats, from
the kernel's `ip_vs_ctl.c` ip_vs_info_seq_show and `ip_vs_conn.c` ip_vs_conn_seq_show:

    /proc/net/ip_vs (addresses and ports in upper-case hex, IPv6 as full %pI6 in brackets)
    IP Virtual Server version 1.2.1 (size=4096)
    Prot LocalAddress:Port Scheduler Flags
      -> RemoteAddress:Port Forward Weight ActiveConn InActConn
    TCP  0A60000A:0050 rr
      -> 0AF40105:1F90      Masq    1      0          0

    /proc/net/ip_vs_conn ("%-3s %08X %04X %08X %04X %s %04X %-11s %7u%s": IPv4 in hex,
    IPv6 as full lower-case %pI6, e.g. fd00:0000:0000:0000:0000:0000:0000:0001)
    Pro FromIP   FPrt ToIP     TPrt DestIP   DPrt State       Expires PEName PEData
    TCP 0A000064 9C40 0A60000A 0050 0AF40105 1F90 TIME_WAIT       118

Persistence templates have client port 0 (FPrt 0000, state NONE or ASSURED): they are no
connection. Every line is hostile input: anything that does not parse is skipped and
counted, and a line that names a wanted real server but cannot be read holds its drain.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

from ipvsctl.model import (
    ConnCounts,
    ConnKey,
    ConnScan,
    Protocol,
    RealServerKey,
    RealServerStatus,
    ServiceKey,
)

# TCP states (ip_vs_proto_tcp.c tcp_state_name_table) that carry no more data.
CLOSED_STATES = frozenset({"TIME_WAIT", "CLOSE"})
ESTABLISHED = "ESTABLISHED"
PROTOCOLS = {p.value: p for p in Protocol}

_HEX8 = re.compile(r"[0-9A-Fa-f]{8}")
_HEX4 = re.compile(r"[0-9A-Fa-f]{4}")


# --- addresses as the kernel prints them --------------------------------------------
def kernel_address(address: str) -> str:
    """An address as ip_vs_conn prints it: IPv4 as %08X, IPv6 as full lower-case %pI6."""
    ip = ipaddress.ip_address(address)
    if ip.version == 4:
        return f"{int(ip):08X}"
    return ip.exploded


def _address(text: str) -> str:
    """Back from the kernel's text (hex IPv4, or IPv6 with or without brackets) to the
    compressed form model keys use. ValueError on anything else."""
    text = text.strip("[]")
    if ":" in text:
        return ipaddress.IPv6Address(text).compressed
    if _HEX8.fullmatch(text) is None:  # int(_, 16) alone takes "+0x1", " 1_0"...
        raise ValueError(f"not a hex IPv4 address: {text!r}")
    n = int(text, 16)  # no ipaddress here: 5x faster on a 100,000-line table
    return f"{n >> 24}.{(n >> 16) & 255}.{(n >> 8) & 255}.{n & 255}"


def _port(text: str) -> int:
    if _HEX4.fullmatch(text) is None:
        raise ValueError(f"not a hex port: {text!r}")
    port = int(text, 16)
    if not 0 <= port <= 0xFFFF:
        raise ValueError(f"port out of range: {text!r}")
    return port


def dest_token(rs: RealServerKey) -> str:
    """`DestIP DPrt` exactly as a canonical ip_vs_conn line holds them: the cheap match."""
    return f"{kernel_address(rs.address)} {rs.port:04X}"


# --- /proc/net/ip_vs_conn -----------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ConnLine:
    protocol: str  # "TCP", "UDP", "SCTP", "IP" (fwmark templates), as printed
    client_port: int
    vs: ServiceKey | None  # None for protocols ipvsctl does not program
    rs: RealServerKey
    state: str

    @property
    def template(self) -> bool:
        """A persistence template (client port 0), not a connection."""
        return self.client_port == 0


def parse_conn_line(line: str) -> ConnLine | None:
    """One ip_vs_conn line, whatever its spacing; None for the header, a truncated line
    (no Expires) or anything else that is not a connection entry."""
    cols = line.split()
    if len(cols) < 9 or not cols[8].isdigit():
        return None
    proto, _caddr, cport, vaddr, vport, daddr, dport, state = cols[:8]
    try:
        rs = RealServerKey(_address(daddr), _port(dport))
        protocol = PROTOCOLS.get(proto)
        vs = ServiceKey(protocol, _address(vaddr), _port(vport)) if protocol is not None else None
        return ConnLine(proto, _port(cport), vs, rs, state)
    except ValueError:
        return None


def classify(counts: ConnCounts, state: str) -> ConnCounts:
    """Add one connection in `state`. Unknown states count as closing: they hold."""
    if state == ESTABLISHED:
        return ConnCounts(counts.established + 1, counts.closing, counts.closed)
    if state in CLOSED_STATES:
        return ConnCounts(counts.established, counts.closing, counts.closed + 1)
    return ConnCounts(counts.established, counts.closing + 1, counts.closed)


# Canonical layouts: IPv4 "TCP 0A000064 9C40 0A60000A 0050 0AF40105 1F90 ..." has DestIP
# DPrt at [32:45] (spaces at 3, 31, 40, 45); IPv6 (39-character addresses) at [94:138]
# (spaces at 3, 93, 133, 138).
def _canonical_v4(line: str) -> bool:
    return line[3:4] == " " and line[31:32] == " " and line[40:41] == " " and line[45:46] == " "


def _canonical_v6(line: str) -> bool:
    return line[3:4] == " " and line[93:94] == " " and line[133:134] == " " and line[138:139] == " "


def scan_connections(lines: Iterable[str], wanted: Collection[ConnKey]) -> ConnScan:
    """Count the TCP connections of the wanted pairs by state, streaming. Only lines whose
    DestIP:DPrt text is a wanted real server's are parsed (a slice, a set lookup and a few
    character checks per line otherwise), so 100,000 TIME_WAIT entries elsewhere cost one
    pass of cheap checks. A wanted pair with no line gets an empty ConnCounts. A matching
    line that does not parse counts as closing for every wanted pair of that real server,
    and a TCP line that parses neither way makes the pass untrustworthy: never an early
    delete."""
    want = set(wanted)
    scan = ConnScan(counts={k: ConnCounts() for k in want})
    tokens: dict[str, list[ConnKey]] = {}
    for key in want:
        tokens.setdefault(dest_token(key[1]), []).append(key)
    v4 = {t for t in tokens if len(t) == 13}
    v6 = tokens.keys() - v4
    n = 0
    for line in lines:
        n += 1
        if not line.startswith("TCP"):
            continue  # the header, other protocols (only TCP drains wait on states)
        token: str | None = line[32:45]
        if token in v4 and _canonical_v4(line):
            pass
        elif _canonical_v4(line):
            continue
        elif v6 and (token := line[94:138]) in v6 and _canonical_v6(line):
            pass
        elif _canonical_v6(line):
            continue
        else:
            scan.slow += 1
            token = None
        conn = parse_conn_line(line)
        if conn is None or conn.vs is None:
            if token is not None:  # a wanted real server's line we cannot read
                scan.bad += 1
                for key in tokens[token]:
                    scan.counts[key] = classify(scan.counts[key], "?")
            else:
                scan.unattributed += 1
            continue
        key = (conn.vs, conn.rs)
        if key not in want:
            continue
        scan.matched += 1
        if not conn.template:
            scan.counts[key] = classify(scan.counts[key], conn.state)
    scan.lines = n
    return scan


@dataclass(frozen=True, slots=True)
class ConnEntry:
    """One connection, for `ipvsctl status --connections`."""

    client: str  # address:port ([v6]:port)
    state: str  # as the kernel prints it (ESTABLISHED, TIME_WAIT, ...; NONE for UDP)
    expires: int  # seconds until the kernel forgets it (its state's timeout)


@dataclass(slots=True)
class ConnListing:
    """Up to `limit` connections of each wanted (virtual, real server) pair, and how many
    more there were: bounded whatever the table's size."""

    limit: int
    shown: dict[ConnKey, list[ConnEntry]] = field(default_factory=dict)
    more: dict[ConnKey, int] = field(default_factory=dict)
    lines: int = 0


def list_connections(lines: Iterable[str], wanted: Collection[ConnKey], limit: int) -> ConnListing:
    """The wanted pairs' connections (any protocol; persistence templates are none), at
    most `limit` each, streaming: only lines whose DestIP:DPrt text is a wanted real
    server's are parsed (`scan_connections`' cheap match). For display only: a line in no
    canonical layout is skipped, not guessed at."""
    want = set(wanted)
    out = ConnListing(limit, {k: [] for k in want}, dict.fromkeys(want, 0))
    tokens = {dest_token(rs) for _, rs in want}
    n = 0
    for line in lines:
        n += 1
        if line[32:45] not in tokens and line[94:138] not in tokens:
            continue
        conn = parse_conn_line(line)
        if conn is None or conn.vs is None or conn.template or (conn.vs, conn.rs) not in want:
            continue
        key = (conn.vs, conn.rs)
        if len(out.shown[key]) >= limit:
            out.more[key] += 1
            continue
        cols = line.split()
        try:
            address, port = _address(cols[1]), _port(cols[2])
        except ValueError:
            continue
        client = f"[{address}]:{port}" if ":" in address else f"{address}:{port}"
        out.shown[key].append(ConnEntry(client, conn.state, int(cols[8])))
    out.lines = n
    return out


# --- /proc/net/ip_vs ----------------------------------------------------------------
def table_hostport(address: str, port: int) -> str:
    """`address:port` as /proc/net/ip_vs prints it: %08X:%04X, or [%pI6]:%04X."""
    addr = kernel_address(address)
    return f"[{addr}]:{port:04X}" if ":" in addr else f"{addr}:{port:04X}"


def vs_token(key: ServiceKey) -> tuple[str, str]:
    """(Prot, LocalAddress:Port) as an ip_vs header line prints them."""
    return key.protocol.value, table_hostport(key.address, key.port)


def _hostport(text: str) -> tuple[str, int]:
    addr, _, port = text.rpartition(":")
    return _address(addr), _port(port)


@dataclass(slots=True)
class TableScan:
    """The wanted virtual servers' real servers from one ip_vs read. A wanted virtual server
    that is not in it is gone (absent from `real_servers`)."""

    real_servers: dict[ServiceKey, list[RealServerStatus]] = field(default_factory=dict)
    lines: int = 0
    bad: int = 0  # unreadable lines inside a wanted virtual server
    complete: bool = False  # the header was seen (the file is what it should be)
    # Wanted virtual servers with an unreadable real server line: not known this time
    # (reporting them without that real server would forget its drain).
    unreadable: set[ServiceKey] = field(default_factory=set)


_RS_TOKEN = re.compile(r"(?:[0-9A-Fa-f]{8}|\[[0-9A-Fa-f:]{2,39}\]):[0-9A-Fa-f]{4}")


def rs_token(rs: RealServerKey) -> str:
    """`RemoteAddress:Port` as an ip_vs real server line prints it."""
    return table_hostport(rs.address, rs.port)


def scan_table(
    lines: Iterable[str],
    wanted: Collection[ServiceKey] | None = None,
    only: Mapping[ServiceKey, Collection[RealServerKey]] | None = None,
) -> TableScan:
    """Real servers with weights and counts per virtual server (all of them when wanted is
    None; with `only`, just those real servers of each). Header lines of other virtual
    servers cost a split, their real servers a prefix check, real servers left out by
    `only` a split. A wanted virtual server with an unreadable line goes to `unreadable`
    (its drains wait for the next read) rather than reported without that real server
    (that would forget it)."""
    tokens = None if wanted is None else {vs_token(k): k for k in wanted}
    chosen = (
        None
        if only is None
        else {key: frozenset(map(rs_token, only.get(key, ()))) for key in (wanted or only)}
    )
    scan = TableScan()
    current: ServiceKey | None = None
    keep: frozenset[str] | None = None  # the current virtual server's chosen real servers
    broken: set[ServiceKey] = set()
    for line in lines:
        scan.lines += 1
        if line.startswith("  ->"):
            if current is None:
                continue
            cols = line.split()
            try:
                if cols[1] == "RemoteAddress:Port":
                    continue
                if keep is not None and cols[1] not in keep:
                    # not asked for: its shape is checked (a line that does not parse still
                    # makes the virtual server unreadable), not its values
                    if len(cols) != 6 or _RS_TOKEN.fullmatch(cols[1]) is None:
                        raise ValueError(cols[1])
                    continue
                address, port = _hostport(cols[1])
                weight, active, inactive = int(cols[3]), int(cols[4]), int(cols[5])
            except (IndexError, ValueError):
                scan.bad += 1
                broken.add(current)
                continue
            scan.real_servers[current].append(
                RealServerStatus(RealServerKey(address, port), weight, active, inactive)
            )
            continue
        current = None
        if line.startswith("IP Virtual Server version"):
            scan.complete = True
            continue
        cols = line.split(None, 2)
        if len(cols) < 2 or cols[0] not in PROTOCOLS:
            continue  # "Prot LocalAddress..." header, FWM services
        if tokens is not None:
            key = tokens.get((cols[0], cols[1]))
            if key is None:
                continue
        else:
            try:
                key = ServiceKey(PROTOCOLS[cols[0]], *_hostport(cols[1]))
            except ValueError:
                scan.bad += 1
                continue
        current = key
        keep = None if chosen is None else chosen.get(key, frozenset())
        scan.real_servers[key] = []
    for key in broken:
        scan.real_servers.pop(key, None)
    scan.unreadable = broken
    return scan

"""The /proc/net/ip_vs_conn and /proc/net/ip_vs codecs, on lines as the kernel prints them
(ip_vs_conn.c ip_vs_conn_seq_show, ip_vs_ctl.c ip_vs_info_seq_show)."""

from __future__ import annotations

from ipvsctl.kernel.procfs.codec import (
    dest_token,
    parse_conn_line,
    rs_token,
    scan_connections,
    scan_table,
)
from ipvsctl.model import ConnCounts, Protocol, RealServerKey, RealServerStatus, ServiceKey

HEADER = "Pro FromIP   FPrt ToIP     TPrt DestIP   DPrt State       Expires PEName PEData\n"
VS = ServiceKey(Protocol.TCP, "10.96.0.10", 80)
A, B = RealServerKey("10.244.1.5", 8080), RealServerKey("10.244.1.6", 8080)
VS6 = ServiceKey(Protocol.TCP, "fd96::10", 80)
A6 = RealServerKey("fd00::5", 8080)


def v4(
    state: str,
    dest: str = "0AF40105",
    cport: str = "9C40",
    vip: str = "0A60000A",
    expires: int = 118,
) -> str:
    # the kernel's "%-3s %08X %04X %08X %04X %s %04X %-11s %7u%s\n"
    return f"TCP 0A000064 {cport} {vip} 0050 {dest} 1F90 {state:<11} {expires:>7}\n"


def v6(state: str, cport: str = "9C40") -> str:
    return (
        f"TCP fd01:0000:0000:0000:0000:0000:0000:0100 {cport} "
        f"fd96:0000:0000:0000:0000:0000:0000:0010 0050 "
        f"fd00:0000:0000:0000:0000:0000:0000:0005 1F90 {state:<11} {60:>7}\n"
    )


def test_ipv4_line_parses_to_model_keys():
    c = parse_conn_line(v4("TIME_WAIT"))
    assert c is not None
    assert (c.vs, c.rs, c.state, c.client_port, c.template) == (VS, A, "TIME_WAIT", 40000, False)
    assert parse_conn_line(HEADER) is None


def test_ipv6_line_parses_and_the_cheap_token_is_what_the_kernel_prints():
    c = parse_conn_line(v6("FIN_WAIT"))
    assert c is not None and (c.vs, c.rs, c.state) == (VS6, A6, "FIN_WAIT")
    assert dest_token(A6) in v6("FIN_WAIT") and dest_token(A) in v4("CLOSE")


def test_states_are_sorted_into_established_closing_and_closed():
    lines = [
        HEADER,
        v4("ESTABLISHED"),
        v4("SYN_RECV"),
        v4("FIN_WAIT"),
        v4("CLOSE_WAIT"),
        v4("LAST_ACK"),
        v4("TIME_WAIT"),
        v4("CLOSE"),
        v4("TIME_WAIT"),
    ]
    scan = scan_connections(lines, [(VS, A)])
    assert scan.counts == {(VS, A): ConnCounts(established=1, closing=4, closed=3)}
    assert (scan.lines, scan.matched, scan.slow) == (9, 8, 0)


def test_persistence_templates_are_not_connections():
    lines = [
        HEADER,
        v4("NONE", cport="0000", expires=10790),
        v4("ASSURED", cport="0000"),
        v4("TIME_WAIT"),
    ]
    assert scan_connections(lines, [(VS, A)]).counts[(VS, A)] == ConnCounts(closed=1)


def test_other_real_servers_and_virtual_servers_are_not_parsed_or_counted():
    other_vip = v4("ESTABLISHED", vip="0A60000B")  # same pod, another virtual server
    lines = [HEADER, *[v4("TIME_WAIT", dest="0AF40106")] * 2000, other_vip, v4("CLOSE")]
    scan = scan_connections(lines, [(VS, A), (VS, B)])
    assert scan.counts == {(VS, A): ConnCounts(closed=1), (VS, B): ConnCounts(closed=2000)}
    scan = scan_connections(lines, [(VS, A)])
    # 2,000 lines of B were read but none parsed: only A's two lines matched the cheap check
    assert (scan.lines, scan.matched, scan.slow) == (2003, 1, 0)
    assert scan.counts == {(VS, A): ConnCounts(closed=1)}


def test_ipv6_connections_are_counted():
    scan = scan_connections([HEADER, v6("TIME_WAIT"), v6("LAST_ACK")], [(VS6, A6)])
    assert scan.counts == {(VS6, A6): ConnCounts(closing=1, closed=1)}


def test_odd_spacing_is_parsed_the_slow_way():
    odd = "TCP\t0A000064  9C40 0A60000A 0050   0AF40105 1F90 CLOSE_WAIT 5\n"
    scan = scan_connections([HEADER, odd], [(VS, A)])
    assert scan.counts == {(VS, A): ConnCounts(closing=1)} and scan.slow == 1


def test_truncated_lines_hold_never_count_as_closed():
    whole = v4("TIME_WAIT")
    # cut after DestIP DPrt: it is A's, unreadable: it holds A
    scan = scan_connections([HEADER, whole, whole[:50]], [(VS, A)])
    assert scan.counts[(VS, A)] == ConnCounts(closing=1, closed=1) and scan.bad == 1
    # cut before DestIP: nobody can say whose it is: the whole pass is not trusted
    scan = scan_connections([HEADER, whole, whole[:20]], [(VS, A)])
    assert scan.unattributed == 1 and not scan.trustworthy
    assert scan_connections([HEADER, whole], [(VS, A)]).trustworthy


def test_garbage_never_raises():
    junk = [
        "TCP zz 0 0 0 0 0 0 0\n",
        "TCP " + "F" * 300 + "\n",
        "\n",
        "TCP\n",
        "TCP 0A000064 FFFFF 0A60000A 0050 0AF40105 1F90 CLOSE 1\n",
    ]
    scan = scan_connections([HEADER, *junk], [(VS, A)])
    assert scan.counts == {(VS, A): ConnCounts()} and not scan.trustworthy


def test_a_wanted_pair_without_lines_gets_empty_counts():
    assert scan_connections([HEADER], [(VS, A)]).counts == {(VS, A): ConnCounts()}


TABLE = """IP Virtual Server version 1.2.1 (size=4096)
Prot LocalAddress:Port Scheduler Flags
  -> RemoteAddress:Port Forward Weight ActiveConn InActConn
TCP  0A60000A:0050 rr
  -> 0AF40105:1F90      Masq    0      0          3
  -> 0AF40106:1F90      Masq    1      2          0
TCP  0A60000B:0050 rr persistent 10800 FFFFFFFF
  -> 0AF40105:1F90      Masq    0      1          0
UDP  0A60000A:0035 rr
TCP  [fd96:0000:0000:0000:0000:0000:0000:0010]:0050 rr
  -> [fd00:0000:0000:0000:0000:0000:0000:0005]:1F90      Masq    1      0          7
FWM  00000001 rr
  -> 0AF40105:1F90      Masq    1      0          0
"""


def test_table_lists_every_virtual_server_with_counts():
    scan = scan_table(TABLE.splitlines(True))
    assert scan.complete and scan.bad == 0
    assert scan.real_servers[VS] == [RealServerStatus(A, 0, 0, 3), RealServerStatus(B, 1, 2, 0)]
    assert scan.real_servers[ServiceKey(Protocol.TCP, "10.96.0.11", 80)] == [
        RealServerStatus(A, 0, 1, 0)
    ]
    assert scan.real_servers[ServiceKey(Protocol.UDP, "10.96.0.10", 53)] == []
    assert scan.real_servers[VS6] == [RealServerStatus(A6, 1, 0, 7)]
    assert len(scan.real_servers) == 4  # the fwmark service is not ipvsctl's


def test_table_reads_only_the_wanted_virtual_servers():
    gone = ServiceKey(Protocol.TCP, "10.96.0.99", 80)
    scan = scan_table(TABLE.splitlines(True), [VS6, gone])
    assert scan.real_servers == {VS6: [RealServerStatus(A6, 1, 0, 7)]}


def test_table_with_an_unreadable_real_server_line_is_not_known_for_that_virtual_server():
    broken = TABLE.replace(
        "  -> 0AF40106:1F90      Masq    1      2          0", "  -> 0AF40106:1F90      Masq    1"
    )
    scan = scan_table(broken.splitlines(True), [VS, VS6])
    assert scan.unreadable == {VS} and VS not in scan.real_servers and VS6 in scan.real_servers
    assert not scan_table(["garbage\n"]).complete


def test_with_only_a_virtual_servers_chosen_real_servers_are_parsed_and_reported():
    gone = RealServerKey("10.244.9.9", 8080)
    scan = scan_table(TABLE.splitlines(True), [VS, VS6], {VS: [B, gone], VS6: [A6]})
    assert scan.real_servers == {
        VS: [RealServerStatus(B, 1, 2, 0)],
        VS6: [RealServerStatus(A6, 1, 0, 7)],
    }
    assert rs_token(A6) == "[fd00:0000:0000:0000:0000:0000:0000:0005]:1F90"
    assert rs_token(B) == "0AF40106:1F90"


def test_with_only_an_unreadable_line_still_makes_its_virtual_server_unknown():
    """A line left out by `only` is not parsed, but one that does not look like a real
    server (it might be the drained one, mangled) still makes the drain wait."""
    for broken_line in (
        "  -> 0AF40105:1F90      Masq    0      0",
        "  -> 0AF4010:1F90      Masq    0      0          3",
        "  -> [fd00::5]]:1F90      Masq    0      0          3",
    ):
        broken = TABLE.replace("  -> 0AF40105:1F90      Masq    0      0          3", broken_line)
        scan = scan_table(broken.splitlines(True), [VS], {VS: [B]})
        assert scan.unreadable == {VS} and VS not in scan.real_servers, broken_line


def test_hex_fields_must_be_plain_hex():
    for bad in ("+A000064", "0x0A0001", " A00_064"):
        assert parse_conn_line(v4("CLOSE", dest=bad)) is None
    assert parse_conn_line(v4("CLOSE", cport="+C40")) is None

"""The nft adapter: error translation, JSON parsing, and the generated texts fed to the real
`nft` in a throwaway network namespace (skipped where that cannot be made: not root, no
nft, no nf_tables)."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid

import pytest

from ipvsctl.model import Protocol, ServiceKey
from ipvsctl.netfilter.nft import (
    Nft,
    NftError,
    NftNotFound,
    NftPermissionDenied,
    NftUnavailable,
    error_line,
    parse_map_elements,
    translate,
)
from ipvsctl.netfilter.ruleset import (
    Element,
    RulesetConfig,
    Verdict,
    base_ruleset,
    delete_table_ruleset,
    delta_ruleset,
    element_delta,
    replace_elements_ruleset,
    replace_table_ruleset,
)
from ipvsctl.netfilter.sync import NetfilterSync, SyncConfig
from ipvsctl.obs.metrics import Metrics

STDERR = """\
Error: Could not process rule: No such file or directory
delete element inet ipvsctl services4 { 10.96.0.11 . udp . 53 }
                                      ^^^^^^^^^^^^^^^^^^^^^^^^^
"""


def test_error_line_keeps_the_message_and_the_statement():
    assert error_line(STDERR) == (
        "Could not process rule: No such file or directory "
        "(in: delete element inet ipvsctl services4 { 10.96.0.11 . udp . 53 })"
    )
    assert error_line("Error: syntax error, unexpected '}'\n  ^\n") == (
        "syntax error, unexpected '}'"
    )
    assert error_line("") == "failed with no message"


@pytest.mark.parametrize(
    ("stderr", "cls"),
    [
        (STDERR, NftNotFound),
        (
            "Error: Could not process rule: Operation not permitted\nadd table inet x\n",
            NftPermissionDenied,
        ),
        (
            "Error: Could not process rule: Protocol not supported\nadd table inet x\n",
            NftUnavailable,
        ),
        ("Error: syntax error\n", NftError),
    ],
)
def test_translate(stderr, cls):
    err = translate(1, stderr, "elements")
    assert type(err) is cls
    assert str(err).startswith("nft elements: ") and err.operation == "elements"


def test_missing_binary_is_unavailable_counted_and_logged_once(caplog):
    m = Metrics()
    nft = Nft("/nonexistent/nft", metrics=m)
    for _ in range(3):
        with pytest.raises(NftUnavailable, match="not found: install nftables"):
            nft.apply("add table inet x\n", "base")
    assert m.value("ipvsctl_nft_errors_total", {"operation": "base"}) == 3
    assert [r.getMessage() for r in caplog.records].count("nft failed") == 1


def test_parse_map_elements():
    doc = {
        "nftables": [
            {"metainfo": {"version": "1.0.6"}},
            {
                "map": {
                    "name": "services6",
                    "elem": [
                        [
                            {"concat": ["fd00::10", "sctp", 80]},
                            {"goto": {"target": "external-local"}},
                        ],
                        [
                            {"elem": {"val": {"concat": ["fd00::11", "udp", 53]}, "timeout": 5}},
                            {"goto": {"target": "cluster-ip"}},
                        ],
                    ],
                }
            },
        ]
    }
    assert parse_map_elements(doc) == [
        ("fd00::10", "sctp", 80, "external-local"),
        ("fd00::11", "udp", 53, "cluster-ip"),
    ]
    assert parse_map_elements({"nftables": [{"map": {"name": "services4"}}]}) == []


# --- against the real nft ---------------------------------------------------------------------
@pytest.fixture
def netns():
    if os.geteuid() != 0 or not shutil.which("nft") or not shutil.which("ip"):
        pytest.skip("needs root, nft and ip")
    name = f"ipvsctl-unit-{uuid.uuid4().hex[:8]}"
    if subprocess.run(["ip", "netns", "add", name], capture_output=True).returncode != 0:
        pytest.skip("cannot create a network namespace here")
    try:
        probe = subprocess.run(
            ["ip", "netns", "exec", name, "nft", "add", "table", "inet", "p"],
            capture_output=True,
            text=True,
        )
        if probe.returncode != 0:
            pytest.skip(f"no nf_tables here: {probe.stderr.strip()}")
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def key(address: str, port: int, proto: str = "TCP") -> ServiceKey:
    return ServiceKey(Protocol(proto), address, port)


def test_generated_texts_are_accepted_by_nft(netns):
    cfg = RulesetConfig(cluster_cidrs=("10.244.0.0/16", "fd00:10:244::/56"))
    nft = Nft(netns=netns, metrics=Metrics())
    elements = {
        key("10.96.0.10", 80): Element(Verdict.CLUSTER_IP),
        key("fd96::10", 53, "UDP"): Element(Verdict.EXTERNAL_LOCAL),
        key("192.0.2.10", 30080, "SCTP"): Element(Verdict.EXTERNAL),
    }
    assert nft.list_table(cfg.target) is None
    assert nft.list_declarations(cfg.target) is None
    nft.apply(base_ruleset(cfg), "base")
    subprocess.run(
        [
            "ip",
            "netns",
            "exec",
            netns,
            "nft",
            "add table inet other; add chain inet other c { type filter hook input priority 0 ; }",
        ],
        check=True,
    )
    decl = nft.list_declarations(cfg.target)
    assert decl is not None and decl.startswith("table inet ipvsctl {")
    assert "chain nat-postrouting" in decl and "map services4" in decl and "hairpin4" in decl
    assert "other" not in decl and "masquerade" not in decl  # no rules, no other tables
    listing = nft.list_table(cfg.target)
    assert listing and "chain nat-postrouting" in listing and "fully-random" in listing
    nft.apply(base_ruleset(cfg), "base")  # idempotent
    assert nft.list_table(cfg.target) == listing

    nft.apply(replace_elements_ruleset(cfg, elements), "replace")
    got = nft.list_map(cfg.target, "services4") + nft.list_map(cfg.target, "services6")
    assert sorted(got) == [
        ("10.96.0.10", "tcp", 80, "cluster-ip"),
        ("192.0.2.10", "sctp", 30080, "external"),
        ("fd96::10", "udp", 53, "external-local"),
    ]
    assert nft.list_table(cfg.target) == listing  # -t: elements never change the listing
    assert nft.list_declarations(cfg.target) == decl

    wanted = dict(elements)
    wanted[key("fd96::10", 53, "UDP")] = Element(Verdict.EXTERNAL)
    del wanted[key("10.96.0.10", 80)]
    nft.apply(delta_ruleset(cfg, element_delta(elements, wanted)), "elements")
    got = nft.list_map(cfg.target, "services4") + nft.list_map(cfg.target, "services6")
    assert sorted(got) == [
        ("192.0.2.10", "sctp", 30080, "external"),
        ("fd96::10", "udp", 53, "external"),
    ]

    # a failed transaction changes nothing (deleting an element that is not there)
    with pytest.raises(NftNotFound, match="in: delete element"):
        nft.apply(delta_ruleset(cfg, element_delta(elements, {})), "elements")
    assert len(nft.list_map(cfg.target, "services4")) == 1

    nft.apply(replace_table_ruleset(cfg, elements), "table")
    assert nft.list_table(cfg.target) == listing
    assert len(nft.list_map(cfg.target, "services4")) == 2

    nft.apply(delete_table_ruleset(cfg), "cleanup")
    nft.apply(delete_table_ruleset(cfg), "cleanup")  # also when it is not there
    assert nft.list_table(cfg.target) is None
    assert nft.list_map(cfg.target, "services4") is None


def test_sync_repairs_a_real_table(netns):
    cfg = SyncConfig(RulesetConfig(masquerade_all=True))
    nft = Nft(netns=netns)
    sync = NetfilterSync(nft, cfg)
    sync.start()
    sync.desired = {key("10.96.0.10", 80): Element(Verdict.CLUSTER_IP)}
    assert sync.flush()
    assert sync.check() and sync.audit()
    subprocess.run(
        [
            "ip",
            "netns",
            "exec",
            netns,
            "nft",
            "add",
            "rule",
            "inet",
            "ipvsctl",
            "external",
            "counter",
        ],
        check=True,
    )
    assert sync.check()  # rules are the audit's
    assert not sync.audit()
    assert sync.flush() and sync.check() and sync.audit()
    subprocess.run(
        ["ip", "netns", "exec", netns, "nft", "add", "chain", "inet", "ipvsctl", "extra"],
        check=True,
    )
    assert not sync.check()
    assert sync.flush() and sync.check() and sync.audit()
    subprocess.run(
        ["ip", "netns", "exec", netns, "nft", "flush", "map", "inet", "ipvsctl", "services4"],
        check=True,
    )
    assert not sync.audit()
    assert sync.flush() and sync.audit()
    assert nft.list_map(cfg.ruleset.target, "services4") == [
        ("10.96.0.10", "tcp", 80, "cluster-ip")
    ]

    # the source-range sets, as nft lists them (a /32 comes back as a bare address)
    lb = key("203.0.113.7", 80)
    sync.desired[lb] = Element(Verdict.EXTERNAL, ("198.51.100.0/24", "203.0.113.7/32"))
    sync.touched.add(lb)
    assert sync.flush() and sync.audit()
    assert sorted(nft.list_set(cfg.ruleset.target, "firewall-allow4")) == [
        ("203.0.113.7", "tcp", "80", "198.51.100.0/24"),
        ("203.0.113.7", "tcp", "80", "203.0.113.7"),
    ]
    for name in ("firewall4", "firewall-allow4"):
        subprocess.run(
            ["ip", "netns", "exec", netns, "nft", "flush", "set", "inet", "ipvsctl", name],
            check=True,
        )
        assert not sync.audit()
        assert sync.flush() and sync.audit()
    assert nft.list_set(cfg.ruleset.target, "firewall4") == [("203.0.113.7", "tcp", "80")]


def _set(netns: str, name: str) -> str:
    r = subprocess.run(
        ["ip", "netns", "exec", netns, "nft", "list", "set", "inet", "ipvsctl", name],
        capture_output=True,
        text=True,
        check=True,
    )
    return " ".join(r.stdout.split())


def test_source_range_elements_are_accepted_changed_and_removed_by_nft(netns):
    cfg = RulesetConfig()
    nft = Nft(netns=netns, metrics=Metrics())
    nft.apply(base_ruleset(cfg), "base")
    lb4, lb6 = key("203.0.113.7", 80), key("2001:db8:7::1", 443)
    # overlapping and duplicate ranges are collapsed: nft refuses overlapping intervals
    ranges = ("192.168.2.0/24", "192.168.2.128/25", "10.0.0.0/8", "fd00::/64")
    before = {
        lb4: element_for_ranges(Verdict.EXTERNAL, ranges),
        lb6: element_for_ranges(Verdict.EXTERNAL_LOCAL, ranges),
        key("10.96.0.10", 80): Element(Verdict.CLUSTER_IP),
    }
    nft.apply(replace_elements_ruleset(cfg, before), "replace")
    assert "203.0.113.7 . tcp . 80" in _set(netns, "firewall4")
    allow4 = _set(netns, "firewall-allow4")
    assert "203.0.113.7 . tcp . 80 . 192.168.2.0/24" in allow4
    assert "203.0.113.7 . tcp . 80 . 10.0.0.0/8" in allow4
    assert "fd00::" not in allow4 and "10.96.0.10" not in allow4
    assert "2001:db8:7::1 . tcp . 443 . fd00::/64" in _set(netns, "firewall-allow6")

    # ranges changed on one, the other opened: deletions then additions, one transaction
    after = dict(before)
    after[lb4] = element_for_ranges(Verdict.EXTERNAL, ("198.51.100.0/24",))
    after[lb6] = Element(Verdict.EXTERNAL_LOCAL)
    nft.apply(delta_ruleset(cfg, element_delta(before, after)), "elements")
    allow4 = _set(netns, "firewall-allow4")
    assert "198.51.100.0/24" in allow4 and "192.168.2.0/24" not in allow4
    assert "2001:db8:7::1" not in _set(netns, "firewall6") + _set(netns, "firewall-allow6")
    nft.apply(delta_ruleset(cfg, element_delta(after, {})), "elements")
    assert "203.0.113.7" not in _set(netns, "firewall4") + _set(netns, "firewall-allow4")


def element_for_ranges(verdict: Verdict, ranges: tuple[str, ...]) -> Element:
    from ipvsctl.netfilter.ruleset import collapse_cidrs

    return Element(verdict, collapse_cidrs(ranges))


def _connect(netns: str, address: str, port: int, proto: str = "tcp") -> str:
    """From inside the netns (the node itself): 'open', 'refused' or 'timeout'."""
    code = (
        "import socket,sys\n"
        f"fam = socket.AF_INET6 if ':' in {address!r} else socket.AF_INET\n"
        f"s = socket.socket(fam, socket.SOCK_STREAM if {proto!r} == 'tcp' else socket.SOCK_DGRAM)\n"
        "s.settimeout(3)\n"
        "try:\n"
        f"    s.connect(({address!r}, {port}))\n"
        f"    if {proto!r} == 'udp':\n"
        "        s.send(b'x'); s.recv(10)\n"
        "    print('open')\n"
        "except ConnectionRefusedError: print('refused')\n"
        "except TimeoutError: print('timeout')\n"
    )
    r = subprocess.run(
        ["ip", "netns", "exec", netns, "python3", "-c", code],
        capture_output=True,
        text=True,
        timeout=20,
    )
    return r.stdout.strip() or r.stderr.strip()


def test_port_filter_refuses_host_listeners_behind_virtual_ips(netns):
    """Real packets in a netns (no IPVS needed: the filter decides before IPVS would): the
    node's own connection to a bound address at a port that is no virtual server is refused;
    at a virtual server's port, at a node address, and once the address is unbound, it is
    not. (tests/lab/test_netfilter_lab.py does the same through IPVS, from pods and outside.)
    At the virtual server's port the connection is held, never answered by the host: with
    no IPVS hook to take it (here none at all; on a node, a flushed table) the hold rules
    drop the SYN, so a host listener is never reached through a Service address and the
    client retries into the restored table."""

    def sh(*cmd: str) -> None:
        subprocess.run(["ip", "netns", "exec", netns, *cmd], check=True, capture_output=True)

    sh("ip", "link", "set", "lo", "up")
    # the VIP on lo: this host kernel may lack the dummy module, and the filter matches the
    # address, not the interface
    sh("ip", "addr", "add", "10.96.0.10/32", "dev", "lo")
    sh("ip", "addr", "add", "192.0.2.10/32", "dev", "lo")  # a node address
    # "sshd": one listener on every address at a port that is no Service port; "the service":
    # a listener at the virtual server's port (IPVS would take it; here the host answers)
    listeners = [
        subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                netns,
                "python3",
                "-c",
                "import socket,time\n"
                f"s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
                f"s.bind(('0.0.0.0', {port})); s.listen(8)\n"
                "while True:\n c,_=s.accept(); c.close()\n",
            ]
        )
        for port in (2222, 80)
    ]
    try:
        cfg = RulesetConfig()
        nft = Nft(netns=netns)
        vip = {
            key("10.96.0.10", 80): Element(Verdict.CLUSTER_IP, vip=True),
            key("192.0.2.10", 30080): Element(Verdict.EXTERNAL),
        }
        for _ in range(100):  # the listeners are up once the plain host port answers
            if _connect(netns, "192.0.2.10", 2222) == "open":
                break
        assert _connect(netns, "10.96.0.10", 2222) == "open"  # without the filter: exposed
        nft.apply(base_ruleset(cfg), "base")
        nft.apply(replace_elements_ruleset(cfg, vip), "replace")
        assert _connect(netns, "10.96.0.10", 2222) == "refused"  # sshd behind the VIP
        assert _connect(netns, "10.96.0.10", 80) == "timeout"  # the virtual server's: held
        assert _connect(netns, "192.0.2.10", 2222) == "open"  # node addresses: untouched
        # the Service goes: its address leaves the filter (and would leave the interface)
        nft.apply(delta_ruleset(cfg, element_delta(vip, {})), "elements")
        assert _connect(netns, "10.96.0.10", 2222) == "open"
    finally:
        for p in listeners:
            p.kill()
            p.wait()

"""`ipvsctl cleanup`: what it removes (and what it leaves), dry runs, errors, the command."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from ipvsctl.cli import cleanup as cleanup_mod
from ipvsctl.cli.app import app
from ipvsctl.cli.cleanup import CleanupError, NotChecked, cleanup_node, nat_families
from ipvsctl.model import Protocol, ServiceKey
from ipvsctl.plan.ownership import owned_virtual_servers


def key(address: str, port: int, proto: str = "TCP") -> ServiceKey:
    return ServiceKey(Protocol(proto), address, port)


VIP, VIP6, NODE = "10.96.0.10", "fd96::10", "192.0.2.10"


class FakeHost:
    def __init__(self) -> None:
        self.vs = [
            key(VIP, 80),
            key(VIP6, 53, "UDP"),
            key(NODE, 30080),
            key(NODE, 22),
            key("10.1.2.3", 80),
            key("192.0.2.99", 30080),
        ]
        self.iface: tuple[str, list[str]] | None = ("dummy", [VIP, VIP6])
        self.table: bool | str = True  # "nat only": emptied but for its NAT chain
        self.nat: frozenset[int] | Exception = frozenset({4, 6})  # kube-proxy's, say
        self.fail: set[str] = set()
        self.calls: list[str] = []

    def _maybe_fail(self, what: str) -> None:
        self.calls.append(what)
        if what in self.fail:
            raise CleanupError(f"{what}: injected")

    def virtual_servers(self):
        return list(self.vs)

    def delete_virtual_server(self, k):
        self._maybe_fail(f"del {k}")
        self.vs.remove(k)

    def interface(self):
        return self.iface

    def delete_interface(self):
        self._maybe_fail("del interface")
        self.iface = None

    def delete_address(self, address):
        self._maybe_fail(f"del address {address}")
        assert self.iface is not None
        self.iface = (self.iface[0], [a for a in self.iface[1] if a != address])

    def table_exists(self):
        return self.table

    def delete_table(self):
        self._maybe_fail("del table")
        self.table = False

    def nat_elsewhere(self):
        if isinstance(self.nat, Exception):
            raise self.nat
        return self.nat

    def keep_nat_chain_only(self):
        self._maybe_fail("nat chain only")
        self.table = "nat only"


@pytest.fixture
def state(tmp_path: Path) -> Path:
    d = tmp_path / "state"
    d.mkdir()
    (d / "drain-queue.json").write_text("[]")
    (d / "drain-queue.json.corrupt-1700000000").write_text("x")
    return d


def test_owned_is_the_daemons_rule():
    got = owned_virtual_servers(
        [key(VIP, 80), key(NODE, 30080), key(NODE, 22), key(NODE, 32768), key("10.1.2.3", 80)],
        bound=[VIP],
        node_ips=[NODE],
    )
    assert got == [key(VIP, 80), key(NODE, 30080)]


def test_removes_ipvsctls_virtual_servers_interface_table_and_state(state):
    host = FakeHost()
    r = cleanup_node(host, "kube-ipvs0", [NODE], state)
    assert r.errors == []
    # what is not ipvsctl's stays: a VIP off the interface, a NodePort on another address,
    # a node address outside the NodePort range
    assert sorted(host.vs) == sorted([key(NODE, 22), key("10.1.2.3", 80), key("192.0.2.99", 30080)])
    assert host.iface is None and host.table is False
    assert not state.exists()
    assert r.lines == [
        "deleted virtual server TCP 10.96.0.10:80",
        "deleted virtual server TCP 192.0.2.10:30080",
        "deleted virtual server UDP [fd96::10]:53",
        "deleted interface kube-ipvs0 (addresses: 10.96.0.10, fd96::10)",
        "deleted nftables table inet ipvsctl",
        f"removed {state / 'drain-queue.json'}",
        f"removed {state / 'drain-queue.json.corrupt-1700000000'}",
    ]
    assert r.summary == [
        "3 virtual servers",
        "interface kube-ipvs0 with 2 addresses",
        "nftables table",
        "drain queue state",
    ]
    again = cleanup_node(host, "kube-ipvs0", [NODE], state)
    assert (again.lines, again.errors, again.summary) == ([], [], [])


def test_dry_run_changes_nothing(state):
    host = FakeHost()
    r = cleanup_node(host, "kube-ipvs0", [NODE], state, dry_run=True)
    assert host.calls == [] and len(host.vs) == 6 and host.table and host.iface
    assert (state / "drain-queue.json").exists()
    assert r.lines[0] == "would delete virtual server TCP 10.96.0.10:80"
    assert r.lines[-1].startswith("would remove ")


def test_every_step_is_tried_and_failures_reported(state):
    host = FakeHost()
    host.fail = {f"del {key(VIP, 80)}", "del table"}
    r = cleanup_node(host, "kube-ipvs0", [NODE], state)
    assert r.errors == [f"del {key(VIP, 80)}: injected", "del table: injected"]
    assert host.iface is None and not state.exists()
    assert key(VIP, 80) in host.vs and key(NODE, 30080) not in host.vs


def test_a_non_dummy_interface_is_left_alone():
    host = FakeHost()
    host.iface = ("", ["192.0.2.10"])  # e.g. --interface eth0 by mistake
    r = cleanup_node(host, "eth0", [], None)
    assert r.errors == [
        "interface eth0 is a physical interface, not a dummy one: check "
        "--interface; it and its addresses are left alone"
    ]
    assert host.iface is not None and len(host.vs) == 6  # nothing on eth0's address went
    assert host.table is False  # the table is ipvsctl's whatever the interface


def test_command(monkeypatch, state):
    host = FakeHost()
    monkeypatch.setattr(cleanup_mod, "SystemHost", lambda interface: host)
    monkeypatch.setattr(cleanup_mod, "daemon_answers", lambda endpoint: False)
    runner = CliRunner()
    r = runner.invoke(app, ["cleanup", "--node-ip", NODE, "--state-dir", str(state)])
    assert r.exit_code == 0, r.output
    assert r.output.splitlines()[-1] == (
        "cleanup done: 3 virtual servers, interface kube-ipvs0 with 2 addresses, "
        "nftables table, drain queue state"
    )
    r = runner.invoke(app, ["cleanup", "--node-ip", NODE, "--state-dir", str(state)])
    assert r.exit_code == 0 and r.output.strip() == "cleanup done: nothing to remove"

    host = FakeHost()
    host.fail = {"del table"}
    r = runner.invoke(app, ["cleanup", "--node-ip", NODE, "--state-dir", str(state)])
    assert r.exit_code == 1 and "ipvsctl: del table: injected" in r.output

    assert runner.invoke(app, ["cleanup", "--node-ip", "nope"]).exit_code == 2


KEEPALIVED = "10.96.200.1"  # another tool's VIP on kube-ipvs0, in ipvs.excludeCIDRs


def test_excluded_cidrs_are_never_touched(state):
    host = FakeHost()
    host.vs.append(key(KEEPALIVED, 443))
    host.iface = ("dummy", [VIP, VIP6, KEEPALIVED])
    r = cleanup_node(host, "kube-ipvs0", [NODE], state, excluded=("10.96.200.0/24",))
    assert r.errors == []
    assert key(KEEPALIVED, 443) in host.vs and key(VIP, 80) not in host.vs
    # the interface stays for the excluded address; ipvsctl's own addresses are gone from it
    assert host.iface == ("dummy", [KEEPALIVED])
    assert "del interface" not in host.calls
    assert r.lines[3:6] == [
        "deleted address 10.96.0.10 from interface kube-ipvs0",
        "deleted address fd96::10 from interface kube-ipvs0",
        "left interface kube-ipvs0: it carries addresses in ipvs.excludeCIDRs (10.96.200.1)",
    ]
    assert r.summary[:2] == ["3 virtual servers", "2 addresses of interface kube-ipvs0"]


def test_command_reads_kube_proxys_config(monkeypatch, state, tmp_path):
    host = FakeHost()
    host.vs.append(key(KEEPALIVED, 443))
    host.iface = ("dummy", [VIP, VIP6, KEEPALIVED])
    monkeypatch.setattr(cleanup_mod, "SystemHost", lambda interface: host)
    monkeypatch.setattr(cleanup_mod, "daemon_answers", lambda endpoint: False)
    import ipvsctl.kernel.netlink.addresses as addresses

    # without --node-ip: the host's addresses, narrowed by nodePortAddresses
    monkeypatch.setattr(addresses, "node_addresses", lambda **kw: [NODE, "192.0.2.99"])
    config = tmp_path / "config.conf"
    config.write_text(
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
        "mode: ipvs\nipvs:\n  excludeCIDRs: [10.96.200.0/24]\n"
        "nodePortAddresses: [192.0.2.10/32]\n"
    )
    runner = CliRunner()
    r = runner.invoke(app, ["cleanup", "--config", str(config), "--state-dir", str(state)])
    assert r.exit_code == 0, r.output
    assert key(KEEPALIVED, 443) in host.vs and host.iface == ("dummy", [KEEPALIVED])
    assert key(NODE, 30080) not in host.vs  # a NodePort on a nodePortAddresses address
    assert key("192.0.2.99", 30080) in host.vs  # outside nodePortAddresses: not ipvsctl's

    config.write_text("kind: KubeProxyConfiguration\nmode: iptables\n")
    r = runner.invoke(app, ["cleanup", "--config", str(config), "--state-dir", str(state)])
    assert r.exit_code == 2 and r.output.count("\n") == 1 and str(config) in r.output
    r = runner.invoke(app, ["cleanup", "--config", str(tmp_path / "missing")])
    assert r.exit_code == 2


def test_command_refuses_while_a_daemon_answers(monkeypatch):
    monkeypatch.setattr(cleanup_mod, "daemon_answers", lambda endpoint: True)
    monkeypatch.setattr(cleanup_mod, "SystemHost", lambda interface: pytest.fail("touched"))
    r = CliRunner().invoke(app, ["cleanup", "--node-ip", NODE])
    assert r.exit_code == 1 and "stop it first" in r.output


def test_the_system_hosts_kernel_errors_are_cleanup_errors():
    # The IPVS/interface half lives in kernel/netlink/system_host.py and speaks KernelError; the
    # cleanup reports each as one line.
    from ipvsctl.cli.cleanup import SystemHost
    from ipvsctl.kernel import KernelError

    host = SystemHost("kube-ipvs0")

    def refused() -> None:
        raise KernelError("delete_interface kube-ipvs0: Operation not permitted", "delete")

    host._host._link.delete = refused  # type: ignore[method-assign]
    with pytest.raises(CleanupError, match="delete_interface kube-ipvs0: Operation not"):
        host.delete_interface()


# --- a node rolled back to kube-proxy: only what changes traffic once the daemon is gone ---


def test_rollback_removes_the_table_and_state_and_leaves_the_ipvs_table_and_interface(
    monkeypatch, state
):
    """kube-proxy's virtual servers and kube-ipvs0 (kube-proxy's interface too) stay with
    their connections; ipvsctl's frozen port filter and its drain state go. The node's
    addresses are not even read (no NodePort is touched)."""
    host = FakeHost()
    before = list(host.vs)
    monkeypatch.setattr(cleanup_mod, "SystemHost", lambda interface: host)
    monkeypatch.setattr(cleanup_mod, "daemon_answers", lambda endpoint: False)
    import ipvsctl.kernel.netlink.addresses as addresses

    monkeypatch.setattr(addresses, "node_addresses", lambda **kw: pytest.fail("read"))
    runner = CliRunner()
    r = runner.invoke(app, ["cleanup", "--rollback", "--state-dir", str(state), "--dry-run"])
    assert r.exit_code == 0, r.output
    assert host.calls == [] and host.table and (state / "drain-queue.json").exists()
    r = runner.invoke(app, ["cleanup", "--rollback", "--state-dir", str(state)])
    assert r.exit_code == 0, r.output
    assert host.vs == before and host.iface == ("dummy", [VIP, VIP6])
    assert host.calls == ["del table"] and host.table is False and not state.exists()
    assert r.output.splitlines() == [
        "deleted nftables table inet ipvsctl",
        f"removed {state / 'drain-queue.json'}",
        f"removed {state / 'drain-queue.json.corrupt-1700000000'}",
        "cleanup (rollback) done: nftables table, drain queue state",
    ]
    r = runner.invoke(app, ["cleanup", "--rollback", "--state-dir", str(state)])
    assert r.exit_code == 0 and r.output.strip() == "cleanup (rollback) done: nothing to remove"


def test_rollback_keeps_the_nat_chain_while_nothing_else_keeps_nat_hooked(monkeypatch, state):
    """Before kube-proxy's first sync no other NAT chain may exist on the node; deleting
    ipvsctl's last one stops the kernel translating the connections ipvsctl masqueraded
    (seen on a real kernel: tests/lab/test_takeover_lab.py). The table is emptied but for
    it, until a later run finds another program's NAT for both families."""
    host = FakeHost()
    host.nat = frozenset({4})  # kube-proxy's iptables nat table, no ip6tables one yet
    monkeypatch.setattr(cleanup_mod, "SystemHost", lambda interface: host)
    monkeypatch.setattr(cleanup_mod, "daemon_answers", lambda endpoint: False)
    runner = CliRunner()
    r = runner.invoke(app, ["cleanup", "--rollback", "--state-dir", str(state), "--dry-run"])
    assert r.exit_code == 0 and host.calls == [], r.output
    assert r.output.startswith("would empty nftables table inet ipvsctl but for its NAT chain")
    r = runner.invoke(app, ["cleanup", "--rollback", "--state-dir", str(state)])
    assert r.exit_code == 0, r.output
    assert host.calls == ["nat chain only"] and host.table == "nat only"
    lines = r.output.splitlines()
    assert "no other NAT chain on this node for IPv6," in lines[0]
    assert lines[-1] == (
        "cleanup (rollback) done: nftables table (its empty NAT chain kept), drain queue state"
    )
    host.nat = frozenset({4, 6})  # kube-proxy synced: its NAT chains hold the bindings
    r = runner.invoke(app, ["cleanup", "--rollback", "--state-dir", str(state)])
    assert r.exit_code == 0 and host.table is False, r.output
    assert r.output.splitlines() == [
        "deleted nftables table inet ipvsctl",
        "cleanup (rollback) done: nftables table",
    ]


def test_rollback_keeps_the_nat_chain_when_it_cannot_tell(monkeypatch, state):
    host = FakeHost()
    host.nat = NotChecked("nft not found")
    monkeypatch.setattr(cleanup_mod, "SystemHost", lambda interface: host)
    monkeypatch.setattr(cleanup_mod, "daemon_answers", lambda endpoint: False)
    r = CliRunner().invoke(app, ["cleanup", "--rollback", "--state-dir", str(state)])
    assert r.exit_code == 0 and host.table == "nat only", r.output
    assert "for IPv4 and IPv6," in r.output
    assert "not checked: other NAT chains: nft not found" in r.output.splitlines()[-1]
    host.nat = CleanupError("nft cleanup: Operation not permitted")
    r = CliRunner().invoke(app, ["cleanup", "--rollback", "--state-dir", str(state)])
    assert r.exit_code == 0 and host.calls == ["nat chain only", "nat chain only"], r.output


def test_nat_families_count_other_programs_chains_and_legacy_tables():
    ours = ("inet", "ipvsctl")
    assert nat_families([ours], [], ours) == frozenset()
    assert nat_families([("ip", "nat")], [], ours) == {4}
    assert nat_families([("ip6", "nat"), ours], [], ours) == {6}
    assert nat_families([("inet", "kube-proxy")], [], ours) == {4, 6}
    assert nat_families([("arp", "x")], [6], ours) == {6}  # legacy ip6tables' nat table


def test_rollback_reports_a_failed_step_and_refuses_beside_a_daemon(monkeypatch, state):
    host = FakeHost()
    host.fail = {"del table"}
    monkeypatch.setattr(cleanup_mod, "SystemHost", lambda interface: host)
    monkeypatch.setattr(cleanup_mod, "daemon_answers", lambda endpoint: False)
    r = CliRunner().invoke(app, ["cleanup", "--rollback", "--state-dir", str(state)])
    assert r.exit_code == 1 and "ipvsctl: del table: injected" in r.output
    assert not state.exists()  # the state went all the same
    monkeypatch.setattr(cleanup_mod, "daemon_answers", lambda endpoint: True)
    monkeypatch.setattr(cleanup_mod, "SystemHost", lambda interface: pytest.fail("touched"))
    r = CliRunner().invoke(app, ["cleanup", "--rollback"])
    assert r.exit_code == 1 and "stop it first" in r.output


def test_the_nat_chain_only_ruleset_hooks_the_new_chain_in_the_same_transaction():
    from ipvsctl.netfilter.nft import parse_nat_chains
    from ipvsctl.netfilter.ruleset import RulesetConfig, nat_chain_only_ruleset

    assert nat_chain_only_ruleset(RulesetConfig()).splitlines() == [
        "add table inet ipvsctl",
        "delete table inet ipvsctl",
        "add table inet ipvsctl",
        "add chain inet ipvsctl nat-postrouting "
        "{ type nat hook postrouting priority srcnat ; policy accept ; }",
    ]
    doc = {
        "nftables": [
            {"metainfo": {"version": "1.0.6"}},
            {"chain": {"family": "ip", "table": "nat", "name": "POSTROUTING", "type": "nat",
                       "hook": "postrouting", "prio": 100}},
            {"chain": {"family": "inet", "table": "x", "name": "f", "type": "filter",
                       "hook": "input"}},
            {"chain": {"family": "ip6", "table": "nat", "name": "KUBE-SVC", }},
        ]
    }  # fmt: skip
    assert parse_nat_chains(doc) == [("ip", "nat")]

"""`ipvsctl run` works out this node's NodePort addresses without the VIP interface's."""

from __future__ import annotations

from typer.testing import CliRunner

import ipvsctl.daemon.wiring
import ipvsctl.kernel.netlink.addresses
from ipvsctl.cli.app import app

# This node: eth0 has 192.0.2.10; the VIP interface holds ClusterIPs from an earlier run.
ADDRESSES = {"eth0": ["192.0.2.10"], "kube-ipvs0": ["10.96.0.1"], "ipvs-vips": ["10.96.0.2"]}


def fake_node_addresses(exclude_interfaces: tuple[str, ...] = ("kube-ipvs0",)) -> list[str]:
    return sorted(
        ip for name, ips in ADDRESSES.items() if name not in exclude_interfaces for ip in ips
    )


def started_with(monkeypatch, tmp_path, *args: str):
    seen = []
    monkeypatch.setattr(ipvsctl.kernel.netlink.addresses, "node_addresses", fake_node_addresses)
    monkeypatch.setattr(ipvsctl.daemon.wiring, "run", lambda opts: seen.append(opts) or 0)
    r = CliRunner().invoke(
        app, ["run", "--manifests", str(tmp_path), "--state-dir", str(tmp_path / "state"), *args]
    )
    assert r.exit_code == 0, r.output
    return seen[0]


def test_the_default_interface_s_vips_are_not_node_ips(monkeypatch, tmp_path):
    opts = started_with(monkeypatch, tmp_path)
    assert opts.node.node_ips == ("10.96.0.2", "192.0.2.10")
    assert opts.node_ips.follow  # read from the host: followed while running


def test_a_custom_interface_s_vips_are_not_node_ips(monkeypatch, tmp_path):
    """Regression: with --interface, its ClusterIPs were taken for node addresses at a
    restart, and every NodePort Service got a virtual server on every ClusterIP."""
    opts = started_with(monkeypatch, tmp_path, "--interface", "ipvs-vips")
    assert opts.node.node_ips == ("10.96.0.1", "192.0.2.10")


def test_node_ip_flags_win(monkeypatch, tmp_path):
    opts = started_with(monkeypatch, tmp_path, "--node-ip", "198.51.100.7")
    assert opts.node.node_ips == ("198.51.100.7",)
    assert not opts.node_ips.follow  # fixed

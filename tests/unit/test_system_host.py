"""What `ipvsctl cleanup` reads and removes of the interface, over rtnetlink, on this
machine's kernel in a network namespace (a veth stands for the dummy interface: the host
kernel may have no dummy module; the lab's cleanup test has the real one)."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator

import pytest

from ipvsctl.kernel.netlink.system_host import SystemIpvsHost


def ip(netns: str, *args: str) -> str:
    return subprocess.run(
        ["ip", "netns", "exec", netns, "ip", *args], capture_output=True, text=True, check=True
    ).stdout


@pytest.fixture
def netns() -> Iterator[str]:
    if os.geteuid() != 0 or not shutil.which("ip"):
        pytest.skip("needs root and ip")
    name = f"ipvsctl-unit-{uuid.uuid4().hex[:8]}"
    if subprocess.run(["ip", "netns", "add", name], capture_output=True).returncode != 0:
        pytest.skip("cannot create a network namespace here")
    try:
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def test_the_interface_is_read_and_removed_never_created(netns: str) -> None:
    host = SystemIpvsHost("kube-ipvs0", netns=netns)
    try:
        assert host.interface() is None
        host.delete_address("10.96.0.1")  # no interface: nothing, and none made
        host.delete_interface()
        assert "kube-ipvs0" not in ip(netns, "-o", "link", "show")

        ip(netns, "link", "add", "kube-ipvs0", "type", "veth", "peer", "name", "peer0")
        for address in ("10.96.0.1/32", "10.96.0.2/32", "fd96::1/128"):
            ip(netns, "addr", "add", address, "dev", "kube-ipvs0")
        assert host.interface() == ("veth", ["10.96.0.1", "10.96.0.2", "fd96::1"])
        host.delete_address("10.96.0.2")
        host.delete_address("fd96::1")
        host.delete_address("10.96.0.9")  # not there: nothing
        assert host.interface() == ("veth", ["10.96.0.1"])
        host.delete_interface()
        assert host.interface() is None
        assert "kube-ipvs0" not in ip(netns, "-o", "link", "show")
    finally:
        host.close()

"""Leaving ipvsctl for kube-proxy's nftables mode on a real kernel, without a cut.

The real `ipvsctl run` serves the Service `web` (one pod, `web-1`) in the node's netns; a
client holds a connection through it. A stand-in for kube-proxy's nftables mode then comes
up on the node: its table `ip kube-proxy` DNATs new connections to the Service's address
in prerouting and output at priority -101 (before IPVS, which takes them at input and at
output after the NAT priority) to its own endpoint, `kp-1`. New connections go to the
stand-in at once while the held one goes on through IPVS; `ipvsctl handover --wait` (run in
the node, over loopback) waits for it, returns once it has ended, and nothing of ipvsctl is
left: no virtual server, no address on kube-ipvs0, no `inet ipvsctl` table, while the
stand-in's table and its traffic are untouched. Before its rules, the stand-in runs
kube-proxy's exact IPVS cleanup (`ipvsadm -C`, then kube-ipvs0 deleted): ipvsctl puts back
what it holds and the held connection lives through it.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devkit.builders import endpoint, endpoint_slice, service
from devkit.labkit import Node, Pod, http_get, wait_for

pytestmark = pytest.mark.lab

BIN = Path(sys.executable).parent
VIP = "10.96.0.10"
URL = "http://127.0.0.1:9796"

# kube-proxy's nftables mode, as far as new connections to a ClusterIP go: a nat table of
# its own whose prerouting and output chains DNAT a new connection to an endpoint (kube-proxy
# guards every such rule with `ct state new`). Numeric priorities: the lab kernel's nft
# refuses `dstnat - 1` in some hook and family combinations.
STAND_IN = """\
table ip kube-proxy {
  chain nat-prerouting {
    type nat hook prerouting priority -101; policy accept;
    ip daddr %(vip)s tcp dport 80 ct state new dnat to %(pod)s:8080
  }
  chain nat-output {
    type nat hook output priority -101; policy accept;
    ip daddr %(vip)s tcp dport 80 ct state new dnat to %(pod)s:8080
  }
}
"""


@contextlib.contextmanager
def ipvsctl_run(node: Node, pods: list[Pod], tmp_path: Path) -> Iterator[subprocess.Popen[Any]]:
    """The real `ipvsctl run` in the node's netns from a manifest folder serving `web` on
    `pods`, once /readyz says 200; killed at the end if still running."""
    folder = tmp_path / "manifests"
    folder.mkdir()
    (folder / "web.yaml").write_text(
        yaml.safe_dump_all(
            [service("web"), endpoint_slice("web", [endpoint(p.ip, pod=p.name) for p in pods])]
        )
    )
    log = tmp_path / "ipvsctl.log"
    command = ["ip", "netns", "exec", node.name, str(BIN / "ipvsctl"), "run"]
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [
                *command,
                *("--manifests", str(folder), "--state-dir", str(tmp_path / "state")),
                *("--node-ip", "192.0.2.10", "--drain-check-interval", "0.2"),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    proc.log = log  # type: ignore[attr-defined]
    try:

        def ready() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"ipvsctl run exited {proc.returncode}:\n{log.read_text()}")
            try:
                return http_get(f"{URL}/readyz", node.name, timeout=10)[0] == 200
            except OSError:
                return False

        try:  # a Python start in the emulated guest alone can take minutes under load
            wait_for(ready, timeout=900, interval=1.0, what="/readyz 200")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nipvsctl run's log:\n{log.read_text()}") from None
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def bound(node: Node) -> set[str]:
    """kube-ipvs0's addresses; none while it is gone."""
    try:
        return node.interface_addresses()
    except RuntimeError:  # `ip addr show dev kube-ipvs0`: no such device
        return set()


def handover_state(node: Node) -> dict[str, Any]:
    code, text = http_get(f"{URL}/v1/handover", node.name, timeout=10)
    assert code == 200, text
    return json.loads(text)


def test_handover_to_kube_proxys_nftables_mode_keeps_the_open_connection(
    node: Node, client: Pod, tmp_path: Path
) -> None:
    web = node.make_pod("10.244.1.1", name="web-1")
    kp = node.make_pod("10.244.1.9", name="kp-1")  # the stand-in's endpoint
    with ipvsctl_run(node, [web], tmp_path) as proc:
        held = client.connect(VIP, 80)  # through ipvsctl's virtual server
        try:
            assert held.echo("through ipvsctl")
            assert client.request(VIP, 80, reset=True) == "web-1"

            # kube-proxy (nftables) starts on the node. First its IPVS cleanup (its
            # CleanupLeftovers: ipvsadm -C, then kube-ipvs0 deleted): ipvsctl puts back what
            # it holds and the held connection lives through it (the table guard).
            node.run("ipvsadm", "-C")
            node.run("ip", "link", "del", "kube-ipvs0")
            wait_for(
                lambda: f"{VIP}:80/TCP" in node.ipvsadm() and VIP in bound(node),
                timeout=300,
                interval=0.2,
                what="the table put back",
            )
            assert held.echo("through kube-proxy's IPVS cleanup")
            # Then its rules: new connections are its own at once.
            rules = tmp_path / "kube-proxy.nft"
            rules.write_text(STAND_IN % {"vip": VIP, "pod": kp.ip})
            node.run("nft", "-f", str(rules))
            assert {client.request(VIP, 80, reset=True) for _ in range(4)} == {"kp-1"}
            assert held.echo("still through ipvsctl beside kube-proxy")

            # The handover waits for the held connection.
            handover = subprocess.Popen(
                [
                    *("ip", "netns", "exec", node.name, str(BIN / "ipvsctl")),
                    *("handover", "--wait", "--timeout", "900"),
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            try:
                wait_for(
                    lambda: handover_state(node).get("established") == 1,
                    timeout=600,
                    interval=0.5,
                    what="the held connection counted",
                )
                assert handover.poll() is None  # not handed over while it is open
                assert handover_state(node)["phase"] == "handing_over"
                assert held.echo("through the handover")
                assert {client.request(VIP, 80, reset=True) for _ in range(2)} == {"kp-1"}
                held.close()  # the client is done: the last connection ends
                out, _ = handover.communicate(timeout=900)
            finally:
                if handover.poll() is None:
                    handover.kill()
                    handover.wait()
            assert handover.returncode == 0, f"{out}\n{proc.log.read_text()}"  # type: ignore[attr-defined]
            assert out.rstrip().endswith("is idle"), out

            # Nothing of ipvsctl left that changes traffic; kube-proxy's untouched.
            assert node.ipvsadm() == {}
            assert bound(node) == set()
            tables = node.run("nft", "list", "tables").splitlines()
            assert "table inet ipvsctl" not in tables and "table ip kube-proxy" in tables
            assert {client.request(VIP, 80, reset=True) for _ in range(2)} == {"kp-1"}
            # Idle but ready, and says so.
            assert http_get(f"{URL}/readyz", node.name, timeout=10)[0] == 200
            status = subprocess.run(
                ["ip", "netns", "exec", node.name, str(BIN / "ipvsctl"), "status"],
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert "handover: handed over" in status.stdout, status.stdout + status.stderr
        finally:
            held.close()

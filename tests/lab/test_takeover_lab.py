"""kube-proxy's IPVS node taken over in place by `ipvsctl run --config`, on a real kernel.

The node's table is built as kube-proxy's IPVS mode leaves it (kube-ipvs0 with the
ClusterIPs, NAT real servers at weight 1, a virtual server of a Service deleted while
kube-proxy was gone, and one of another tool on an address in `ipvs.excludeCIDRs`), a
client holds a connection through it, then the real `ipvsctl run` starts in the node's
netns with kubeadm-shaped `config.conf` and `kubeconfig.conf` (kube-system/kube-proxy's
two keys) whose server is the fake API server, listening in the same netns. The only flag
besides `--config` is `--state-dir` (the guest's /var/lib is not ours to write).
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devkit.builders import endpoint, endpoint_slice, service
from devkit.fakeapi.server import FakeAPIServer
from devkit.labkit import Node, Pod, http_get, sh, wait_for
from ipvsctl.kernel.netns import run_in_netns

pytestmark = pytest.mark.lab

BIN = Path(sys.executable).parent
CORPUS = Path(__file__).resolve().parents[1] / "data" / "kube-proxy"
TOKEN = "a-projected-service-account-token"
VIP, STALE, OTHER = "10.96.0.10", "10.96.0.20", "10.96.99.5"


def kubeadm_files(folder: Path, server: str) -> Path:
    """kubeadm v1.33's ConfigMap keys, as the kubelet mounts them, pointed at `server` and at
    a token file here; the KubeProxyConfiguration as kubeadm wrote it but for excludeCIDRs
    (another tool's addresses on kube-ipvs0)."""
    cm = yaml.safe_load((CORPUS / "kubeadm-v1.33.configmap.yaml").read_text())
    sa = folder / "serviceaccount"
    sa.mkdir()
    (sa / "token").write_text(TOKEN)
    (sa / "ca.crt").write_text("not read over http")
    kubeconfig = cm["data"]["kubeconfig.conf"].replace(
        "/var/run/secrets/kubernetes.io/serviceaccount", str(sa)
    )
    kubeconfig = kubeconfig.replace("https://10.0.0.10:6443", server)
    (folder / "kubeconfig.conf").write_text(kubeconfig)
    config = cm["data"]["config.conf"].replace("/var/lib/kube-proxy", str(folder))
    config = config.replace("  excludeCIDRs: null", "  excludeCIDRs:\n  - 10.96.99.0/24")
    assert "10.96.99.0/24" in config and server in kubeconfig
    (folder / "config.conf").write_text(config)
    return folder / "config.conf"


def kube_proxy_table(node: Node, pods: list[Pod]) -> None:
    """The table kube-proxy's IPVS mode leaves when it stops (it never flushes on exit)."""
    for ip in (VIP, STALE, OTHER):
        node.run("ip", "addr", "add", f"{ip}/32", "dev", "kube-ipvs0")
    for vip, backends in ((VIP, pods), (STALE, pods[:1]), (OTHER, pods[1:])):
        node.run("ipvsadm", "-A", "-t", f"{vip}:80", "-s", "rr")
        for p in backends:
            node.run("ipvsadm", "-a", "-t", f"{vip}:80", "-r", f"{p.ip}:8080", "-m", "-w", "1")


def weights(node: Node) -> dict[str, dict[str, int]]:
    return {
        vs: {name: r.weight for name, r in s.real_servers.items()}
        for vs, s in node.ipvsadm().items()
    }


@contextlib.contextmanager
def takeover(node: Node, pods: list[Pod], tmp_path: Path) -> Iterator[tuple[Any, Any]]:
    """`ipvsctl run --config` from kubeadm's files in the node's netns, against a fake API
    server there serving the Service `web` on `pods`; yields (the process, the API server)
    once /readyz says 200. Killed at the end if still running."""
    api = run_in_netns(node.name, lambda: FakeAPIServer(token=TOKEN).start())
    api.add(service("web"))
    api.add(endpoint_slice("web", [endpoint(p.ip, pod=p.name) for p in pods]))
    config = kubeadm_files(tmp_path, api.url)
    log = tmp_path / "ipvsctl.log"
    command = ["ip", "netns", "exec", node.name, str(BIN / "ipvsctl"), "run"]
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [
                *command,
                *("--config", str(config), "--state-dir", str(tmp_path / "state")),
                # a drain's bound longer than the emulated guest's slowest steps
                *("--service-drain-timeout", "600"),
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
            try:  # the listen address is the default: the file has no field for it
                return http_get("http://127.0.0.1:9796/readyz", node.name, timeout=10)[0] == 200
            except OSError:
                return False

        try:  # a Python start in the emulated guest alone can take minutes under load
            wait_for(ready, timeout=900, interval=1.0, what="/readyz 200")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nipvsctl run's log:\n{log.read_text()}") from None
        yield proc, api
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        api.stop()


def test_ipvsctl_run_config_takes_over_a_kube_proxy_node(
    node: Node, client: Pod, tmp_path: Path
) -> None:
    pods = [node.make_pod("10.244.1.1", name="web-1"), node.make_pod("10.244.1.2", name="web-2")]
    kube_proxy_table(node, pods)
    held = client.connect(VIP, 80)  # through kube-proxy's table, before ipvsctl runs
    # and one through kube-proxy's leftover of a Service deleted before ipvsctl came
    stale = client.connect(STALE, 80)
    try:
        with takeover(node, pods, tmp_path) as (proc, api):
            # The Service's virtual server adopted as it was; the held connection lives on.
            assert weights(node)[f"{VIP}:80/TCP"] == {f"{p.ip}:8080": 1 for p in pods}
            assert held.echo("still served after the takeover")
            assert {client.request(VIP, 80, reset=True) for _ in range(4)} == {p.name for p in pods}
            # kube-proxy's leftover of a deleted Service drains as a deleted Service's: its
            # connection lives on, new ones are refused...
            assert weights(node)[f"{STALE}:80/TCP"] == {f"{pods[0].ip}:8080": 0}
            assert stale.echo("still served while it drains")
            # ...and it goes once that connection has closed
            stale.abort()
            wait_for(
                lambda: f"{STALE}:80/TCP" not in weights(node), timeout=300, what="stale VS gone"
            )
            # ...while the virtual server in ipvs.excludeCIDRs is never touched.
            assert weights(node)[f"{OTHER}:80/TCP"] == {f"{pods[1].ip}:8080": 1}
            # Ready means listed: the fake answers 401 to any request without the
            # tokenFile's token, so the kubeconfig's tokenFile authenticated them.
            assert api.count("list") >= 2
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(120) == 0, proc.log.read_text()
            assert f"{VIP}:80/TCP" in weights(node)  # nothing flushed on exit
    finally:
        held.close()
        stale.close()


def refused(client: Pod, address: str, port: int) -> bool:
    try:
        client.request(address, port, reset=True)
    except ConnectionRefusedError:
        return True
    return False


def test_rollback_to_kube_proxy_leaves_its_table_and_nothing_of_ipvsctl_that_filters(
    node: Node, client: Pod, tmp_path: Path
) -> None:
    """A node handed back to kube-proxy: ipvsctl's pod gone (SIGTERM: it leaves its table),
    kube-proxy back, which adds a new port to an existing Service IP. ipvsctl's frozen port
    filter rejects it until `ipvsctl cleanup --rollback`, which removes that filter and the
    drain state and nothing else: kube-proxy's virtual servers, kube-ipvs0, a connection
    held throughout and kube-proxy's own nftables table stay.

    The held connection comes from outside the cluster CIDR, so ipvsctl masqueraded it. Its
    translation lives in its conntrack entry, which the kernel applies only while some NAT
    chain of the family is hooked: with ipvsctl's the only one (kube-proxy not synced yet),
    deleting the whole table stopped the connection. The first cleanup keeps that chain,
    empty; the second, once kube-proxy's NAT chains exist, deletes the table."""
    pods = [node.make_pod("10.244.1.1", name="web-1"), node.make_pod("10.244.1.2", name="web-2")]
    kube_proxy_table(node, pods)
    # kube-proxy's nftables table (its nftables mode's; any other program's is the same)
    node.run("nft", "add", "table", "ip", "kube-proxy")
    node.run("nft", "add", "chain", "ip", "kube-proxy", "services")
    state = tmp_path / "state"
    with takeover(node, pods, tmp_path) as (proc, _):
        held = client.connect(VIP, 80)  # through the table ipvsctl took over
        proc.send_signal(signal.SIGTERM)  # the node labelled back: ipvsctl's pod goes
        assert proc.wait(120) == 0, proc.log.read_text()

    def rollback() -> str:
        return sh(
            "ip", "netns", "exec", node.name, str(BIN / "ipvsctl"), "cleanup", "--rollback",
            "--state-dir", str(state), timeout=600,
        )  # fmt: skip

    try:
        assert (state / "drain-queue.json").exists()
        # kube-proxy returns and programs the Service's new port on the same address
        pods[0].serve("tcp", 8081)
        node.run("ipvsadm", "-A", "-t", f"{VIP}:81", "-s", "rr")
        node.run("ipvsadm", "-a", "-t", f"{VIP}:81", "-r", f"{pods[0].ip}:8081", "-m", "-w", "1")
        table_before, bound_before = weights(node), node.interface_addresses()
        assert {VIP, OTHER} <= bound_before
        assert refused(client, VIP, 81)  # ipvsctl's frozen port filter: the bug left behind

        out = rollback()  # no NAT chain of kube-proxy's yet: ipvsctl's stays, empty
        assert "emptied nftables table inet ipvsctl but for its NAT chain" in out, out
        assert out.splitlines()[-1] == (
            "cleanup (rollback) done: nftables table (its empty NAT chain kept), drain queue state"
        )
        ours = node.run("nft", "list", "table", "inet", "ipvsctl")
        assert "chain nat-postrouting" in ours and ours.count("chain ") == 1, ours
        assert "set " not in ours and "map " not in ours and "ip daddr" not in ours, ours
        assert not (state / "drain-queue.json").exists()
        assert weights(node) == table_before  # kube-proxy's table, untouched
        assert node.interface_addresses() == bound_before  # kube-ipvs0 too
        assert client.request(VIP, 81, reset=True) == "web-1"  # the new port answers
        assert held.echo("the connection lives through the rollback")

        # kube-proxy's first sync: its iptables nat tables (here as nftables NAT chains)
        for family in ("ip", "ip6"):
            node.run("nft", "add", "table", family, "kube-proxy")
            node.run(
                "nft", "add", "chain", family, "kube-proxy", "nat-postrouting",
                "{ type nat hook postrouting priority srcnat ; }",
            )  # fmt: skip
        out = rollback()
        assert out.splitlines() == [
            "deleted nftables table inet ipvsctl",
            "cleanup (rollback) done: nftables table",
        ], out
        tables = node.run("nft", "list", "tables").splitlines()
        assert "table inet ipvsctl" not in tables and "table ip kube-proxy" in tables
        assert weights(node) == table_before
        assert held.echo("and through the table's deletion")
    finally:
        held.close()

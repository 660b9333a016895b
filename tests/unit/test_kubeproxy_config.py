"""`ipvsctl run --config`: kube-proxy's KubeProxyConfiguration (CONTRACT.md "Configuration
file"). The real files users have, each accepted or refused as the table says; hostile ones
with one line and exit 2; flags on the command line win over the file."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

import ipvsctl.daemon.wiring
import ipvsctl.kernel.netlink.addresses
import ipvsctl.obs.logging
from ipvsctl.cli.app import app
from ipvsctl.daemon.config_file import CONFIG_MAX_BYTES
from ipvsctl.daemon.options import NodeIPs
from ipvsctl.kernel.procfs.sysctl import STRICT_ARP_SYSCTLS, wanted_sysctls
from ipvsctl.model import ServiceKey
from ipvsctl.plan.ownership import is_owned
from ipvsctl.source.kubeproxy_config import FIELDS, Kind, KubeProxyConfigError, translate

CORPUS = Path(__file__).resolve().parents[1] / "data" / "kube-proxy"


def config_text(name: str) -> str:
    """A corpus file's KubeProxyConfiguration: the file, or a ConfigMap's config.conf."""
    text = (CORPUS / name).read_text()
    doc = yaml.safe_load(text)
    return doc["data"]["config.conf"] if doc.get("kind") == "ConfigMap" else text


def invoke(monkeypatch, tmp_path, config_body: str | None, *args: str, env=None):
    """`ipvsctl run --config FILE ...` up to the daemon, which is replaced by a recorder."""
    seen = []
    monkeypatch.setattr(
        ipvsctl.kernel.netlink.addresses,
        "node_addresses",
        lambda exclude_interfaces=(): ["192.0.2.10", "10.1.2.3", "2001:db8::10"],
    )
    monkeypatch.setattr(ipvsctl.daemon.wiring, "run", lambda opts: seen.append(opts) or 0)
    monkeypatch.setattr(ipvsctl.obs.logging, "setup", lambda fmt="text", level=logging.INFO: None)
    extra = []
    if config_body is not None:
        path = tmp_path / "config.conf"
        path.write_text(config_body)
        extra = ["--config", str(path)]
    r = CliRunner().invoke(
        app,
        ["run", "--manifests", str(tmp_path), "--state-dir", str(tmp_path / "s"), *extra, *args],
        env=env or {},
    )
    return r, (seen[0] if seen else None)


# --- the corpus ------------------------------------------------------------------------

ACCEPTED = {
    "kubeadm-v1.23.configmap.yaml": dict(cluster_cidrs=("10.244.0.0/16",), scheduler="rr"),
    "kubeadm-v1.28.configmap.yaml": dict(cluster_cidrs=("10.244.0.0/16",), strict_arp=True),
    "kubeadm-v1.30.configmap.yaml": dict(cluster_cidrs=("10.244.0.0/16",)),
    "kubeadm-v1.33.configmap.yaml": dict(cluster_cidrs=("10.244.0.0/16", "fd00:10:244::/56")),
    "eks-ipvs.conf": dict(cluster_cidrs=(), scheduler="rr"),
    "kubespray-ipvs.conf": dict(
        cluster_cidrs=("10.233.64.0/18",),
        strict_arp=True,
        exclude_cidrs=("10.0.50.0/24", "192.168.100.0/24"),
        node_name="node1",
    ),
    "kops-ipvs.conf": dict(
        cluster_cidrs=("100.96.0.0/11",),
        scheduler="lc",
        masquerade_all=True,
        tcp_timeout=900,
        tcpfin_timeout=30,
        udp_timeout=300,
        node_name="ip-172-20-45-10.eu-west-1.compute.internal",
    ),
}
REFUSED = {"eks-iptables.conf": "mode"}
# the options group each checked field is in
GROUP = {
    "cluster_cidrs": "netfilter",
    "masquerade_all": "netfilter",
    "strict_arp": "kernel",
    "exclude_cidrs": "kernel",
    "tcp_timeout": "kernel",
    "tcpfin_timeout": "kernel",
    "udp_timeout": "kernel",
}


def test_the_corpus_is_all_listed():
    assert {p.name for p in CORPUS.iterdir()} == set(ACCEPTED) | set(REFUSED)


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_real_world_files_are_accepted(monkeypatch, tmp_path, name):
    r, opts = invoke(monkeypatch, tmp_path, config_text(name))
    assert r.exit_code == 0, r.output
    want = ACCEPTED[name]
    for key, value in want.items():
        if key == "node_name":
            assert opts.node.node_name == value
        elif key == "scheduler":
            assert opts.node.default_scheduler == value
        else:
            group = GROUP[key]
            assert getattr(getattr(opts, group), key) == value, key
    if "kubeadm" in name:  # kubeadm's kubeconfig, beside config.conf in the pod
        assert opts.source.kubeconfig == "/var/lib/kube-proxy/kubeconfig.conf"


@pytest.mark.parametrize(("name", "field"), sorted(REFUSED.items()))
def test_real_world_files_of_other_modes_are_refused(monkeypatch, tmp_path, name, field):
    r, opts = invoke(monkeypatch, tmp_path, config_text(name))
    assert r.exit_code == 2 and opts is None
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and f": {field}: " in lines[0], r.output


# --- the table, field by field --------------------------------------------------------

BASE = {"apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration"}


def with_field(path: str, value) -> dict:
    doc: dict = dict(BASE)
    node = doc
    *parents, leaf = path.split(".")
    for p in parents:
        node = node.setdefault(p, {})
    node[leaf] = value
    return doc


@pytest.mark.parametrize("f", FIELDS, ids=lambda f: f.path)
def test_every_field_takes_the_empty_value_kubeadm_writes(f):
    """null is what kubeadm writes for an unset pointer field, and what an empty value in
    kubespray's template becomes: never refused (kube-proxy's default), never noted."""
    if f.path in ("apiVersion", "kind"):
        return
    s = translate(with_field(f.path, None))
    assert s.notes == [] and s.flags == {}


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("mode", "iptables"),
        ("mode", "nftables"),
        ("mode", "kernelspace"),
        ("detectLocalMode", "NodeCIDR"),
        ("detectLocalMode", "BridgeInterface"),
        ("detectLocalMode", "InterfaceNamePrefix"),
        ("enableProfiling", True),
        ("apiVersion", "kubeproxy.config.k8s.io/v1alpha2"),
        ("apiVersion", "v1"),
        ("kind", "KubeletConfiguration"),
        ("nodePortAddresses", ["primary"]),
        ("nodePortAddresses", ["10.0.0.0/8", "localhost"]),
        ("ipvs.scheduler", "fair"),
        ("logging.format", "xml"),
    ],
)
def test_behaviours_ipvsctl_lacks_are_refused_naming_the_field(path, value):
    with pytest.raises(KubeProxyConfigError) as err:
        translate(with_field(path, value))
    assert err.value.path == path and str(err.value).startswith(f"{path}: ")


@pytest.mark.parametrize(
    ("path", "value"),
    [("mode", ""), ("mode", "ipvs"), ("detectLocalMode", ""), ("detectLocalMode", "ClusterCIDR")],
)
def test_kube_proxys_defaults_of_refused_fields_are_accepted(path, value):
    translate(with_field(path, value))
    translate(with_field("enableProfiling", False))


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("mode", 1),
        ("ipvs", "rr"),
        ("ipvs.strictARP", "true"),
        ("ipvs.tcpTimeout", 900),
        ("ipvs.tcpTimeout", "15 minutes"),
        ("ipvs.tcpTimeout", "-5s"),
        ("ipvs.excludeCIDRs", "10.0.0.0/8"),
        ("ipvs.excludeCIDRs", ["not-a-cidr"]),
        ("clusterCIDR", ["10.244.0.0/16"]),
        ("clusterCIDR", "10.244.0.0/16,bogus"),
        ("oomScoreAdj", "-999"),
        ("oomScoreAdj", 2**40),
        ("clientConnection.qps", "5"),
        ("featureGates", {"Foo": "yes"}),
        ("featureGates", ["Foo"]),
        ("conntrack.maxPerCore", True),
    ],
)
def test_wrong_types_are_refused_naming_the_field(path, value):
    with pytest.raises(KubeProxyConfigError) as err:
        translate(with_field(path, value))
    assert err.value.path == path


@pytest.mark.parametrize(
    "path", ["ipvs.strictArp", "bogus", "conntrack.maxPerCPU", "ipvs.tcpTimeout.x"]
)
def test_unknown_fields_are_refused(path):
    doc = with_field(path, 1) if path != "ipvs.tcpTimeout.x" else with_field("ipvs.tcpTimeout", {})
    with pytest.raises(KubeProxyConfigError) as err:
        translate(doc)
    assert err.value.path.startswith(path.split(".x")[0])


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("conntrack.maxPerCore", 131072),
        ("featureGates", {"KubeProxyIPVS": True}),
        ("oomScoreAdj", -999),
        ("iptables.syncPeriod", "30s"),
        ("winkernel.enableDSR", True),
        ("metricsBindAddress", "0.0.0.0:10249"),
        ("logging.flushFrequency", 5000000000),
        ("logging.options", {"json": {"infoBufferSize": "0"}}),
    ],
)
def test_process_and_other_mode_settings_are_accepted_with_a_note(path, value):
    s = translate(with_field(path, value))
    assert [n for n, _ in s.notes] == [path] and s.flags == {}


def test_sets_fields_reach_their_flags():
    s = translate(
        {
            **BASE,
            "clientConnection": {"kubeconfig": "/k"},
            "hostnameOverride": "n1",
            "healthzBindAddress": "0.0.0.0:10256",
            "clusterCIDR": "10.0.0.0/8, fd00::/64",
            "iptables": {"masqueradeAll": True},
            "ipvs": {
                "scheduler": "sh",
                "tcpTimeout": "15m",
                "tcpFinTimeout": "1m30s",
                "udpTimeout": "300ms",
                "excludeCIDRs": ["192.0.2.0/24"],
                "strictARP": True,
            },
            "logging": {"format": "json", "verbosity": 4},
            "nodePortAddresses": ["10.1.0.0/16"],
        }
    )
    assert s.flags == {
        "kubeconfig": "/k",
        "node_name": "n1",
        "healthz_bind_address": "0.0.0.0:10256",
        "cluster_cidr": ["10.0.0.0/8", "fd00::/64"],
        "masquerade_all": True,
        "scheduler": "sh",
        "ipvs_tcp_timeout": "900",
        "ipvs_tcpfin_timeout": "90",
        "ipvs_udp_timeout": "0.3",
        "log_format": "json",
        "log_level": "debug",
    }
    assert s.exclude_cidrs == ("192.0.2.0/24",) and s.strict_arp
    assert s.node_port_cidrs == ("10.1.0.0/16",)


# --- hostile files ---------------------------------------------------------------------

HOSTILE = {
    "malformed": "apiVersion: [unclosed\nkind: x\n",
    "tabs": "apiVersion:\tkubeproxy.config.k8s.io/v1alpha1\n\tkind: x\n",
    "deep": "apiVersion: " + "[" * 5000 + "]" * 5000 + "\n",
    "deep-block": "".join("  " * i + f"k{i}:\n" for i in range(200)) + "  " * 200 + "v\n",
    "aliases": "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
    + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, "
        f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
        f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n"
        for i in range(8)
    ),
    "two-documents": "apiVersion: a\n---\napiVersion: b\n",
    "empty": "",
    "a-list": "- apiVersion: kubeproxy.config.k8s.io/v1alpha1\n",
    "a-string": "just text\n",
    "python-tag": "!!python/object/apply:os.system ['true']\n",
    "unknown-field": yaml.safe_dump({**BASE, "proxyMode": "ipvs"}),
    "mode-iptables": yaml.safe_dump({**BASE, "mode": "iptables"}),
    "wrong-type": yaml.safe_dump({**BASE, "ipvs": {"tcpTimeout": 900}}),
    "no-kind": "apiVersion: kubeproxy.config.k8s.io/v1alpha1\n",
    "non-string-key": "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
    "1: 2\n",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_files_are_one_line_and_exit_2(monkeypatch, tmp_path, name):
    r, opts = invoke(monkeypatch, tmp_path, HOSTILE[name])
    assert r.exit_code == 2 and opts is None, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ipvsctl: --config "), r.output


def test_a_huge_file_is_refused_unread(monkeypatch, tmp_path):
    r, opts = invoke(monkeypatch, tmp_path, "# " + "x" * CONFIG_MAX_BYTES + "\n")
    assert r.exit_code == 2 and opts is None
    assert "larger than" in r.output and len(r.output.strip().splitlines()) == 1


def test_binary_and_missing_files_are_one_line(monkeypatch, tmp_path):
    (tmp_path / "bin.conf").write_bytes(b"\xff\xfe\x00garbage")
    for path in (tmp_path / "bin.conf", tmp_path / "missing.conf", tmp_path):
        r, opts = invoke(monkeypatch, tmp_path, None, "--config", str(path))
        assert r.exit_code == 2 and opts is None
        assert len(r.output.strip().splitlines()) == 1, r.output


# --- the command line wins ------------------------------------------------------------

FILE = yaml.safe_dump(
    {
        **BASE,
        "clientConnection": {"kubeconfig": "/var/lib/kube-proxy/kubeconfig.conf"},
        "hostnameOverride": "from-file",
        "clusterCIDR": "10.244.0.0/16",
        "iptables": {"masqueradeAll": True},
        "ipvs": {"scheduler": "lc", "tcpTimeout": "15m0s", "excludeCIDRs": ["10.96.99.0/24"]},
        "logging": {"format": "json"},
        "healthzBindAddress": "127.0.0.1:10256",
        "nodePortAddresses": ["10.0.0.0/8"],
    }
)


def test_the_file_alone(monkeypatch, tmp_path):
    r, o = invoke(monkeypatch, tmp_path, FILE)
    assert r.exit_code == 0, r.output
    assert o.source.kubeconfig == "/var/lib/kube-proxy/kubeconfig.conf"
    assert o.node.node_name == "from-file" and o.node.default_scheduler == "lc"
    assert o.netfilter.cluster_cidrs == ("10.244.0.0/16",) and o.netfilter.masquerade_all
    assert o.kernel.tcp_timeout == 900 and o.http.healthz_bind_address == "127.0.0.1:10256"
    assert o.kernel.exclude_cidrs == ("10.96.99.0/24",)
    assert o.node.node_ips == ("10.1.2.3",) and o.node_ips.cidrs == ("10.0.0.0/8",)


@pytest.mark.parametrize(
    ("args", "env", "check"),
    [
        # a plain value flag
        (["--scheduler", "wrr"], {}, lambda o: o.node.default_scheduler == "wrr"),
        (["--healthz-bind-address", ""], {}, lambda o: o.http.healthz_bind_address == ""),
        # a duration flag, even when it says the flag's default
        (["--ipvs-tcp-timeout", "0"], {}, lambda o: o.kernel.tcp_timeout == 0),
        # a repeatable flag: the command line's list replaces the file's, not merged
        (
            ["--cluster-cidr", "10.0.0.0/16", "--cluster-cidr", "fd00::/64"],
            {},
            lambda o: o.netfilter.cluster_cidrs == ("10.0.0.0/16", "fd00::/64"),
        ),
        # an on/off flag, both ways
        (["--no-masquerade-all"], {}, lambda o: o.netfilter.masquerade_all is False),
        (["--masquerade-all"], {}, lambda o: o.netfilter.masquerade_all is True),
        # the flag's environment variable (the DaemonSet's NODE_NAME from spec.nodeName)
        ([], {"NODE_NAME": "from-env"}, lambda o: o.node.node_name == "from-env"),
        (["--node-name", "from-flag"], {}, lambda o: o.node.node_name == "from-flag"),
        ([], {"KUBECONFIG": "/env-kc"}, lambda o: o.source.kubeconfig == "/env-kc"),
        # --node-ip replaces nodePortAddresses' selection
        (["--node-ip", "192.0.2.10"], {}, lambda o: o.node.node_ips == ("192.0.2.10",)),
    ],
)
def test_the_command_line_wins(monkeypatch, tmp_path, args, env, check):
    r, o = invoke(monkeypatch, tmp_path, FILE, *args, env=env)
    assert r.exit_code == 0, r.output
    assert check(o)


def test_log_format_flag_wins(monkeypatch, tmp_path):
    formats = []
    monkeypatch.setattr(
        ipvsctl.obs.logging, "setup", lambda fmt="text", level=logging.INFO: formats.append(fmt)
    )
    monkeypatch.setattr(ipvsctl.daemon.wiring, "run", lambda opts: 0)
    path = tmp_path / "c.conf"
    path.write_text(FILE)
    base = ["run", "--manifests", str(tmp_path), "--state-dir", str(tmp_path / "s")]
    for extra in ([], ["--log-format", "text"]):
        r = CliRunner().invoke(app, [*base, "--config", str(path), *extra], env={})
        assert r.exit_code == 0, r.output
    assert formats == ["json", "text"]


def test_a_relative_kubeconfig_is_beside_the_file(monkeypatch, tmp_path):
    body = yaml.safe_dump({**BASE, "clientConnection": {"kubeconfig": "kubeconfig.conf"}})
    r, o = invoke(monkeypatch, tmp_path, body)
    assert r.exit_code == 0 and o.source.kubeconfig == str(tmp_path / "kubeconfig.conf")


def test_noted_fields_are_logged_once_each(monkeypatch, tmp_path, caplog):
    body = yaml.safe_dump({**BASE, "oomScoreAdj": -999, "conntrack": {"maxPerCore": 32768}})
    with caplog.at_level(logging.INFO, logger="ipvsctl.config"):
        r, _ = invoke(monkeypatch, tmp_path, body)
    assert r.exit_code == 0
    noted = [rec.fields["field"] for rec in caplog.records if rec.name == "ipvsctl.config"]
    assert sorted(noted) == ["conntrack.maxPerCore", "oomScoreAdj"]


# --- what the settings without a flag do ------------------------------------------------


def test_exclude_cidrs_are_never_owned():
    bound = {"10.96.0.10", "10.96.99.5"}
    key = ServiceKey("TCP", "10.96.99.5", 80)
    assert is_owned(key, bound, ())
    assert not is_owned(key, bound, (), excluded=("10.96.99.0/24",))
    assert is_owned(ServiceKey("TCP", "10.96.0.10", 80), bound, (), excluded=("10.96.99.0/24",))
    node_port = ServiceKey("TCP", "192.0.2.10", 30080)
    assert not is_owned(node_port, (), {"192.0.2.10"}, excluded=("192.0.2.0/24",))


def test_strict_arp_adds_the_arp_sysctls():
    assert STRICT_ARP_SYSCTLS.items() <= wanted_sysctls("6.1.0", strict_arp=True).items()
    assert not STRICT_ARP_SYSCTLS.keys() & wanted_sysctls("6.1.0").keys()


def test_kinds_are_three():
    assert {f.kind for f in FIELDS} == set(Kind)


def test_node_port_addresses_filter_the_followed_addresses(monkeypatch):
    """nodePortAddresses CIDRs select the node addresses at start-up and while running."""
    from ipvsctl.daemon.adapters import node_ips_reader
    from ipvsctl.daemon.options import DaemonOptions
    from ipvsctl.model import NodeContext

    addresses = ["192.0.2.10", "10.1.2.3", "2001:db8::10"]
    monkeypatch.setattr(
        ipvsctl.kernel.netlink.addresses,
        "node_addresses",
        lambda exclude_interfaces=(): list(addresses),
    )
    node = NodeContext("n")
    read = node_ips_reader(
        DaemonOptions(node, node_ips=NodeIPs(follow=True, cidrs=("10.0.0.0/8", "2001:db8::/32")))
    )
    assert read is not None and read() == ["10.1.2.3", "2001:db8::10"]
    addresses.append("10.9.9.9")
    assert read() == ["10.1.2.3", "2001:db8::10", "10.9.9.9"]
    everything = node_ips_reader(DaemonOptions(node, node_ips=NodeIPs(follow=True)))
    assert everything is not None and everything() == addresses

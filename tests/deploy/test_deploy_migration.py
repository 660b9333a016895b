"""The migration guides against the real program and against the proxies they replace.

- every ipvsctl flag (and env var, and `ipvsctl.io/` annotation) named as an equivalent in
  the mapping tables exists in the CLI (in the command the cell names, else `run`);
- every row gives an equivalent or, for "none", says why (its notes cell is not empty);
- every flag of kube-proxy and of kube-router (copied below from their code) is in its
  guide, and every kube-router annotation and Kubernetes label ipvsctl's code recognises is
  in a guide's table.
"""

from __future__ import annotations

import re

import pytest

from ipvsctl.source import convert, node

from .helpers import REPO

KUBE_ROUTER_GUIDE = REPO / "docs" / "migrating-from-kube-router.md"
KUBE_PROXY_GUIDE = REPO / "docs" / "migrating-from-kube-proxy.md"
GUIDES = (KUBE_ROUTER_GUIDE, KUBE_PROXY_GUIDE)

# kube-proxy's flags: kubernetes/kubernetes cmd/kube-proxy/app/options.go `AddFlags` (commit
# 008b3652959c), the logging flags it adds (`logsapi.AddFlags`, k8s.io/component-base/logs),
# the Windows-only `addOSFlags` (init_windows.go), and the command's --version and --help.
KUBE_PROXY_FLAGS = (
    "--config",
    "--write-config-to",
    "--cleanup",
    "--feature-gates",
    "--kubeconfig",
    "--master",
    "--kube-api-content-type",
    "--kube-api-burst",
    "--kube-api-qps",
    "--hostname-override",
    "--bind-address",
    "--healthz-bind-address",
    "--metrics-bind-address",
    "--bind-address-hard-fail",
    "--profiling",
    "--show-hidden-metrics-for-version",
    "--init-only",
    "--proxy-mode",
    "--iptables-masquerade-bit",
    "--masquerade-all",
    "--iptables-localhost-nodeports",
    "--iptables-sync-period",
    "--iptables-min-sync-period",
    "--ipvs-sync-period",
    "--ipvs-min-sync-period",
    "--ipvs-scheduler",
    "--ipvs-exclude-cidrs",
    "--ipvs-strict-arp",
    "--ipvs-tcp-timeout",
    "--ipvs-tcpfin-timeout",
    "--ipvs-udp-timeout",
    "--detect-local-mode",
    "--pod-bridge-interface",
    "--pod-interface-name-prefix",
    "--cluster-cidr",
    "--nodeport-addresses",
    "--oom-score-adj",
    "--conntrack-max-per-core",
    "--conntrack-min",
    "--conntrack-tcp-timeout-established",
    "--conntrack-tcp-timeout-close-wait",
    "--conntrack-tcp-be-liberal",
    "--conntrack-udp-timeout",
    "--conntrack-udp-timeout-stream",
    "--config-sync-period",
    "--healthz-port",
    "--metrics-port",
    "--logging-format",
    "--log-flush-frequency",
    "-v",
    "--vmodule",
    "--log-text-split-stream",
    "--log-text-info-buffer-size",
    "--log-json-split-stream",
    "--log-json-info-buffer-size",
    "--windows-service",
    "--source-vip",
    "--network-name",
    "--enable-dsr",
    "--version",
    "--help",
)

# kube-router's flags: cloudnativelabs/kube-router v2.11 pkg/options/options.go `AddFlags`.
KUBE_ROUTER_FLAGS = (
    "--advertise-cluster-ip",
    "--advertise-external-ip",
    "--advertise-loadbalancer-ip",
    "--advertise-pod-cidr",
    "--auto-mtu",
    "--bfd-desired-min-tx-interval",
    "--bfd-detection-multiplier",
    "--bfd-port",
    "--bfd-required-min-rx-interval",
    "--bgp-graceful-restart",
    "--bgp-graceful-restart-deferral-time",
    "--bgp-graceful-restart-time",
    "--bgp-holdtime",
    "--bgp-port",
    "--cache-sync-timeout",
    "--cleanup-config",
    "--cluster-asn",
    "--disable-source-dest-check",
    "--enable-bfd",
    "--enable-cni",
    "--enable-ibgp",
    "--enable-ipv4",
    "--enable-ipv6",
    "--enable-overlay",
    "--enable-pod-egress",
    "--enable-pprof",
    "--excluded-cidrs",
    "--hairpin-mode",
    "--gobgp-admin-address",
    "--gobgp-admin-port",
    "--health-addr",
    "--health-port",
    "--help",
    "--hostname-override",
    "--injected-routes-sync-period",
    "--iptables-sync-period",
    "--ipvs-graceful-period",
    "--ipvs-graceful-termination",
    "--ipvs-permit-all",
    "--ipvs-sync-period",
    "--kubeconfig",
    "--loadbalancer-default-class",
    "--loadbalancer-ip-range",
    "--loadbalancer-sync-period",
    "--masquerade-all",
    "--master",
    "--metrics-path",
    "--metrics-port",
    "--metrics-addr",
    "--netpol-default-deny",
    "--nodeport-bindon-all-ip",
    "--nodes-full-mesh",
    "--overlay-encap",
    "--overlay-encap-port",
    "--overlay-type",
    "--override-nexthop",
    "--peer-router-asns",
    "--peer-router-ips",
    "--peer-router-multihop-ttl",
    "--peer-router-passwords",
    "--peer-router-passwords-file",
    "--peer-router-ports",
    "--router-id",
    "--routes-sync-period",
    "--run-firewall",
    "--run-loadbalancer",
    "--run-router",
    "--run-service-proxy",
    "--runtime-endpoint",
    "--service-cluster-ip-range",
    "--strict-external-ip-validation",
    "--service-external-ip-range",
    "--service-node-port-range",
    "--service-tcp-timeout",
    "--service-tcpfin-timeout",
    "--service-udp-timeout",
    "-v",
    "--use-nftables-for-netpol",
    "--version",
)

# The annotations kube-router's service proxy reads (pkg/controllers/proxy, v2.11).
KUBE_ROUTER_PROXY_ANNOTATIONS = (
    "kube-router.io/service.dsr",
    "kube-router.io/service.scheduler",
    "kube-router.io/service.hairpin",
    "kube-router.io/service.hairpin.externalips",
    "kube-router.io/service.local",
    "kube-router.io/service.skiplbips",
    "kube-router.io/service.schedflags",
)

HEADER = re.compile(r"^\| kube-(?:router|proxy)[^|]*\| ipvsctl \| notes \|$")
FLAG = re.compile(r"(?<![\w-])(--?[a-z][a-z0-9-]*)")


def cells(line: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]


def mapping_rows(text: str) -> list[list[str]]:
    """The rows (old, ipvsctl, notes) of every `| kube-... | ipvsctl | notes |` table."""
    rows: list[list[str]] = []
    in_table = False
    for line in text.splitlines():
        if HEADER.match(line):
            in_table = True
        elif not line.startswith("|"):
            in_table = False
        elif in_table and not line.startswith("|---"):
            rows.append(cells(line))
    return rows


def cli() -> dict[str, tuple[set[str], set[str]]]:
    """(flags, env vars) by command ("" for `ipvsctl` itself), --help included."""
    import typer.main

    from ipvsctl.cli.app import app

    root = typer.main.get_command(app)
    out = {}
    for name, cmd in {"": root, **root.commands}.items():  # type: ignore[attr-defined]
        flags, envs = {"--help"}, set()
        for p in cmd.params:
            flags.update(o for o in (*p.opts, *p.secondary_opts) if o.startswith("-"))
            if p.envvar:
                envs.update([p.envvar] if isinstance(p.envvar, str) else p.envvar)
        out[name] = (flags, envs)
    return out


def unknown_in(cell: str, commands: dict[str, tuple[set[str], set[str]]]) -> list[str]:
    """The flags, env vars and ipvsctl.io/ annotations a cell names that do not exist. Each
    code span is read on its own: flags of the command it names (`ipvsctl cleanup
    --dry-run`, `ipvsctl --version`), else of `run`; an env var is a span that is only
    `NAME` or `NAME=value`, known to the CLI or set in the node-prep init container."""
    node_prep = (REPO / "daemonset" / "node-prep.sh").read_text()
    known = (
        set(convert.SCHEDULER_ANNOTATIONS)
        | set(convert.SCHED_FLAGS_ANNOTATIONS)
        | {convert.DRAIN_TIMEOUT_ANNOTATION}
    )
    all_envs = set().union(*(envs for _, envs in commands.values()))
    bad: list[str] = []
    for span in re.findall(r"`([^`]+)`", cell):
        named = [c for c in re.findall(r"\bipvsctl ([a-z][\w-]*)", span) if c in commands]
        if re.search(r"\bipvsctl --", span):
            named.append("")
        flags = set().union(*(commands[c][0] for c in named or ["run"]))
        bad += [f for f in FLAG.findall(span) if f not in flags]
        env = re.fullmatch(r"([A-Z][A-Z0-9_]{2,})(=\S*)?", span)
        if env and env.group(1) not in all_envs and env.group(1) not in node_prep:
            bad.append(env.group(1))
        bad += [a for a in re.findall(r"ipvsctl\.io/[\w.-]+", span) if a not in known]
    return bad


@pytest.mark.parametrize("guide", GUIDES, ids=lambda p: p.name)
def test_every_ipvsctl_equivalent_exists_in_the_cli(guide):
    commands = cli()
    rows = mapping_rows(guide.read_text())
    assert len(rows) >= 30, f"{guide.name}: mapping tables not found"
    for old, ipvsctl, _notes in rows:
        bad = unknown_in(ipvsctl, commands)
        assert not bad, f"{guide.name}, row {old!r}: ipvsctl has no {bad}"


@pytest.mark.parametrize("guide", GUIDES, ids=lambda p: p.name)
def test_every_row_gives_an_equivalent_or_a_reason(guide):
    for old, ipvsctl, notes in mapping_rows(guide.read_text()):
        assert ipvsctl, f"{guide.name}, row {old!r}: no ipvsctl equivalent given"
        if re.match(r"^(\*\*)?(none|not supported)\b", ipvsctl):
            assert len(notes) > 20, f"{guide.name}, row {old!r}: 'none' without a reason"


def test_the_check_catches_invented_flags_env_vars_and_annotations():
    commands = cli()
    assert unknown_in("`--drain-timeout`, `ipvsctl cleanup --dry-run`", commands) == []
    assert unknown_in("`--drain-timeout-max`", commands) == ["--drain-timeout-max"]
    assert unknown_in("`ipvsctl cleanup --drain-timeout`", commands) == ["--drain-timeout"]
    assert unknown_in("`IPVSCTL_NO_SUCH=1`", commands) == ["IPVSCTL_NO_SUCH"]
    assert unknown_in("`ipvsctl.io/weight`", commands) == ["ipvsctl.io/weight"]
    row = "| `--ipvs-scheduler` | `--schedular` | typo |"
    assert [
        unknown_in(r[1], commands)
        for r in mapping_rows("| kube-proxy flag | ipvsctl | notes |\n|---|---|---|\n" + row)
    ] == [["--schedular"]]


def first_column(guide) -> str:
    return "\n".join(r[0] for r in mapping_rows(guide.read_text()))


def test_every_kube_proxy_flag_is_in_the_kube_proxy_guide():
    listed = set(FLAG.findall(first_column(KUBE_PROXY_GUIDE)))
    missing = [f for f in KUBE_PROXY_FLAGS if f not in listed]
    assert not missing, f"kube-proxy flags not in {KUBE_PROXY_GUIDE.name}: {missing}"


def test_every_kube_router_flag_is_in_the_kube_router_guide():
    text = KUBE_ROUTER_GUIDE.read_text()
    section = text[
        text.index("## kube-router flags and annotations") : text.index("## Metrics and dashboards")
    ]
    # the proxy's flags in the table; the other controllers' in the paragraph after it
    listed = set(FLAG.findall(first_column(KUBE_ROUTER_GUIDE))) | set(
        re.findall(r"`(--[a-z][a-z0-9-]*)`", section)
    )
    missing = [f for f in KUBE_ROUTER_FLAGS if f not in listed]
    assert not missing, f"kube-router flags not in {KUBE_ROUTER_GUIDE.name}: {missing}"


def test_every_kube_router_annotation_ipvsctl_recognises_is_in_the_guide():
    recognised = {
        a
        for a in (
            *convert.KUBE_ROUTER_IGNORED,
            *convert.KUBE_ROUTER_HONOURED,
            *convert.SCHEDULER_ANNOTATIONS,
            *convert.SCHED_FLAGS_ANNOTATIONS,
        )
        if a.startswith("kube-router.io/")
    }
    assert recognised >= {"kube-router.io/service.dsr", "kube-router.io/service.scheduler"}
    listed = first_column(KUBE_ROUTER_GUIDE)
    missing = sorted(
        a for a in recognised | set(KUBE_ROUTER_PROXY_ANNOTATIONS) if f"`{a}" not in listed
    )
    assert not missing, f"not in {KUBE_ROUTER_GUIDE.name}'s table: {missing}"


def test_every_label_and_annotation_ipvsctl_reads_is_in_the_kube_proxy_guide():
    text = KUBE_PROXY_GUIDE.read_text()
    table = text[text.index("## Labels, annotations and Service fields") : text.index("## Metrics")]
    for name in (
        convert.SERVICE_PROXY_NAME_LABEL,
        convert.HEADLESS_LABEL,
        convert.SERVICE_NAME_LABEL,
        node.ZONE_LABEL,
        node.TO_BE_DELETED_TAINT,
        node.KARPENTER_DISRUPTED_TAINT,
        node.NETWORK_UNAVAILABLE,
        convert.DRAIN_TIMEOUT_ANNOTATION,
        *convert.SCHEDULER_ANNOTATIONS[:1],
        *convert.SCHED_FLAGS_ANNOTATIONS[:1],
    ):
        assert f"`{name}`" in table, f"{name} not in {KUBE_PROXY_GUIDE.name}'s table"


def test_readme_points_to_both_guides():
    readme = (REPO / "README.md").read_text()
    for guide in GUIDES:
        assert f"(docs/{guide.name})" in readme, guide.name


def config_file_rows() -> dict[str, tuple[str, str]]:
    """The kube-proxy guide's `| field | kind | ipvsctl |` table: {field: (kind, ipvsctl)}."""
    text = KUBE_PROXY_GUIDE.read_text()
    rows: dict[str, tuple[str, str]] = {}
    in_table = False
    for line in text.splitlines():
        if line.strip() == "| field | kind | ipvsctl |":
            in_table = True
        elif not line.startswith("|"):
            in_table = False
        elif in_table and not line.startswith("|---"):
            field, kind, ipvsctl = cells(line)
            name = field.strip("`")
            assert name not in rows, f"{name} twice"
            rows[name] = (kind, ipvsctl)
    return rows


def test_config_file_table_is_the_codes_table_both_ways():
    """docs/migrating-from-kube-proxy.md's configuration-file table lists exactly the code's
    fields (ipvsctl/source/kubeproxy_config.py FIELDS), each with the code's kind, the flag
    a "sets" field sets, and a refused field's accepted values."""
    from ipvsctl.source.kubeproxy_config import FIELDS, Kind

    rows = config_file_rows()
    code = {f.path: f for f in FIELDS}
    assert rows, "no configuration-file table in the kube-proxy guide"
    assert sorted(rows.keys() - code.keys()) == [], "in the docs, not in the code"
    assert sorted(code.keys() - rows.keys()) == [], "in the code, not in the docs"
    for path, (kind, ipvsctl) in rows.items():
        f = code[path]
        assert kind.split()[0] == f.kind.value, f"{path}: docs say {kind}, code {f.kind.value}"
        if f.kind is Kind.SETS and f.ipvsctl.startswith("--"):
            flag = f.ipvsctl.split()[0]
            assert f"`{flag}" in ipvsctl, f"{path}: the docs do not name {flag}"
        if f.kind is Kind.REFUSED:
            allowed = {str(a).lower() if isinstance(a, bool) else str(a) for a in f.allowed}
            said = set(re.findall(r"`([^`]*)`", kind)) | ({""} if "empty" in kind else set())
            assert said == allowed, f"{path}: docs accept {said}, code {allowed}"

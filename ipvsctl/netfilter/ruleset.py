"""The nftables ruleset ipvsctl owns, as text for `nft -f`: pure, no nft, no kernel.

One table, `inet ipvsctl`, for IPv4 and IPv6. What it does, for IPVS NAT traffic only:

- masquerades what kube-proxy masquerades (its IPVS mode's KUBE-MARK-MASQ and its nftables
  mode's mark-for-masquerade): traffic to a ClusterIP from outside the cluster CIDR
  (`--cluster-cidr`) or from the node itself, all ClusterIP traffic with `--masquerade-all`,
  all traffic to external IPs, load-balancer IPs and NodePorts of Services with
  `externalTrafficPolicy: Cluster` (the backend may be on another node: its answer must come
  back through this one), and for `externalTrafficPolicy: Local` only what the node itself
  sends (the client's address is kept);
- hairpin: a pod that reaches its own Service and lands on itself is masqueraded, else it
  would answer itself directly and the connection would never establish (kube-proxy's
  KUBE-LOOP-BACK set, which lists every endpoint; here one rule for all, no endpoint list).

Every decision is taken in one `nat` chain at postrouting, after IPVS picked the real
server, from the connection's original destination (`ct original ip daddr . proto-dst`: the
virtual server; IPVS with `net.ipv4.vs.conntrack=1` rewrites only the reply tuple). So no
packet mark bit is shared with other software, and no rule names an endpoint: the table's
contents are the chains (written once, from flags) plus one map element per virtual server,
`address . protocol . port : goto <policy chain>`. Endpoint changes never touch nftables;
virtual server changes are element adds and deletes.

Hairpin without an endpoint list: nftables cannot compare two packet fields, but a dynamic
set can. `update @hairpin4 { ip saddr . ip saddr }` stores (source, source); the lookup
`ip saddr . ip daddr @hairpin4` then matches exactly when destination == source. Elements
live seconds; nat chains see only a connection's first packet, so this costs one set update
per new service connection.

`loadBalancerSourceRanges` (as kube-proxy): new connections to a load-balancer IP of a
Service that lists ranges are dropped unless their source is in a range, checked before
IPVS sees them (input and output hooks at mangle priority; IPVS hooks later). Two sets per
family: `firewall` (the restricted address . protocol . port) and `firewall-allow` (those
with each allowed CIDR, an interval set). kube-proxy's special case is kept: when a range
holds one of the node's addresses, the node may reach the IP (its packets carry the IP
itself as source). This is the only thing ipvsctl drops, and only because a Service asks.

The virtual-IP port filter (kube-proxy's KUBE-IPVS-FILTER, kubernetes#72236): every address
ipvsctl binds on the dummy interface is a local address of the node, so without it sshd, the
kubelet or any host listener would answer on every ClusterIP, external IP and load-balancer
IP, from pods and from outside. New TCP, UDP and SCTP connections to such an address at a
protocol and port that is no virtual server are rejected at the input hook (which the node's
own traffic to a local address also crosses, as with kube-proxy's INPUT rule); replies and
established connections (not `ct state new`), ICMP, and node addresses (NodePorts) are not
touched. Two sets per family: `vips` (the bound addresses) and `vip-ports` (their address .
protocol . port virtual servers, plus the healthCheckNodePort on load-balancer IPs, which some
clouds probe at the load-balancer IP). Several virtual servers share an address, so these
sets are counted (`filter_counts`) and an element leaves only with its last user.

The hold rules (docs/netfilter.md "The hold rules"): when another program flushes IPVS
(kube-proxy's start-up cleanup: `ipvsadm -C`, then kube-ipvs0 deleted) the kernel unregisters
IPVS's hooks with a family's last virtual server; until the daemon puts the table back, a
backend's replies would leave un-NATed and packets to a virtual server would reach the
node's stack or be routed away, and each would be answered by a reset. Three chains, each
after IPVS's hook at its hook, drop what IPVS did not take for a virtual server's
connection, so TCP retransmits it into the restored table: one set per family,
`virtual-servers` (address . protocol . port of every virtual server, draining ones too).
While the table is whole they match nothing: IPVS rewrites every reply, takes (or refuses)
every request and SYN to a virtual server, and a virtual IP is local, never forwarded.
Connections another proxy DNATs beside IPVS (`ct status dnat`) are never held.

No accept rules and no drop policy: an `accept` in one nftables table does not overrule a
`drop` in another, so accept rules here could not help a host firewall with a drop policy
(docs/netfilter.md says what to allow there).
"""

from __future__ import annotations

import ipaddress
from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from ipvsctl.model import (
    DesiredService,
    DesiredVirtualServer,
    ServiceKey,
    VirtualServerKind,
)

FAMILY = "inet"
TABLE = "ipvsctl"
HAIRPIN_TIMEOUT = 10  # seconds an (address, address) pair stays in the hairpin set
HAIRPIN_SIZE = 65535
MASQUERADE = "masquerade fully-random"


class Verdict(StrEnum):
    """The policy chain a virtual server's traffic goes to (the map element's value)."""

    CLUSTER_IP = "cluster-ip"
    EXTERNAL = "external"  # externalTrafficPolicy: Cluster
    EXTERNAL_LOCAL = "external-local"  # externalTrafficPolicy: Local


def verdict_for(dvs: DesiredVirtualServer) -> Verdict:
    if dvs.kind is VirtualServerKind.CLUSTER_IP:
        return Verdict.CLUSTER_IP  # internalTrafficPolicy changes endpoints, not SNAT
    return Verdict.EXTERNAL_LOCAL if dvs.local_only else Verdict.EXTERNAL


@dataclass(frozen=True, slots=True)
class Element:
    """What one virtual server has in the table: its map element's verdict and, for a
    load-balancer IP with `loadBalancerSourceRanges`, the CIDRs allowed to reach it (None:
    open to all; empty: closed to all)."""

    verdict: Verdict
    source_ranges: tuple[str, ...] | None = None
    vip: bool = False  # the address is on the dummy interface: the port filter covers it
    health_port: int | None = None  # a load-balancer IP's healthCheckNodePort, let through


Elements = Mapping[ServiceKey, Element]


def element_for(
    dvs: DesiredVirtualServer, health_port: int | None = None, node_ips: Collection[str] = ()
) -> Element:
    """`node_ips`: an external or load-balancer IP that is also one of the node's own
    addresses stays out of the port filter (else sshd on the node's address would be
    refused; kube-proxy does not even bind such an address)."""
    ranges = dvs.source_ranges
    lb = dvs.kind is VirtualServerKind.LOAD_BALANCER
    vip = dvs.kind.binds_address and dvs.key.address not in node_ips
    return Element(
        verdict_for(dvs),
        None if ranges is None else collapse_cidrs(ranges),
        vip,
        health_port if lb else None,
    )


def collapse_cidrs(cidrs: Iterable[str]) -> tuple[str, ...]:
    """Sorted, without overlaps: overlapping intervals for one key are an nft error."""
    nets = [ipaddress.ip_network(c, strict=False) for c in cidrs]
    v4 = [n for n in nets if isinstance(n, ipaddress.IPv4Network)]
    v6 = [n for n in nets if isinstance(n, ipaddress.IPv6Network)]
    return (
        *(n.compressed for n in ipaddress.collapse_addresses(v4)),
        *(n.compressed for n in ipaddress.collapse_addresses(v6)),
    )


def service_elements(
    desired: DesiredService | None, node_ips: Collection[str] = ()
) -> dict[ServiceKey, Element]:
    """The table elements one Service needs: one per virtual server."""
    if desired is None:
        return {}
    hcnp = desired.health_check_node_port
    return {key: element_for(dvs, hcnp, node_ips) for key, dvs in desired.virtual_servers.items()}


def parse_cidrs(texts: Iterable[str]) -> tuple[str, ...]:
    """Normalized CIDRs (host bits cleared), in the order given, without duplicates;
    ValueError names the bad one."""
    out: list[str] = []
    for text in texts:
        try:
            if "%" in text:  # a zone id: ipaddress takes it, nft refuses the whole batch
                raise ValueError(text)
            net = ipaddress.ip_network(text.strip(), strict=False)
        except ValueError:
            raise ValueError(f"{text}: not a CIDR") from None
        if net.compressed not in out:
            out.append(net.compressed)
    return tuple(out)


@dataclass(frozen=True, slots=True)
class RulesetConfig:
    """What the chains depend on: flags, fixed for the daemon's life."""

    cluster_cidrs: tuple[str, ...] = ()  # --cluster-cidr, normalized (parse_cidrs)
    masquerade_all: bool = False  # --masquerade-all
    table: str = TABLE
    hold: bool = True  # the hold chains (off only in the lab's experiments)

    @property
    def target(self) -> str:
        return f"{FAMILY} {self.table}"

    def cidrs(self, family: int) -> list[str]:
        return [c for c in self.cluster_cidrs if (":" in c) == (family == 6)]


def map_name(family: int) -> str:
    return f"services{family}"


def firewall_name(family: int) -> str:
    return f"firewall{family}"


def allow_name(family: int) -> str:
    return f"firewall-allow{family}"


def virtual_servers_name(family: int) -> str:
    return f"virtual-servers{family}"


def vips_name(family: int) -> str:
    return f"vips{family}"


def vip_ports_name(family: int) -> str:
    return f"vip-ports{family}"


# One port-filter set element: (set name, field, ...), fields as nft lists them.
FilterItem = tuple[str, ...]


def filter_items(key: ServiceKey, el: Element) -> tuple[FilterItem, ...]:
    """The port-filter set elements one virtual server needs (none for a NodePort)."""
    if not el.vip:
        return ()
    f, proto = key.family, key.protocol.value.lower()
    out = [(vips_name(f), key.address), (vip_ports_name(f), key.address, proto, str(key.port))]
    if el.health_port is not None:
        out.append((vip_ports_name(f), key.address, "tcp", str(el.health_port)))
    return tuple(out)


def filter_counts(items: Iterable[tuple[ServiceKey, Element]]) -> Counter[FilterItem]:
    """How many virtual servers need each port-filter set element."""
    out: Counter[FilterItem] = Counter()
    for key, el in items:
        out.update(filter_items(key, el))
    return out


def _ip(family: int) -> str:
    return "ip6" if family == 6 else "ip"


def _addr_type(family: int) -> str:
    return "ipv6_addr" if family == 6 else "ipv4_addr"


# --- the base: everything but the elements --------------------------------------------------
def _chains(config: RulesetConfig) -> dict[str, list[str]]:
    """Regular chains and their rules, in dependency order."""
    hairpin = [
        f"meta nfproto ipv{f} update @hairpin{f} {{ {_ip(f)} saddr . {_ip(f)} saddr }} "
        f"{_ip(f)} saddr . {_ip(f)} daddr @hairpin{f} {MASQUERADE}"
        for f in (4, 6)
    ]
    if config.masquerade_all:
        cluster_ip = [MASQUERADE]
    else:
        cluster_ip = ["jump hairpin", f"fib saddr type local {MASQUERADE}"]
        for f in (4, 6):
            cidrs = config.cidrs(f)
            if cidrs:
                cluster_ip.append(
                    f"meta nfproto ipv{f} {_ip(f)} saddr != {{ {', '.join(cidrs)} }} {MASQUERADE}"
                )
    # New connections only: a range taken away later does not cut live ones (kube-proxy's
    # rules sit in the nat table, which sees only a connection's first packet).
    source_ranges = [
        f"meta nfproto ipv{f} {_ip(f)} daddr . meta l4proto . th dport @{firewall_name(f)} "
        f"{_ip(f)} daddr . meta l4proto . th dport . {_ip(f)} saddr != @{allow_name(f)} drop"
        for f in (4, 6)
    ]
    # Not a virtual server on a bound address: refused (kube-proxy's KUBE-IPVS-FILTER).
    vip_filter = [
        f"meta nfproto ipv{f} {_ip(f)} daddr @{vips_name(f)} "
        f"{_ip(f)} daddr . meta l4proto . th dport != @{vip_ports_name(f)} reject"
        for f in (4, 6)
    ]
    return {
        "hairpin": hairpin,
        "source-ranges": source_ranges,
        "vip-filter": vip_filter,
        Verdict.CLUSTER_IP.value: cluster_ip,
        Verdict.EXTERNAL.value: [MASQUERADE],
        Verdict.EXTERNAL_LOCAL.value: ["jump hairpin", f"fib saddr type local {MASQUERADE}"],
    }


def _postrouting() -> list[str]:
    return [
        f"meta l4proto {{ tcp, udp, sctp }} ct original {_ip(f)} daddr . meta l4proto . "
        f"ct original proto-dst vmap @{map_name(f)}"
        for f in (4, 6)
    ]


BASE_CHAIN = "nat-postrouting"
BASE_CHAIN_SPEC = "{ type nat hook postrouting priority srcnat ; policy accept ; }"
# Before IPVS, which takes packets at local-in (priority 98-99) and local-out (-99).
FILTER_CHAINS = {
    "filter-input": "{ type filter hook input priority mangle ; policy accept ; }",
    "filter-output": "{ type filter hook output priority mangle ; policy accept ; }",
}
# After IPVS: it answers replies at forward priority 100 (`ip_vs_reply4`) and takes requests
# at input 98-99 and output -99, so what reaches these is what IPVS did not handle.
HOLD_CHAINS = {
    "hold-forward": "{ type filter hook forward priority 110 ; policy accept ; }",
    "hold-input": "{ type filter hook input priority 110 ; policy accept ; }",
    "hold-output": "{ type filter hook output priority filter ; policy accept ; }",
}
_L4 = "meta l4proto { tcp, udp, sctp }"


def _hold_rules() -> dict[str, list[str]]:
    def to_vs(f: int) -> str:
        return f"{_ip(f)} daddr . meta l4proto . th dport @{virtual_servers_name(f)}"

    fams = (4, 6)
    # anything to a virtual server that is routed on: its address is gone from the node
    routed = [f"{_L4} {to_vs(f)} drop" for f in fams]
    # a reply IPVS did not turn back into its virtual server's address (its hooks gone)
    reply = [
        f"{_L4} ct direction reply ct status & dnat == 0 ct original {_ip(f)} daddr . "
        f"meta l4proto . ct original proto-dst @{virtual_servers_name(f)} "
        f"{_ip(f)} saddr . meta l4proto . th sport != @{virtual_servers_name(f)} drop"
        for f in fams
    ]
    # requests of established connections to a virtual server that IPVS did not take
    request = [
        f"{_L4} ct direction original ct status & dnat == 0 {to_vs(f)} ct state established drop"
        for f in fams
    ]
    # new connections IPVS did not take (TCP: a SYN only; a mid-stream packet of a
    # connection IPVS forgot, cut at a deadline, still reaches the stack and its reset)
    new = [
        rule
        for f in fams
        for rule in (
            f"{to_vs(f)} ct state new tcp flags & (syn | ack) == syn drop",
            f"meta l4proto udp {to_vs(f)} drop",
        )
    ]
    return {
        "hold-forward": routed + reply,
        "hold-input": request + new + reply,
        "hold-output": request + new,
    }


_FILTER_RULE = "ct state new meta l4proto { tcp, udp, sctp } jump source-ranges"
# Input only (as kube-proxy): the node's own connections to a local address cross it too.
_VIP_FILTER_RULE = "ct state new meta l4proto { tcp, udp, sctp } jump vip-filter"


def base_statements(config: RulesetConfig) -> list[str]:
    """Idempotent statements that (re)write the chains and rules and create the maps if
    missing, keeping their elements: in one transaction with nothing in between."""
    t = config.target
    out = [f"add table {t}"]
    for f in (4, 6):
        out.append(
            f"add map {t} {map_name(f)} {{ type {_addr_type(f)} . inet_proto . "
            "inet_service : verdict ; }"
        )
    for f in (4, 6):
        out.append(
            f"add set {t} hairpin{f} {{ type {_addr_type(f)} . {_addr_type(f)} ; "
            f"flags dynamic,timeout ; timeout {HAIRPIN_TIMEOUT}s ; "
            f"size {HAIRPIN_SIZE} ; }}"
        )
    for f in (4, 6):
        out.append(
            f"add set {t} {firewall_name(f)} {{ type {_addr_type(f)} . inet_proto . "
            "inet_service ; }"
        )
        out.append(
            f"add set {t} {allow_name(f)} {{ type {_addr_type(f)} . inet_proto . "
            f"inet_service . {_addr_type(f)} ; flags interval ; }}"
        )
    for f in (4, 6):
        out.append(
            f"add set {t} {virtual_servers_name(f)} {{ type {_addr_type(f)} . inet_proto . "
            "inet_service ; }"
        )
    for f in (4, 6):
        out.append(f"add set {t} {vips_name(f)} {{ type {_addr_type(f)} ; }}")
        out.append(
            f"add set {t} {vip_ports_name(f)} {{ type {_addr_type(f)} . inet_proto . "
            "inet_service ; }"
        )
    chains = _chains(config)
    for name in chains:
        out.append(f"add chain {t} {name}")
    out.append(f"add chain {t} {BASE_CHAIN} {BASE_CHAIN_SPEC}")
    hold = HOLD_CHAINS if config.hold else {}
    for name, spec in [*FILTER_CHAINS.items(), *hold.items()]:
        out.append(f"add chain {t} {name} {spec}")
    for name in [*chains, BASE_CHAIN, *FILTER_CHAINS, *hold]:
        out.append(f"flush chain {t} {name}")
    base = [
        (BASE_CHAIN, _postrouting()),
        *((n, [_FILTER_RULE]) for n in FILTER_CHAINS),
        ("filter-input", [_VIP_FILTER_RULE]),
        *(_hold_rules().items() if config.hold else ()),
    ]
    for name, rules in [*chains.items(), *base]:
        out.extend(f"add rule {t} {name} {rule}" for rule in rules)
    return out


def base_ruleset(config: RulesetConfig) -> str:
    """Start-up: the chains as the flags want them; elements already there stay."""
    return _text(base_statements(config))


# --- elements ---------------------------------------------------------------------------------
def _key(key: ServiceKey) -> str:
    return f"{key.address} . {key.protocol.value.lower()} . {key.port}"


def _element_statements(
    config: RulesetConfig,
    verb: str,
    items: Iterable[tuple[ServiceKey, Element]],
    keep: Collection[ServiceKey] = (),
) -> list[str]:
    """`verb` (add or delete) the elements, grouped per map and set. Each virtual server
    also has its element of the hold rules' set, one per key whatever its verdict: `keep`,
    the keys whose map element is deleted only to be added again (a verdict change), keep
    theirs."""
    names = (map_name, virtual_servers_name, firewall_name, allow_name)
    groups: dict[tuple[int, int], list[str]] = {}
    for key, el in sorted(items, key=lambda kv: kv[0]):
        f = key.family
        groups.setdefault((0, f), []).append(
            _key(key) if verb == "delete" else f"{_key(key)} : goto {el.verdict.value}"
        )
        if key not in keep:
            groups.setdefault((1, f), []).append(_key(key))
        if el.source_ranges is not None:
            groups.setdefault((2, f), []).append(_key(key))
            groups.setdefault((3, f), []).extend(
                f"{_key(key)} . {c}" for c in el.source_ranges if (":" in c) == (f == 6)
            )
    out = []
    for (kind, f), texts in sorted(groups.items()):
        if texts:
            # one statement per map or set: nft parses one long line much faster than many
            out.append(f"{verb} element {config.target} {names[kind](f)} {{ {', '.join(texts)} }}")
    return out


def _filter_statements(config: RulesetConfig, verb: str, items: Iterable[FilterItem]) -> list[str]:
    groups: dict[str, list[str]] = {}
    for name, *fields_ in sorted(items):
        groups.setdefault(name, []).append(" . ".join(fields_))
    # the hold rules' set first, beside the map elements; then the port filter's
    order = sorted(groups.items(), key=lambda kv: (not kv[0].startswith("virtual-servers"), kv[0]))
    return [
        f"{verb} element {config.target} {name} {{ {', '.join(texts)} }}" for name, texts in order
    ]


@dataclass(frozen=True, slots=True)
class ElementDelta:
    """Element changes for one transaction: deletions first, then additions (a verdict
    change is both). The port-filter set elements whose last user leaves, or whose first
    comes, ride along."""

    delete: tuple[tuple[ServiceKey, Element], ...] = ()  # with the element being removed
    add: tuple[tuple[ServiceKey, Element], ...] = ()
    filter_delete: tuple[FilterItem, ...] = ()
    filter_add: tuple[FilterItem, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.delete or self.add or self.filter_delete or self.filter_add)


def element_delta(
    applied: Elements,
    desired: Elements,
    keys: Iterable[ServiceKey] | None = None,
    applied_counts: Mapping[FilterItem, int] | None = None,
    desired_counts: Mapping[FilterItem, int] | None = None,
) -> ElementDelta:
    """What turns `applied` into `desired`, looking only at `keys` (default: all of both),
    so that one Service's change costs O(that Service). The counts (`filter_counts` of
    each side; computed here, O(all), when not given) say which port-filter set elements
    change."""
    if keys is None:
        keys = applied.keys() | desired.keys()
    if applied_counts is None:
        applied_counts = filter_counts(applied.items())
    if desired_counts is None:
        desired_counts = filter_counts(desired.items())
    delete, add = [], []
    touched: set[FilterItem] = set()
    for key in sorted(keys):
        have, want = applied.get(key), desired.get(key)
        if have == want:
            continue
        if have is not None:
            delete.append((key, have))
            touched.update(filter_items(key, have))
        if want is not None:
            add.append((key, want))
            touched.update(filter_items(key, want))
    was = {i for i in touched if applied_counts.get(i, 0) > 0}
    now = {i for i in touched if desired_counts.get(i, 0) > 0}
    return ElementDelta(
        tuple(delete), tuple(add), tuple(sorted(was - now)), tuple(sorted(now - was))
    )


def delta_ruleset(config: RulesetConfig, delta: ElementDelta) -> str:
    """Incremental: delete and add elements, in one transaction."""
    readded = {k for k, _ in delta.delete} & {k for k, _ in delta.add}
    out = _element_statements(config, "delete", delta.delete, readded)
    out += _filter_statements(config, "delete", delta.filter_delete)
    out += _element_statements(config, "add", delta.add, readded)
    out += _filter_statements(config, "add", delta.filter_add)
    return _text(out)


def _all_elements(config: RulesetConfig, elements: Elements) -> list[str]:
    return _element_statements(config, "add", elements.items()) + _filter_statements(
        config, "add", filter_counts(elements.items())
    )


def replace_elements_ruleset(config: RulesetConfig, elements: Elements) -> str:
    """Every element at once (after start-up or a failure): the maps are emptied and
    refilled in one transaction, so no packet sees them half-filled."""
    t = config.target
    out = [f"flush map {t} {map_name(f)}" for f in (4, 6)]
    out += [
        f"flush set {t} {name(f)}"
        for name in (virtual_servers_name, firewall_name, allow_name, vips_name, vip_ports_name)
        for f in (4, 6)
    ]
    return _text(out + _all_elements(config, elements))


def replace_table_ruleset(config: RulesetConfig, elements: Elements) -> str:
    """The whole table from scratch (it was changed by someone else, or is from another
    version), elements included, in one transaction: no moment without it."""
    t = config.target
    out = [f"add table {t}", f"delete table {t}", *base_statements(config)]
    return _text(out + _all_elements(config, elements))


def delete_table_ruleset(config: RulesetConfig) -> str:
    """`ipvsctl cleanup`: the table, whether or not it exists."""
    t = config.target
    return _text([f"add table {t}", f"delete table {t}"])


def nat_chain_only_ruleset(config: RulesetConfig) -> str:
    """`cleanup --rollback` on a node where no other program has a NAT hook: the table
    emptied but for its NAT base chain, with no rules. The kernel translates an established
    connection's packets by its conntrack binding (ipvsctl's masquerade) only while some
    NAT chain of the family is registered; one new chain is hooked before the old ones are
    unhooked, in the same transaction, so the translation never stops."""
    t = config.target
    chain = f"add chain {t} {BASE_CHAIN} {BASE_CHAIN_SPEC}"
    return _text([f"add table {t}", f"delete table {t}", f"add table {t}", chain])


def _text(statements: list[str]) -> str:
    return "".join(s + "\n" for s in statements)

"""`ipvsctl cleanup`: remove from this node everything ipvsctl created, to go back to
kube-router (or kube-proxy) or to uninstall.

What goes, in this order:
1. the IPVS virtual servers ipvsctl owns: those whose address is on its dummy interface
   (`--interface`), and NodePort ones (ports in `--service-node-port-range`, default
   30000-32767) on the node's addresses (`--node-ip`, default: the node's global
   addresses); other virtual servers stay;
2. the dummy interface, with its addresses (only if it is a dummy interface);
3. the nftables table `inet ipvsctl`;
4. the drain queue's state file in `--state-dir` (and the folder, if then empty).

`--config FILE` (kube-proxy's KubeProxyConfiguration, as `run --config`): a virtual server
on an address in `ipvs.excludeCIDRs` is never touched (the daemon's ownership rule), and when
the interface carries such an address it stays, with only ipvsctl's addresses removed from
it; `nodePortAddresses` narrows the node's addresses as on `run`.

`--rollback`: only steps 3 and 4, what a node going back to kube-proxy (or kube-router)
must lose: ipvsctl's nftables table (its virtual-IP port filter, frozen once the daemon is
gone, would reject a new port on an existing Service IP) and its drain state. The virtual
servers, their connections and the interface stay: `kube-ipvs0` and the table are
kube-proxy's too, and kube-proxy re-syncs them itself. Nothing of another program is
touched (its nftables tables, its iptables rules, conntrack). While no other program has
a NAT chain for IPv4 and IPv6 on the node (kube-proxy's iptables `nat` table, before
kube-proxy's first sync), the table is emptied but for its NAT base chain, kept with no
rules: the kernel stops translating the connections ipvsctl masqueraded once the last NAT
chain of a family goes. Run `cleanup --rollback` again once kube-proxy runs.

Refuses to run while a daemon answers on `--endpoint` (it would put everything back), unless
`--force`. `--dry-run` prints what would go. Exit 0 when done (also when there was nothing
to remove), 1 when a step failed (each failure one line), 2 for bad flags.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Protocol

import typer

from ipvsctl.cli.params import ENDPOINT_ENV
from ipvsctl.model import ServiceKey
from ipvsctl.model.cidrs import in_any, in_cidrs
from ipvsctl.model.portrange import DEFAULT_NODE_PORT_RANGE, parse_port_range
from ipvsctl.persist.drain_state import FILE_NAME as STATE_FILE
from ipvsctl.plan.ownership import owned_virtual_servers

if TYPE_CHECKING:
    from ipvsctl.netfilter.nft import Nft


class CleanupError(Exception):
    """One failed step; the message is the line the user sees."""


class NotChecked(Exception):
    """What cleanup could not look at (no `nft`): the message says why; not a failure,
    but said, never taken for "nothing there"."""


class Host(Protocol):
    """What cleanup touches (SystemHost; tests use a fake)."""

    def virtual_servers(self) -> list[ServiceKey]: ...
    def delete_virtual_server(self, key: ServiceKey) -> None: ...
    def interface(self) -> tuple[str, list[str]] | None: ...  # (kind, addresses)
    def delete_interface(self) -> None: ...
    def delete_address(self, address: str) -> None: ...  # one address off the interface
    def table_exists(self) -> bool: ...  # NotChecked: cannot tell
    def delete_table(self) -> None: ...
    # the families (4, 6) another program's NAT chain covers; NotChecked: cannot tell
    def nat_elsewhere(self) -> frozenset[int]: ...
    def keep_nat_chain_only(self) -> None: ...  # the table emptied but for its NAT chain


@dataclass
class Report:
    lines: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    summary: list[str] = field(default_factory=list)
    unchecked: list[str] = field(default_factory=list)


def cleanup_node(
    host: Host,
    interface: str,
    node_ips: Iterable[str],
    state_dir: Path | None,
    dry_run: bool = False,
    node_port_range: range = DEFAULT_NODE_PORT_RANGE,
    excluded: tuple[str, ...] = (),
) -> Report:
    """Remove what ipvsctl created; every step is tried even if an earlier one failed.
    Nothing on an address in `excluded` (kube-proxy's ipvs.excludeCIDRs) is touched."""
    r = Report()
    verb = "would delete" if dry_run else "deleted"

    def step(fn: Callable[[], None]) -> bool:
        if dry_run:
            return True
        try:
            fn()
            return True
        except CleanupError as exc:
            r.errors.append(str(exc))
            return False

    found = None
    try:
        found = host.interface()
    except CleanupError as exc:
        r.errors.append(str(exc))
    if found is not None and found[0] != "dummy":
        r.errors.append(
            f"interface {interface} is a {found[0] or 'physical'} interface, not "
            "a dummy one: check --interface; it and its addresses are left alone"
        )
        found = None
    bound = found[1] if found else []

    try:
        keys = owned_virtual_servers(
            host.virtual_servers(), bound, node_ips, node_port_range, excluded
        )
    except CleanupError as exc:
        r.errors.append(str(exc))
        keys = []
    deleted = 0
    for key in keys:
        if step(functools.partial(host.delete_virtual_server, key)):
            deleted += 1
            r.lines.append(
                f"{verb} virtual server {key.protocol.value} {str(key).rsplit('/', 1)[0]}"
            )
    if keys:
        r.summary.append(f"{deleted} virtual servers")

    kept = [a for a in bound if in_any(a, excluded)]
    if found is not None and kept:
        # another tool's address (ipvs.excludeCIDRs) on the interface: the interface stays
        ours = [a for a in bound if a not in kept]
        removed = 0
        for address in ours:
            if step(functools.partial(host.delete_address, address)):
                removed += 1
                r.lines.append(f"{verb} address {address} from interface {interface}")
        r.lines.append(
            f"left interface {interface}: it carries addresses in ipvs.excludeCIDRs "
            f"({', '.join(kept)})"
        )
        if ours:
            r.summary.append(f"{removed} addresses of interface {interface}")
    elif found is not None and step(host.delete_interface):
        shown = ", ".join(bound) if bound else "none"
        r.lines.append(f"{verb} interface {interface} (addresses: {shown})")
        r.summary.append(f"interface {interface} with {len(bound)} addresses")

    _remove_table_and_state(host, state_dir, dry_run, r)
    return r


def rollback_node(host: Host, state_dir: Path | None, dry_run: bool = False) -> Report:
    """What a node going back to kube-proxy or kube-router must lose, and only that: the
    nftables table and the drain state. Virtual servers, connections and the interface are
    left to the proxy that comes back."""
    r = Report()
    _remove_table_and_state(host, state_dir, dry_run, r, keep_nat=True)
    return r


def nat_families(
    chains: Iterable[tuple[str, str]], legacy: Iterable[int], ours: tuple[str, str]
) -> frozenset[int]:
    """The IP families (4, 6) whose NAT some other program keeps hooked: its nftables NAT
    base chains (family, table), or its legacy iptables `nat` table (`legacy`)."""
    covers = {"ip": {4}, "ip6": {6}, "inet": {4, 6}}
    out = set(legacy)
    for family, table in chains:
        if (family, table) != ours:
            out |= covers.get(family, set())
    return frozenset(out)


def _remove_table_and_state(
    host: Host, state_dir: Path | None, dry_run: bool, r: Report, keep_nat: bool = False
) -> None:
    """The nftables table `inet ipvsctl`, then the drain state files (and their folder, if
    then empty); every step tried, each failure one line in `r.errors`. `keep_nat`: the
    table's NAT chain stays (empty) while no other program's covers both families."""

    def step(fn: Callable[[], None]) -> bool:
        if dry_run:
            return True
        try:
            fn()
            return True
        except CleanupError as exc:
            r.errors.append(str(exc))
            return False

    try:
        table = host.table_exists()
    except CleanupError as exc:
        r.errors.append(str(exc))
        table = False
    except NotChecked as exc:
        r.unchecked.append(f"nftables table inet ipvsctl: {exc}")
        table = False
    missing: list[int] = []
    if table and keep_nat:
        try:
            missing = sorted({4, 6} - host.nat_elsewhere())
        except (CleanupError, NotChecked) as exc:  # cannot tell: keep it, the safe side
            r.unchecked.append(f"other NAT chains: {exc}")
            missing = [4, 6]
    if table and missing:
        if step(host.keep_nat_chain_only):
            families = " and ".join(f"IPv{f}" for f in missing)
            r.lines.append(
                f"{'would empty' if dry_run else 'emptied'} nftables table inet ipvsctl but "
                f"for its NAT chain, kept with no rules: no other NAT chain on this node for "
                f"{families}, and without one the kernel stops translating the connections "
                "ipvsctl masqueraded; run cleanup --rollback again once kube-proxy runs"
            )
            r.summary.append("nftables table (its empty NAT chain kept)")
    elif table and step(host.delete_table):
        r.lines.append(f"{'would delete' if dry_run else 'deleted'} nftables table inet ipvsctl")
        r.summary.append("nftables table")

    if state_dir is not None:
        files = [
            p
            for p in (
                sorted(state_dir.glob(f"{STATE_FILE}*")) + sorted(state_dir.glob(f".{STATE_FILE}*"))
            )
            if p.is_file()
        ]
        for path in files:
            if step(functools.partial(_remove, path)):
                r.lines.append(f"{'would remove' if dry_run else 'removed'} {path}")
        if files:
            r.summary.append("drain queue state")
        if not dry_run and state_dir.is_dir() and not any(state_dir.iterdir()):
            with contextlib.suppress(OSError):
                state_dir.rmdir()


@contextlib.contextmanager
def _as_cleanup_error() -> Iterator[None]:
    from ipvsctl.kernel import KernelError

    try:
        yield
    except KernelError as exc:
        raise CleanupError(str(exc)) from None


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise CleanupError(f"{path}: {exc.strerror or exc}") from None


class SystemHost:
    """This node: IPVS and the interface through kernel/netlink/system_host.py, the table
    through `nft`; every failure one CleanupError."""

    def __init__(self, interface: str) -> None:
        from ipvsctl.kernel.netlink.system_host import SystemIpvsHost

        self._host = SystemIpvsHost(interface)

    def virtual_servers(self) -> list[ServiceKey]:
        with _as_cleanup_error():
            return self._host.virtual_servers()

    def delete_virtual_server(self, key: ServiceKey) -> None:
        with _as_cleanup_error():
            self._host.delete_virtual_server(key)

    def interface(self) -> tuple[str, list[str]] | None:
        with _as_cleanup_error():
            return self._host.interface()

    def delete_interface(self) -> None:
        with _as_cleanup_error():
            self._host.delete_interface()

    def delete_address(self, address: str) -> None:
        with _as_cleanup_error():
            self._host.delete_address(address)

    def _nft(self) -> Nft:
        from ipvsctl.netfilter.nft import Nft

        return Nft()

    def table_exists(self) -> bool:
        from ipvsctl.netfilter.nft import NftError, NftUnavailable
        from ipvsctl.netfilter.ruleset import RulesetConfig

        try:
            return self._nft().list_table(RulesetConfig().target, "cleanup") is not None
        except NftUnavailable as exc:  # no nft binary, or no nf_tables: cannot tell
            raise NotChecked(str(exc).removeprefix("nft cleanup: ")) from None
        except NftError as exc:
            raise CleanupError(str(exc)) from None

    def delete_table(self) -> None:
        from ipvsctl.netfilter.nft import NftError
        from ipvsctl.netfilter.ruleset import RulesetConfig, delete_table_ruleset

        try:
            self._nft().apply(delete_table_ruleset(RulesetConfig()), "cleanup")
        except NftError as exc:
            raise CleanupError(str(exc)) from None

    def nat_elsewhere(self) -> frozenset[int]:
        from ipvsctl.netfilter.nft import NftError, NftUnavailable
        from ipvsctl.netfilter.ruleset import RulesetConfig

        try:
            chains = self._nft().list_nat_chains("cleanup")
        except NftUnavailable as exc:
            raise NotChecked(str(exc).removeprefix("nft cleanup: ")) from None
        except NftError as exc:
            raise CleanupError(str(exc)) from None
        legacy = [  # legacy iptables' tables, as loaded in this network namespace
            family
            for family, name in ((4, "ip_tables_names"), (6, "ip6_tables_names"))
            if "nat" in _lines(Path("/proc/net") / name)
        ]
        family, name = RulesetConfig().target.split()
        return nat_families(chains, legacy, (family, name))

    def keep_nat_chain_only(self) -> None:
        from ipvsctl.netfilter.nft import NftError
        from ipvsctl.netfilter.ruleset import RulesetConfig, nat_chain_only_ruleset

        try:
            self._nft().apply(nat_chain_only_ruleset(RulesetConfig()), "cleanup")
        except NftError as exc:
            raise CleanupError(str(exc)) from None


def _lines(path: Path) -> list[str]:
    """A /proc file's lines (one table name each); none when it is missing (its module
    never loaded)."""
    try:
        return path.read_text().split()
    except OSError:
        return []


def daemon_answers(endpoint: str) -> bool:
    import urllib.error

    from ipvsctl.httpd import direct_opener

    try:
        with direct_opener().open(endpoint.rstrip("/") + "/healthz", timeout=1):
            return True
    except urllib.error.HTTPError:
        return True  # it answered
    except (OSError, ValueError):
        return False


def register(app: typer.Typer) -> None:
    @app.command()
    def cleanup(
        interface: Annotated[
            str, typer.Option(metavar="NAME", help="The dummy interface holding the VIPs.")
        ] = "kube-ipvs0",
        node_ip: Annotated[
            list[str] | None,
            typer.Option(
                "--node-ip",
                metavar="IP",
                help="Node addresses whose NodePort virtual servers go "
                "(repeatable; default: the node's global addresses).",
            ),
        ] = None,
        state_dir: Annotated[
            str,
            typer.Option(
                "--state-dir", metavar="DIR", help="Where the daemon kept its drain queue."
            ),
        ] = "/var/lib/ipvsctl",
        endpoint: Annotated[
            str,
            typer.Option(
                "--endpoint",
                metavar="URL",
                envvar=ENDPOINT_ENV,
                help="A daemon answering here stops the cleanup.",
            ),
        ] = ("http://127.0.0.1:9796"),
        force: Annotated[
            bool, typer.Option("--force", help="Clean up even while a daemon answers.")
        ] = False,
        dry_run: Annotated[
            bool, typer.Option("--dry-run", help="Print what would be removed; remove nothing.")
        ] = False,
        service_node_port_range: Annotated[
            str,
            typer.Option(
                "--service-node-port-range",
                metavar="A-B",
                help="The cluster's NodePort range, as the daemon's flag.",
            ),
        ] = "30000-32767",
        config: Annotated[
            str | None,
            typer.Option(
                "--config",
                metavar="FILE",
                help="kube-proxy's KubeProxyConfiguration, as on run: nothing on an "
                "address in its ipvs.excludeCIDRs is touched; its nodePortAddresses narrow "
                "the node's addresses.",
            ),
        ] = None,
        rollback: Annotated[
            bool,
            typer.Option(
                "--rollback",
                help="Only what a node going back to kube-proxy or kube-router must lose: "
                "the nftables table and the drain state. Virtual servers, their connections "
                "and the interface stay.",
            ),
        ] = False,
    ) -> None:
        """Remove ipvsctl's virtual servers, dummy interface, nftables table and state.

        With --rollback, only the nftables table and the drain state.
        """
        import logging

        from ipvsctl.cli.params import daemon_url
        from ipvsctl.model import normalize_ip

        # Each failure is reported below as one line: the parts' own log lines would say
        # it twice, bare ("nft failed").
        quiet = logging.getLogger("ipvsctl")
        if not any(isinstance(h, logging.NullHandler) for h in quiet.handlers):
            quiet.addHandler(logging.NullHandler())
        try:
            endpoint = daemon_url(endpoint)
        except ValueError as exc:
            typer.echo(f"ipvsctl: --endpoint {endpoint}: {exc}", err=True)
            raise typer.Exit(2) from None

        try:
            node_ports = parse_port_range(service_node_port_range)
        except ValueError as exc:
            typer.echo(f"ipvsctl: --service-node-port-range {exc}", err=True)
            raise typer.Exit(2) from None

        excluded: tuple[str, ...] = ()
        node_port_cidrs: tuple[str, ...] = ()
        if config is not None:
            from ipvsctl.daemon.config_file import ConfigFileError, read_config_file

            try:
                settings = read_config_file(Path(config))
            except ConfigFileError as exc:
                typer.echo(f"ipvsctl: {exc}", err=True)
                raise typer.Exit(2) from None
            excluded, node_port_cidrs = settings.exclude_cidrs, settings.node_port_cidrs

        ips: list[str] = []
        for ip in node_ip or ():
            try:
                ips.append(normalize_ip(ip))
            except ValueError:
                typer.echo(f"ipvsctl: --node-ip {ip}: not an IP address", err=True)
                raise typer.Exit(2) from None
        if not node_ip and not rollback:
            try:
                from ipvsctl.kernel.netlink.addresses import node_addresses

                ips = in_cidrs(node_addresses(exclude_interfaces=(interface,)), node_port_cidrs)
            except Exception as exc:
                typer.echo(
                    f"ipvsctl: cannot read the node's addresses ({exc}); NodePort "
                    "virtual servers need --node-ip",
                    err=True,
                )
        if not force and daemon_answers(endpoint):
            typer.echo(
                f"ipvsctl: a daemon answers at {endpoint}: stop it first (it would put "
                "everything back), or pass --force",
                err=True,
            )
            raise typer.Exit(1)
        host = SystemHost(interface)
        report = (
            rollback_node(host, Path(state_dir), dry_run)
            if rollback
            else cleanup_node(host, interface, ips, Path(state_dir), dry_run, node_ports, excluded)
        )
        for line in report.lines:
            typer.echo(line)
        for error in report.errors:
            typer.echo(f"ipvsctl: {error}", err=True)
        what = ", ".join(report.summary) or "nothing to remove"
        if report.unchecked:
            what += "; not checked: " + ", ".join(report.unchecked)
        mode = "".join(f"({m}) " for m, on in (("rollback", rollback), ("dry run", dry_run)) if on)
        typer.echo(f"cleanup {mode}done: {what}")
        raise typer.Exit(1 if report.errors else 0)

"""The outside things the node daemon opens from its options: the kernel (with the host's
IPVS set-up, and which virtual servers are ipvsctl's), the node's addresses, the object
source, the Events writer, nft. Each failure is one `StartupError` line (exit 1)."""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any

from ipvsctl.daemon.options import DaemonOptions
from ipvsctl.kernel.port import HostAddresses, IPVSKernel, KernelError
from ipvsctl.model import ServiceKey
from ipvsctl.model.cidrs import in_cidrs
from ipvsctl.netfilter.sync import NftRunner
from ipvsctl.obs.logging import fields
from ipvsctl.obs.metrics import Metrics
from ipvsctl.plan.ownership import is_owned, may_take_over
from ipvsctl.source.events import ObjectSource, SourceConfigError

if TYPE_CHECKING:
    from ipvsctl.kube.events import EventWriter
    from ipvsctl.kube.settings import KubeSettings

log = logging.getLogger("ipvsctl.daemon")


class StartupError(Exception):
    """A fatal start-up problem; the message is the one line the user sees."""


def open_kernel(
    o: DaemonOptions,
    node_ips: Callable[[], Collection[str]] | None = None,
    metrics: Metrics | None = None,
) -> tuple[IPVSKernel, Callable[[ServiceKey], bool], Callable[[ServiceKey], bool]]:
    """The netlink kernel, host set-up done, which virtual servers are ipvsctl's (those on
    its dummy interface's addresses and NodePorts on node IPs; others are left alone), and
    which existing ones a Service may take over: ours, or another Kubernetes proxy's (an
    address on kube-ipvs0 or kube-dummy-if, read once here). `node_ips` gives the node IPs
    as they are now (they can change while running); without it, the start-up ones."""
    from ipvsctl.kernel import netlink

    try:
        counted: dict[str, Any] = (
            {} if metrics is None else {"on_answers_lost": metrics.netlink_answers_lost.inc}
        )
        kernel = netlink.NetlinkKernel(interface=o.kernel.interface, **counted)
        netlink.configure_host(
            tcp_timeout=o.kernel.tcp_timeout,
            tcpfin_timeout=o.kernel.tcpfin_timeout,
            udp_timeout=o.kernel.udp_timeout,
            kernel=kernel,
            strict_arp=o.kernel.strict_arp,
        )
        bound = set(kernel.bound_addresses())
    except KernelError as exc:
        raise StartupError(str(exc)) from None
    try:
        proxy_addresses = bound | set(netlink.interface_addresses())
    except Exception as exc:  # not fatal: then only our own are taken over
        log.warning("proxy interfaces unreadable", extra=fields(error=exc))
        proxy_addresses = bound
    fixed = frozenset(o.node.node_ips)
    current = node_ips or (lambda: fixed)
    node_ports = o.node.node_port_range
    excluded = o.kernel.exclude_cidrs

    def owned(key: ServiceKey) -> bool:
        return is_owned(key, bound, current(), node_ports, excluded)

    def take_over(key: ServiceKey) -> bool:
        return may_take_over(key, owned(key), proxy_addresses)

    return kernel, owned, take_over


def node_ips_reader(
    o: DaemonOptions, watch: HostAddresses | None = None
) -> Callable[[], list[str]] | None:
    """How the loop re-reads the node's addresses; None with --node-ip (fixed addresses).
    With `watch` (the followed addresses) a re-read is a copy, no netlink dump."""
    if not o.node_ips.follow:
        return None
    from ipvsctl.kernel.netlink.addresses import node_addresses

    # As at start-up (cli._node): the VIP interface's addresses are ClusterIPs.
    read: Callable[[], list[str]] = (
        watch.node_addresses
        if watch is not None
        else functools.partial(node_addresses, exclude_interfaces=(o.kernel.interface,))
    )
    if not o.node_ips.cidrs:
        return read
    return lambda: in_cidrs(read(), o.node_ips.cidrs)


def open_host_addresses(o: DaemonOptions, metrics: Metrics) -> HostAddresses:
    """Every address of the node, dumped now and followed from `Daemon.start`."""
    from ipvsctl.kernel.netlink.address_watch import HostAddressWatch

    try:
        return HostAddressWatch(o.kernel.interface, on_error=metrics.node_address_errors.inc).open()
    except OSError as exc:
        raise StartupError(f"the node's addresses cannot be read (rtnetlink): {exc}") from None


def open_source(
    o: DaemonOptions, metrics: Metrics, kube_settings: KubeSettings | None = None
) -> ObjectSource:
    if o.source.manifests:
        from ipvsctl.manifests import ManifestSource

        try:
            return ManifestSource(
                o.source.manifests,
                on_file_error=lambda: metrics.invalid_objects.labels("ManifestFile").inc(),
            )
        except SourceConfigError as exc:
            raise StartupError(str(exc)) from None
    from ipvsctl.kube.client import SENTINEL_SERVICE, KubeSource
    from ipvsctl.source.convert import service_label_selector
    from ipvsctl.source.prepare import Preparer

    try:
        return KubeSource.from_config(
            kubeconfig=o.source.kubeconfig,
            apiserver=o.source.apiserver,
            node_name=o.node.node_name,
            settings=kube_settings,
            on_watch_restart=lambda resource, reason: metrics.watch_restarts.labels(
                resource, reason
            ).inc(),
            service_label_selector=service_label_selector(o.node.service_proxy_name),
            # default/kubernetes carries no proxy-name label: with a name it is never listed,
            # so it cannot vouch for a Service list (the empty-list guard is off then).
            sentinel=None if o.node.service_proxy_name else SENTINEL_SERVICE,
            # Lists parsed as they are decoded, as the engine's store would (its
            # configuration is the same o.node): never all raw objects alive at once.
            prepare=Preparer.for_node(o.node),
            on_invalid_object=lambda kind: metrics.invalid_objects.labels(kind).inc(),
            on_health=lambda why: metrics.degraded.set("source", why),
        )
    except SourceConfigError as exc:
        raise StartupError(str(exc)) from None


def open_event_writer(
    o: DaemonOptions, source: ObjectSource, metrics: Metrics
) -> EventWriter | None:
    """The Events writer, on the source's API client; None without an API server."""
    api_client = getattr(source, "api_client", None)
    if api_client is None:
        return None
    from ipvsctl.kube.events import EventWriter

    node = o.node.node_name or ""
    return EventWriter(
        api_client,
        instance=f"ipvsctl-{node}" if node else "ipvsctl",
        node=node,
        on_result=lambda reason, result: metrics.events.labels(reason, result).inc(),
    )


def open_nft(o: DaemonOptions, metrics: Metrics) -> NftRunner | None:
    """ipvsctl's nftables runner; None with --no-nftables (masquerading done elsewhere)."""
    if not o.netfilter.enabled:
        return None
    from ipvsctl.netfilter.nft import Nft

    return Nft(metrics=metrics)


def with_apiserver_addresses(o: DaemonOptions, source: ObjectSource) -> DaemonOptions:
    """The API server's own addresses, never an external or load-balancer IP (CONTRACT
    "Node safety"): a Service binding one would send this daemon's API traffic into IPVS.
    A hostname is resolved once, here."""
    host = getattr(source, "host", None)
    if not isinstance(host, str) or not host:
        return o
    from ipvsctl.kube.config import host_addresses

    ips = host_addresses(host)
    log.info("API server addresses", extra=fields(host=host, addresses=",".join(sorted(ips))))
    return dataclasses.replace(o, node=dataclasses.replace(o.node, apiserver_ips=ips))

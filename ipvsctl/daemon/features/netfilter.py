"""ipvsctl's nftables table, `inet ipvsctl` (docs/netfilter.md): masquerading, hairpin, the
load-balancer source ranges and the port filter, one map element per virtual server. It
hears the Services and the draining virtual servers (their elements stay while they
drain), and pushes on its own thread. Without a usable `nft` at start-up the daemon runs
IPVS only and says so: IPVS alone still carries pod-to-Service traffic."""

from __future__ import annotations

import logging

from ipvsctl.daemon.feature import Feature, Parts
from ipvsctl.netfilter.nft import Nft, NftError, NftUnavailable
from ipvsctl.netfilter.ruleset import RulesetConfig
from ipvsctl.netfilter.sync import NetfilterSync, SyncConfig
from ipvsctl.obs.logging import fields
from ipvsctl.reconcile.feed import Subscriptions

log = logging.getLogger("ipvsctl.daemon")


def feature(p: Parts) -> Feature | None:
    if p.nft is None:
        return None
    o = p.options.netfilter
    ruleset = RulesetConfig(o.cluster_cidrs, o.masquerade_all)
    # The generation is read where nft runs (the lab's in-process daemons: a namespace);
    # only beside the real nft (a stand-in's table is in no kernel).
    generation = None
    if isinstance(p.nft, Nft):
        # imported here: pyroute2 is 12-22 MB of a process that has no other netlink (the
        # in-memory kernel's daemon, as the memory benchmark and its guard run it)
        from ipvsctl.kernel.netlink.nftables import NftGeneration

        generation = NftGeneration(ruleset.target, p.nft.netns)
    sync = NetfilterSync(
        p.nft,
        SyncConfig(ruleset),
        batch_lock=p.loop.lock,
        ready=lambda: p.view.started,
        metrics=p.metrics,
        node_ips=lambda: p.view.node.node_ips,
        generation=generation,
    )

    def start() -> bool:
        try:
            sync.start()
        except NftError as exc:
            # IPVS alone still carries pod-to-Service traffic, the core of the job: run
            # degraded and say so loudly rather than leave the node with no proxy.
            hint = (
                "; install nftables or pass --no-nftables"
                if isinstance(exc, NftUnavailable)
                else ""
            )
            log.error(
                "nftables unavailable: running without ipvsctl's netfilter rules "
                "(no masquerade, hairpin or NodePort from outside)",
                extra=fields(error=f"{exc}{hint}"),
            )
            return False
        return True

    return Feature(
        "netfilter",
        part=sync,
        hears=Subscriptions(
            service=sync.on_service,
            vs_drain=sync.on_virtual_server_drain,
            handed_over=sync.hand_over,
        ),
        threads=(("netfilter", sync.run),),
        start=start,
        wake=sync.wake.set,
    )

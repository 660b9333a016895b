"""The table guard (reconcile/table_guard.py, the engine's): what ipvsctl programmed, put
back within a second when another program removes it (kube-proxy's IPVS cleanup when it
starts on the node, an operator's `ipvsadm -C`). A background read on its own thread, paced every
`INTERVAL`: one get of a virtual server and one interface lookup per pass, whatever the
table's size. Each restore: one log line (the guard's), `ipvsctl_table_restores_total{what}`,
a Warning Event on this node's Node (reason IPVSTableRestored, rate-limited by the event
writer) when Events are written; `ipvsctl_degraded{condition="table_restores"}` while it
keeps happening, naming kube-proxy when its nftables table is on the node.

A restore the drift audit asked for (its dump saw the flush first) is heard the same way,
on the feed. The nftables table's own restore is the netfilter feature's (its check puts the
table back); the packets held meanwhile are its hold rules'."""

from __future__ import annotations

import logging

from ipvsctl.daemon.feature import Feature, Parts
from ipvsctl.model import Restored
from ipvsctl.netfilter.nft import NftError
from ipvsctl.obs.logging import fields
from ipvsctl.plan.events import table_restored
from ipvsctl.reconcile.feed import Subscriptions
from ipvsctl.reconcile.paced import Pace, PacedRunner

log = logging.getLogger("ipvsctl.guard")

INTERVAL = 0.5  # seconds between passes: noticed within INTERVAL plus one pass
KUBE_PROXY_TABLES = ("ip kube-proxy", "ip6 kube-proxy")  # its nftables mode's


def feature(p: Parts) -> Feature:
    guard = p.loop.engine.guard

    def kube_proxy_here() -> bool:
        if p.nft is None:
            return False
        for table in KUBE_PROXY_TABLES:
            try:
                if p.nft.list_declarations(table, "kube_proxy_table") is not None:
                    return True
            except NftError:
                return False
        return False

    def on_restore(done: Restored) -> None:
        for what in done.what:
            p.metrics.table_restores.labels(what).inc()
        if p.event_writer is not None:
            p.event_writer.record(
                table_restored(
                    p.options.node.node_name,
                    " and ".join(done.what),
                    done.virtual_servers,
                    kube_proxy_here(),
                )
            )

    def on_recurring(recurring: bool) -> None:
        who = "kube-proxy (its nftables table is on this node)" if kube_proxy_here() else None
        reason = (
            f"{guard.restores} restores; another program keeps removing the table"
            + (f": {who}" if who else "")
            if recurring
            else None
        )
        p.metrics.degraded.set("table_restores", reason)
        if recurring:
            log.error(
                "the IPVS table keeps being removed",
                extra=fields(restores=guard.restores, kube_proxy=who is not None),
            )

    reader = PacedRunner("table-guard", guard, p.loop.lock, Pace(every=INTERVAL), clock=p.clock)
    hears = Subscriptions(table_restored=on_restore, restores_recurring=on_recurring)
    return Feature("table-guard", part=guard, hears=hears, readers=(reader,))

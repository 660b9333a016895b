"""Stale UDP/SCTP conntrack entries swept (reconcile/conntrack_sweeper.py, rule
plan/conntrack.py): kube-proxy's CleanStaleEntries, as a background read on its own thread,
woken when a Service's UDP/SCTP virtual server gets serving endpoints. Only with a
conntrack table (the daemon's netlink one; tests without a kernel have none)."""

from __future__ import annotations

from ipvsctl.daemon.feature import Feature, Parts
from ipvsctl.reconcile.conntrack_sweeper import ConntrackSweeper
from ipvsctl.reconcile.feed import Subscriptions
from ipvsctl.reconcile.paced import PacedRunner


def feature(p: Parts) -> Feature | None:
    if p.conntrack is None:
        return None
    sweeper = ConntrackSweeper(p.view, p.conntrack, p.loop.lock, p.metrics)
    return Feature(
        "conntrack-sweep",
        part=sweeper,
        hears=Subscriptions(service=sweeper.on_service),
        readers=(
            PacedRunner("conntrack", sweeper, p.loop.lock, sweeper.pace(), wake=sweeper.wake),
        ),
    )

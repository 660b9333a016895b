"""Kubernetes Events for connections a drain's deadline cut (CONTRACT.md "Events";
kube/events.py): it hears the cuts and writes, rate-limited, on its own thread, never on
the event path. Only with an API server (a manifest folder has none to write to)."""

from __future__ import annotations

from ipvsctl.daemon.feature import Feature, Parts
from ipvsctl.reconcile.feed import Subscriptions


def feature(p: Parts) -> Feature | None:
    writer = p.event_writer
    if writer is None:
        return None
    return Feature(
        "events",
        part=writer,
        hears=Subscriptions(cut=writer.record),
        threads=(("events", writer.run),),
    )

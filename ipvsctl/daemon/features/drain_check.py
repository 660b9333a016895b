"""The drain check (reconcile/drain_check.py): when a draining real server's connections are
gone, or its deadline passed, it goes. A background read on its own thread, the loop's
runner (`drain`), so a check never waits behind the audit's dump."""

from __future__ import annotations

from ipvsctl.daemon.feature import Feature, Parts


def feature(p: Parts) -> Feature:
    return Feature("drain-check", readers=(p.loop.drain_runner,))

"""The drift audit (reconcile/audit.py): the kernel's table compared with what was applied, a
few virtual servers at a time, differences put right. A background read on its own thread,
the loop's runner (`audit-reader`); a failure is survived and reported as degraded."""

from __future__ import annotations

from ipvsctl.daemon.feature import Feature, Parts


def feature(p: Parts) -> Feature:
    return Feature("audit", readers=(p.loop.audit_runner,))

"""The whole IPVS table read through the IPVSKernel port, and its stable text form.

One reading for everyone who needs the table with its real servers (`ipvsctl status`, the
lab's comparisons, start-up adoption): the virtual servers in one dump, their real servers
in one /proc/net/ip_vs read, per-service dumps only for what that read could not give.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Collection, Iterable

from ipvsctl.kernel.port import IPVSKernel, KernelError, KernelNotFound
from ipvsctl.model import RealServerStatus, ServiceKey, VirtualServerStatus
from ipvsctl.obs.logging import fields

log = logging.getLogger("ipvsctl.kernel")


def read_real_servers(
    kernel: IPVSKernel, keys: Collection[ServiceKey]
) -> dict[ServiceKey, list[RealServerStatus]]:
    """Real servers of many virtual servers: one table read, per-service dumps for what it
    could not give. A virtual server gone between the reads is left out."""
    try:
        table = kernel.read_real_servers(keys)
    except KernelError as exc:
        log.info("ipvs table file unreadable, reading per virtual server", extra=fields(error=exc))
        table = {}
    out: dict[ServiceKey, list[RealServerStatus]] = {}
    for key in keys:
        if key in table:
            found = table[key]
            if found is not None:
                out[key] = found
            continue
        with contextlib.suppress(KernelNotFound):
            out[key] = kernel.list_real_servers(key)
    return out


def read_statuses(kernel: IPVSKernel) -> list[VirtualServerStatus]:
    """Every virtual server with its real servers (what `ipvsadm -Ln` shows), sorted."""
    virtual_servers = kernel.list_virtual_servers()
    dests = read_real_servers(kernel, [vs.key for vs in virtual_servers])
    return [
        VirtualServerStatus(vs, tuple(sorted(dests[vs.key], key=lambda r: r.key)))
        for vs in sorted(virtual_servers, key=lambda vs: vs.key)
        if vs.key in dests
    ]


def format_table(table: Iterable[VirtualServerStatus]) -> str:
    """One line per virtual and real server, like `ipvsadm -Ln` made stable: what
    FakeKernel.dump() and NetlinkKernel.dump() print, so tests compare the two."""
    lines = []
    for vss in table:
        lines.append(str(vss.vs))
        for r in vss.real_servers:
            lines.append(
                f"  -> {r.key} weight {r.weight} active {r.active_conns} "
                f"inactive {r.inactive_conns}"
            )
    return "\n".join(lines) + ("\n" if lines else "")


def dump(kernel: IPVSKernel) -> str:
    return format_table(read_statuses(kernel))

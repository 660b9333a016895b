"""Every Kubernetes API call the daemon makes, as RBAC rules.

The client (`kube.client`, `kube.events`) may only make these calls, and `daemonset/` grants
exactly these; tests check both directions, so RBAC stays least-privilege as the code changes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Permission:
    api_group: str  # "" is the core group
    resource: str
    verbs: tuple[str, ...]


REQUIRED_PERMISSIONS: tuple[Permission, ...] = (
    Permission("", "services", ("list", "watch")),
    Permission("discovery.k8s.io", "endpointslices", ("list", "watch")),
    # This node's own Node (one object, by field selector): zone and deletion (as kube-proxy).
    Permission("", "nodes", ("get", "list", "watch")),
    # ConnectionsCut Events on the pods whose connections a drain deadline cut
    # (`kube.events`): create, and patch for a series; never read.
    Permission("events.k8s.io", "events", ("create", "patch")),
)

PUBLIC_PATHS: tuple[str, ...] = ("/readyz",)
"""Non-resource URLs the client GETs (the outage probe, `kube.probe`). Every client may read
them (the built-in `system:public-info-viewer` ClusterRole, bound to all users), so the
DaemonSet's ClusterRole grants nothing for them."""

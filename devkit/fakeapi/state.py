"""The fake API server's state: the resources it serves, what it records of each request,
its stored objects, injected faults and open watches (server.py)."""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

JSON = dict[str, Any]
Key = tuple[str, str]  # (namespace, name)


@dataclass(frozen=True, slots=True)
class ResourceInfo:
    kind: str
    group: str  # "" is the core group
    version: str
    plural: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def prefix(self) -> str:
        return f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"


RESOURCES: dict[str, ResourceInfo] = {
    info.kind: info
    for info in (
        ResourceInfo("Service", "", "v1", "services"),
        ResourceInfo("EndpointSlice", "discovery.k8s.io", "v1", "endpointslices"),
        ResourceInfo("Pod", "", "v1", "pods"),
        ResourceInfo("Node", "", "v1", "nodes"),  # cluster-scoped; stored as "default"
        # events.k8s.io Events: list/watch/get as above, and create and patch (the only
        # resource written through the wire: the daemon's and shutdown-manager's Events)
        ResourceInfo("Event", "events.k8s.io", "v1", "events"),
    )
}


# A file every FakeAPIServer of this process (and its children) appends each request to,
# one JSON line: the lab checks a whole run's log (no Pod is ever read).
REQUEST_LOG_ENV = "IPVSCTL_FAKEAPI_REQUEST_LOG"
_log_lock = threading.Lock()


def log_request(path: str, record: RequestRecord) -> None:
    line = (
        json.dumps(
            {
                "method": record.method,
                "path": record.path,
                "verb": record.verb,
                "resource": record.resource,
                "namespace": record.namespace,
                "name": record.name,
            }
        )
        + "\n"
    )
    with _log_lock, open(path, "a") as f:
        f.write(line)


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One request as the server saw it. `verb` is the RBAC verb (get, list, watch, create,
    update, patch, delete); group/resource are None for paths that name no known resource."""

    method: str
    path: str
    query: Mapping[str, str]
    verb: str
    group: str | None
    resource: str | None
    namespace: str | None
    name: str | None
    raw_query: str = ""  # the query string as sent (order and encoding: the wire tests)
    accept: str | None = None  # the Accept header


@dataclass(slots=True)
class Entry:
    key: Key
    rv: int
    uid: str
    raw: bytes  # the object's JSON, as served


@dataclass(slots=True)
class Fault:
    verb: str
    kind: str | None
    status: int
    as_event: bool
    times: int
    # Watch lines sent before the error ("BOOKMARK", "ADDED": a hostile server that delivers
    # something, then fails), and the error as garbled JSON instead of a Status.
    before: tuple[str, ...] = ()
    garbled: bool = False
    retry_after: int | None = None  # `Retry-After` header / details.retryAfterSeconds


class Watch:
    __slots__ = ("bookmarks", "commands", "cursor", "hung", "info", "name", "next_bookmark")

    def __init__(self, info: ResourceInfo, cursor: int, bookmarks: bool, next_bookmark: float):
        self.info = info
        self.cursor = cursor  # absolute index into the resource's event log
        self.bookmarks = bookmarks
        self.next_bookmark = next_bookmark
        self.commands: deque[str] = deque()
        self.hung = False
        self.name: str | None = None  # fieldSelector metadata.name


KUBERNETES_SERVICE: JSON = {
    "kind": "Service",
    "apiVersion": "v1",
    "metadata": {
        "name": "kubernetes",
        "namespace": "default",
        "labels": {"component": "apiserver", "provider": "kubernetes"},
    },
    "spec": {
        "type": "ClusterIP",
        "clusterIP": "None",
        "clusterIPs": ["None"],
        "ports": [{"name": "https", "protocol": "TCP", "port": 443, "targetPort": 6443}],
    },
}

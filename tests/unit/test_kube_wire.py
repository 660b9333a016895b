"""The list and watch requests as the API server receives them: path, the exact query string
(parameter order and encoding) and the Accept header, for each collection the daemon follows.

They were made by the generated `CoreV1Api`/`DiscoveryV1Api` methods and are now made by
`kube.listwatch` without those classes: these strings are what the generated methods of
kubernetes 37 sent, so a difference is a change on the wire, not a refactoring.
"""

from __future__ import annotations

import dataclasses
import json
import queue
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from kubernetes.client.exceptions import (
    ApiException,
    ForbiddenException,
    ServiceException,
    UnauthorizedException,
)

from devkit.fakeapi import FakeAPIServer, objects
from devkit.fakeapi.state import RequestRecord
from ipvsctl.kube.client import KubeSource
from ipvsctl.kube.config import load_configuration, new_api_client
from ipvsctl.kube.listwatch import SERVICES, ListWatch
from ipvsctl.kube.settings import KubeSettings
from ipvsctl.source.convert import service_label_selector
from ipvsctl.source.events import ObjectKind, Replace, SourceEvent

REPO = Path(__file__).resolve().parents[2]
WAIT = 5.0
NODE = "node-a"
SETTINGS = KubeSettings(
    page_size=1,  # two objects of each kind: every first list has a continue page
    watch_timeout=60,
    connect_timeout=1.0,
    list_read_timeout=2.0,
    backoff_initial=0.01,
    backoff_max=0.08,
    healthy_watch_seconds=0.0,
    join_timeout=2.0,
)
JSON = "application/json"
SELECTOR = quote(service_label_selector(None))  # as the generated client encodes it
PATHS = {
    "services": "/api/v1/services",
    "endpointslices": "/apis/discovery.k8s.io/v1/endpointslices",
    "nodes": "/api/v1/nodes",
}


@pytest.fixture
def api() -> Iterator[FakeAPIServer]:
    server = FakeAPIServer().start()
    try:
        yield server
    finally:
        server.stop()


class Running:
    def __init__(self, api: FakeAPIServer, settings: KubeSettings) -> None:
        self.replaced: queue.Queue[ObjectKind] = queue.Queue()
        self.source = KubeSource.from_config(
            None,
            api.url,
            environ={},
            settings=settings,
            service_label_selector=service_label_selector(None),
            node_name=NODE,
            sentinel=None,
        )
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.source.run, args=(self.sink, self.stop))

    def sink(self, event: SourceEvent) -> None:
        if isinstance(event, Replace):
            self.replaced.put(event.kind)

    def __enter__(self) -> Running:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(WAIT)
        assert not self.thread.is_alive()

    def wait_replaces(self, n: int) -> None:
        for _ in range(n):
            self.replaced.get(timeout=WAIT)


def seed(api: FakeAPIServer) -> None:
    api.add(objects.service("web", cluster_ip="10.96.0.10"))
    api.add(objects.service("db", "prod", cluster_ip="10.96.0.11"))
    api.add(objects.endpoint_slice("web-1", "web", [objects.endpoint("10.244.1.5")]))
    api.add(objects.endpoint_slice("web-2", "web", [objects.endpoint("10.244.1.6")]))
    api.add(objects.node(NODE, zone="z1"))
    api.add(objects.node("node-b", zone="z2"))


def requests(api: FakeAPIServer, resource: str) -> list[RequestRecord]:
    got = [r for r in api.requests if r.resource == resource]
    assert all(r.method == "GET" and r.path == PATHS[resource] for r in got), got
    return got


def wire(r: RequestRecord) -> tuple[str, str, str | None]:
    return r.verb, r.raw_query, r.accept


def list_and_watch(selector: str, pages: int) -> list[tuple[str, str, str | None]]:
    """What one collection's first list (in `pages` pages) and first watch look like."""
    sel = f"{selector}&" if selector else ""
    first = ("list", f"{sel}limit=1&resourceVersion=0", JSON)
    more = [("list", f"continue={{token}}&{sel}limit=1", JSON)] * (pages - 1)
    watch = (
        "watch",
        f"allowWatchBookmarks=true&{sel}resourceVersion={{rv}}&timeoutSeconds={{timeout}}&watch=true",
        JSON,
    )
    return [first, *more, watch]


def filled(expected: list[tuple[str, str, str | None]], got: list[RequestRecord]) -> list:
    """`expected` with the server's own values (each page's continue token, the watch's
    resourceVersion and jittered timeout) taken from what was received, encoded as the
    generated client encoded them."""
    out = []
    for (verb, query, accept), r in zip(expected, got, strict=False):
        query = query.format(
            token=quote(r.query.get("continue", ""), safe=""),
            rv=r.query.get("resourceVersion", ""),
            timeout=r.query.get("timeoutSeconds", ""),
        )
        out.append((verb, query, accept))
    return out


@pytest.mark.parametrize(
    ("resource", "selector", "pages"),
    [
        # default/kubernetes too: three Services, in three pages of one
        ("services", f"labelSelector={SELECTOR}", 3),
        ("endpointslices", "", 2),
        ("nodes", f"fieldSelector={quote(f'metadata.name={NODE}')}", 1),  # only this node
    ],
)
def test_list_pages_and_watch_on_the_wire(api, resource: str, selector: str, pages: int) -> None:
    seed(api)
    with Running(api, SETTINGS) as run:
        run.wait_replaces(3)
        assert api.wait_for(lambda: api.open_watches() == 3, WAIT)
    got = requests(api, resource)[: pages + 1]
    expected = list_and_watch(selector, pages)
    assert [wire(r) for r in got] == filled(expected, got)
    assert 60 <= int(got[-1].query["timeoutSeconds"]) < 120


def test_relist_after_410_asks_the_watch_cache_not_older_than_on_the_wire(api) -> None:
    seed(api)
    with Running(api, SETTINGS) as run:
        run.wait_replaces(3)
        assert api.wait_for(lambda: api.open_watches() == 3, WAIT)
        rv = requests(api, "endpointslices")[-1].query["resourceVersion"]
        api.clear_requests()
        api.expire_watches("EndpointSlice")
        run.wait_replaces(1)
    got = requests(api, "endpointslices")[0]
    assert wire(got) == (
        "list",
        f"limit=1&resourceVersion={rv}&resourceVersionMatch=NotOlderThan",
        JSON,
    )


def test_watch_list_on_the_wire(api) -> None:
    seed(api)
    with Running(api, dataclasses.replace(SETTINGS, watch_list=True)) as run:
        run.wait_replaces(3)
        assert api.wait_for(lambda: api.open_watches() == 3, WAIT)
    first = requests(api, "endpointslices")[0]
    assert wire(first) == (
        "watch",
        "allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan&sendInitialEvents=true"
        "&timeoutSeconds=60&watch=true",
        JSON,
    )


# ---- error answers: the exceptions kube.watch's retry rules see --------------------------


def _services(api: FakeAPIServer) -> ListWatch:
    return ListWatch(new_api_client(load_configuration(None, api.url, environ={})), SERVICES)


@pytest.mark.parametrize(
    ("status", "reason", "exc_type"),
    [
        (401, "Unauthorized", UnauthorizedException),
        (403, "Forbidden", ForbiddenException),
        (410, "Gone", ApiException),
        (503, "Service Unavailable", ServiceException),
    ],
)
def test_an_error_answer_is_the_generated_methods_api_exception(
    api, status: int, reason: str, exc_type: type[ApiException]
) -> None:
    api.fail_next("list", "Service", status=status, retry_after=2)
    with pytest.raises(ApiException) as caught:
        _services(api)(limit=1, _request_timeout=(1.0, 2.0))
    exc = caught.value
    assert type(exc) is exc_type
    assert (exc.status, exc.reason) == (status, reason)
    assert exc.headers is not None and exc.headers["Retry-After"] == "2"
    assert json.loads(exc.body)["code"] == status  # the Status, as the generated methods kept it


def test_parameters_are_checked_as_the_generated_methods_checked_them(api) -> None:
    services = _services(api)
    with pytest.raises(TypeError, match="unexpected query parameters: pretty"):
        services(pretty="true")
    with pytest.raises(TypeError, match="resource_version must be str, not int"):
        services(resource_version=1007)  # e.g. a hostile server's number
    with pytest.raises(TypeError, match="limit must be int, not bool"):
        services(limit=True)
    assert not api.requests


def test_a_bearer_token_is_sent(tmp_path) -> None:
    server = FakeAPIServer(token="s3cret").start()
    try:
        kubeconfig = tmp_path / "config"
        kubeconfig.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "c", "cluster": {"server": server.url}}],
                    "users": [{"name": "u", "user": {"token": "s3cret"}}],
                    "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                    "current-context": "x",
                }
            )
        )
        cfg = load_configuration(str(kubeconfig), None, environ={})
        resp = ListWatch(new_api_client(cfg), SERVICES)(limit=1)
        try:
            assert json.loads(resp.data)["kind"] == "ServiceList"
        finally:
            resp.release_conn()
        with pytest.raises(UnauthorizedException):
            _services(server)(limit=1)  # no token: the fake refuses it
    finally:
        server.stop()

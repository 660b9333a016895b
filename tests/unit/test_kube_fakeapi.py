"""The fake API server's wire protocol, checked with a plain HTTP client."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any

import pytest

from devkit.fakeapi import FakeAPIServer, objects

SERVICES = "/api/v1/services"


@pytest.fixture
def api() -> Iterator[FakeAPIServer]:
    server = FakeAPIServer(kubernetes_service=False).start()
    try:
        yield server
    finally:
        server.stop()


def request(
    api: FakeAPIServer, path: str, method: str = "GET", headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", api.port, timeout=5)
    try:
        conn.request(method, path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


class Stream:
    def __init__(self, api: FakeAPIServer, path: str) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", api.port, timeout=5)
        self.conn.request("GET", path)
        self.resp = self.conn.getresponse()

    def next(self) -> dict[str, Any]:
        line = self.resp.readline()
        assert line, "stream ended"
        return json.loads(line)

    def ended(self) -> bool:
        return self.resp.readline() == b""

    def close(self) -> None:
        self.conn.close()


def test_list_pages_are_one_consistent_snapshot(api: FakeAPIServer) -> None:
    for i in range(5):
        api.add(objects.service(f"s{i}", cluster_ip=f"10.96.0.{i}"))
    status, page1 = request(api, SERVICES + "?limit=2")
    assert status == 200 and page1["kind"] == "ServiceList"
    assert [o["metadata"]["name"] for o in page1["items"]] == ["s0", "s1"]
    assert page1["metadata"]["remainingItemCount"] == 3
    api.delete("Service", "default", "s3")  # after the snapshot: not seen by later pages
    api.add(objects.service("s9", cluster_ip="10.96.0.9"))
    _, page2 = request(api, SERVICES + f"?limit=2&continue={page1['metadata']['continue']}")
    _, page3 = request(api, SERVICES + f"?limit=2&continue={page2['metadata']['continue']}")
    assert [o["metadata"]["name"] for o in page2["items"] + page3["items"]] == ["s2", "s3", "s4"]
    assert "continue" not in page3["metadata"]
    assert page1["metadata"]["resourceVersion"] == page3["metadata"]["resourceVersion"]


def test_expired_continue_token(api: FakeAPIServer) -> None:
    for i in range(3):
        api.add(objects.service(f"s{i}"))
    _, page1 = request(api, SERVICES + "?limit=1")
    api.expire_continue_tokens()
    status, body = request(api, SERVICES + f"?limit=1&continue={page1['metadata']['continue']}")
    assert status == 410 and body["reason"] == "Expired"


def test_watch_replays_from_resource_version_then_streams(api: FakeAPIServer) -> None:
    api.add(objects.service("a"))
    rv = api.resource_version
    api.add(objects.service("b"))
    api.add(objects.pod("p"))  # another kind: not in this stream
    api.add(objects.service("c", "other"))
    s = Stream(api, SERVICES + f"?watch=true&resourceVersion={rv}&allowWatchBookmarks=true")
    assert s.resp.getheader("Transfer-Encoding") == "chunked"
    b, c = s.next(), s.next()
    assert (b["type"], b["object"]["metadata"]["name"]) == ("ADDED", "b")
    assert (c["type"], c["object"]["metadata"]["namespace"]) == ("ADDED", "other")
    assert api.wait_for(lambda: api.open_watches("Service") == 1)
    api.update(objects.service("a", cluster_ip="10.96.0.99"))
    api.delete("Service", "default", "b")
    assert s.next()["type"] == "MODIFIED"
    deleted = s.next()
    assert deleted["type"] == "DELETED"
    assert deleted["object"]["metadata"]["resourceVersion"] == str(api.resource_version)
    api.bookmark()
    mark = s.next()
    assert mark == {
        "type": "BOOKMARK",
        "object": {
            "kind": "Service",
            "apiVersion": "v1",
            "metadata": {"resourceVersion": str(api.resource_version)},
        },
    }
    api.expire_watches()
    err = s.next()
    assert err["type"] == "ERROR" and err["object"]["code"] == 410
    assert s.ended()
    s.close()


def test_watch_without_resource_version_starts_with_the_current_state(api) -> None:
    api.add(objects.service("a"))
    api.add(objects.service("x", "other"))
    api.max_watch_seconds = 0.05
    s = Stream(api, "/api/v1/namespaces/default/services?watch=1&timeoutSeconds=100")
    first = s.next()
    assert (first["type"], first["object"]["metadata"]["name"]) == ("ADDED", "a")
    assert s.ended()  # the timeout ends it cleanly; "x" is in another namespace
    s.close()


def test_too_old_resource_version_is_http_410(api: FakeAPIServer) -> None:
    api.add(objects.service("a"))
    rv = api.resource_version
    api.add(objects.service("b"))
    api.compact()
    status, body = request(api, SERVICES + f"?watch=true&resourceVersion={rv}")
    assert status == 410 and body["code"] == 410
    api.max_watch_seconds = 0.05  # caps timeoutSeconds: the stream ends at once
    s = Stream(api, SERVICES + f"?watch=true&resourceVersion={api.resource_version}")
    assert s.resp.status == 200 and s.ended()
    s.close()


def test_history_limit_expires_old_resource_versions() -> None:
    with FakeAPIServer(history_limit=4) as api:
        rv = api.resource_version
        for i in range(10):
            api.add(objects.service(f"s{i}"))
        status, _ = request(api, SERVICES + f"?watch=true&resourceVersion={rv}")
        assert status == 410


def test_get_404_405_and_request_log(api: FakeAPIServer) -> None:
    api.add(objects.pod("p"))
    status, pod = request(api, "/api/v1/namespaces/default/pods/p")
    assert status == 200 and pod["metadata"]["resourceVersion"] == str(api.resource_version)
    status, body = request(api, "/api/v1/namespaces/default/pods/q")
    assert status == 404 and body["reason"] == "NotFound"
    status, _ = request(api, "/api/v1/namespaces/default/pods/p", method="DELETE")
    assert status == 405
    status, _ = request(api, "/api/v1/configmaps")
    assert status == 404
    verbs = [(r.verb, r.resource, r.namespace, r.name) for r in api.requests]
    assert verbs == [
        ("get", "pods", "default", "p"),
        ("get", "pods", "default", "q"),
        ("delete", "pods", "default", "p"),
        ("list", None, None, None),
    ]
    assert api.count("get", "Pod") == 2


def test_injected_faults(api: FakeAPIServer) -> None:
    api.fail_next("list", "Service", status=500)
    assert request(api, SERVICES)[0] == 500
    assert request(api, SERVICES)[0] == 200
    api.fail_next("watch", status=410, as_event=True)
    s = Stream(api, SERVICES + "?watch=true&resourceVersion=1")
    assert s.next()["object"]["code"] == 410
    assert s.ended()
    s.close()


def test_token_auth() -> None:
    with FakeAPIServer(token="t") as api:
        assert request(api, SERVICES)[0] == 401
        assert request(api, SERVICES, headers={"Authorization": "Bearer t"})[0] == 200


def test_down_refuses_and_up_serves_the_same_data_on_the_same_port(api) -> None:
    api.add(objects.service("a"))
    port = api.port
    api.down()
    with pytest.raises(ConnectionRefusedError):
        request(api, SERVICES)
    api.up()
    assert api.port == port
    _, body = request(api, SERVICES)
    assert [o["metadata"]["name"] for o in body["items"]] == ["a"]


def test_add_update_delete_contract(api: FakeAPIServer) -> None:
    stored = api.add(objects.service("a"))
    assert stored["metadata"]["uid"]
    with pytest.raises(ValueError):
        api.add(objects.service("a"))
    with pytest.raises(KeyError):
        api.update(objects.service("b"))
    updated = api.update(objects.service("a", cluster_ip="10.96.0.2"))
    assert updated["metadata"]["uid"] == stored["metadata"]["uid"]
    api.delete("Service", "default", "a")
    assert api.get("Service", "default", "a") is None
    with pytest.raises(KeyError):
        api.delete("Service", "default", "a")
    assert api.add_many(objects.cluster(3, 2)) == 6
    assert len(api.objects("EndpointSlice")) == 3

"""The list and watch requests of the collections the daemon follows, made on the client's
`ApiClient` without the generated API classes (client-go's `cache.ListWatch`).

Why: `kubernetes.client.CoreV1Api` is one 4.4 MB module of ~400 methods, each wrapped by
pydantic's `validate_call`, importing ~250 model modules for its annotations; importing it
cost the daemon ~20 MB of resident memory (a third of what it holds before the first list)
for three GETs, all of which read the raw response anyway (`kube.decode`).

The requests are built as the generated `list_*` methods of kubernetes 37 build them
(`CoreV1Api._list_service_for_all_namespaces_serialize`, then `_call_with_legacy_options`
with `_preload_content=False`), on the same `ApiClient`: the same path; the same query
parameters in the same order, booleans as `true`, values URL-quoted by `param_serialize`;
`Accept: application/json` (what `select_header_accept` picks from the generated list); the
`BearerToken` auth setting (the kubeconfig's or the service account's token, refreshed as
before); the per-request `(connect, read)` timeout; TLS, proxy and pool of the client's
`rest_client`. A non-2xx answer is read and raised as `ApiException.from_response` (status,
reason, headers; no body), as the generated methods raise it. tests/unit/test_kube_wire.py
holds the query strings those methods sent.
"""

from __future__ import annotations

from typing import Any

from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException
from urllib3 import BaseHTTPResponse

SERVICES = "/api/v1/services"
ENDPOINT_SLICES = "/apis/discovery.k8s.io/v1/endpointslices"
NODES = "/api/v1/nodes"

ACCEPT = "application/json"

# The generated methods' keyword arguments that ipvsctl uses: (argument, query name, type),
# in the generated serializer's order. A wrong type is refused, as pydantic refused it there
# (a resourceVersion that is not a string, from a hostile server, fails the request).
_PARAMETERS: tuple[tuple[str, str, type], ...] = (
    ("allow_watch_bookmarks", "allowWatchBookmarks", bool),
    ("_continue", "continue", str),
    ("field_selector", "fieldSelector", str),
    ("label_selector", "labelSelector", str),
    ("limit", "limit", int),
    ("resource_version", "resourceVersion", str),
    ("resource_version_match", "resourceVersionMatch", str),
    ("send_initial_events", "sendInitialEvents", bool),
    ("timeout_seconds", "timeoutSeconds", int),
    ("watch", "watch", bool),
)
_KNOWN = frozenset(name for name, _, _ in _PARAMETERS)


class ListWatch:
    """`list_watch(**params)` -> the raw urllib3 response of a list or watch of the
    collection at `path` (cluster-wide): `watch=True` for a watch; the keyword arguments of
    the generated `list_*_for_all_namespaces` methods (see `_PARAMETERS`), and
    `_request_timeout` (seconds, or (connect, read)). The caller reads and releases it."""

    def __init__(self, api: ApiClient, path: str) -> None:
        self._api = api
        self.path = path

    def __call__(
        self, *, _request_timeout: float | tuple[float, float] | None = None, **params: Any
    ) -> BaseHTTPResponse:
        unknown = params.keys() - _KNOWN
        if unknown:
            raise TypeError(f"unexpected query parameters: {', '.join(sorted(unknown))}")
        query: list[tuple[str, Any]] = []
        for name, key, kind in _PARAMETERS:
            value = params.get(name)
            if value is None:
                continue
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                raise TypeError(f"{name} must be {kind.__name__}, not {type(value).__name__}")
            query.append((key, value))
        method, url, headers, body, post = self._api.param_serialize(
            method="GET",
            resource_path=self.path,
            query_params=query,
            header_params={"Accept": ACCEPT},
            auth_settings=["BearerToken"],
        )
        resp = self._api.call_api(
            method, url, headers, body, post, _request_timeout=_request_timeout
        )
        if not 200 <= resp.status <= 299:
            resp.read()  # type: ignore[no-untyped-call]
            raise ApiException.from_response(http_resp=resp, body=None, data=None)
        raw: BaseHTTPResponse = resp.response
        return raw

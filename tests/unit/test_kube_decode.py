"""decode_list: list responses decoded item by item (a watch-cache list may come in one
piece), equal to json.loads and strict on bad input."""

from __future__ import annotations

import json

import pytest

from devkit.fakeapi import objects
from ipvsctl.kube.decode import decode_list
from ipvsctl.kube.trim import trim_endpoint_slice


def ident(obj):
    return dict(obj)


def test_same_items_and_metadata_as_json_loads() -> None:
    items = [o for o in objects.cluster(20, 3) if o["kind"] == "EndpointSlice"]
    doc = {
        "kind": "EndpointSliceList",
        "apiVersion": "discovery.k8s.io/v1",
        "metadata": {"resourceVersion": "77", "continue": "abc"},
        "items": items,
    }
    for text in (
        json.dumps(doc),
        json.dumps(doc, indent=2),
        json.dumps({"items": items, "metadata": doc["metadata"]}),
    ):  # any key order
        got, meta = decode_list(text.encode(), trim_endpoint_slice)
        assert got == [trim_endpoint_slice(i) for i in items]
        assert meta == doc["metadata"]


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"[]",
        b"null",
        b'{"items": 5}',
        b'{"items": [1, 2',
        b'{"items": [] "x": 1}',
        b'{"metadata": {}',
        b'{"items": [{}], }',
    ],
)
def test_bad_input_is_a_value_error(body: bytes) -> None:
    with pytest.raises(ValueError):
        decode_list(body, ident)


def test_empty_and_null_items() -> None:
    assert decode_list(b'{"items": null, "metadata": {"resourceVersion": "1"}}', ident) == (
        [],
        {"resourceVersion": "1"},
    )
    assert decode_list(b" { } ", ident) == ([], {})
    assert decode_list(b'{"items": [ ], "metadata": 3}', ident) == ([], {})
    # Items that are not objects are skipped, as before.
    assert decode_list(b'{"items": [1, {"a": 1}]}', ident) == ([{"a": 1}], {})

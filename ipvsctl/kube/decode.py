"""The API server's JSON, decoded as it streams: a list response item by item (each trimmed
at once, so a list of 100,000 endpoints never exists as one object tree), and a watch
stream split into its events' lines."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

_DECODER = json.JSONDecoder()
_WS = " \t\n\r"


T = TypeVar("T")


def decode_list(
    body: bytes, load: Callable[[Mapping[str, Any]], T]
) -> tuple[list[T], dict[str, Any]]:
    """Decode a list response item by item, each handed to `load` at once (which trims it,
    and may parse it): a list answered in one piece (resourceVersion=0 from the watch cache
    of a server older than 1.34 ignores `limit`) never exists as one full object tree, only
    as its text and what `load` keeps of each item. Returns (loaded items, metadata).
    ValueError on anything but a JSON object."""
    text = body.decode()
    del body
    n = len(text)

    def skip(i: int) -> int:
        while i < n and text[i] in _WS:
            i += 1
        return i

    i = skip(0)
    if i >= n or text[i] != "{":
        raise ValueError("list response is not a JSON object")
    items: list[T] = []
    meta: dict[str, Any] = {}
    i = skip(i + 1)
    if i < n and text[i] == "}":
        return items, meta
    while True:
        key, i = _DECODER.raw_decode(text, i)
        i = skip(i)
        if i >= n or text[i] != ":":
            raise ValueError("bad JSON object")
        i = skip(i + 1)
        if key == "items" and i < n and text[i] == "[":
            i = skip(i + 1)
            if i < n and text[i] == "]":
                i += 1
            else:
                while True:
                    item, i = _DECODER.raw_decode(text, i)
                    if isinstance(item, dict):
                        items.append(load(item))
                    del item
                    i = skip(i)
                    if i < n and text[i] == ",":
                        i = skip(i + 1)
                        continue
                    if i < n and text[i] == "]":
                        i += 1
                        break
                    raise ValueError("bad JSON array")
        else:
            value, i = _DECODER.raw_decode(text, i)
            if key == "items" and value is not None:
                raise ValueError("list response items is not a list")
            if key == "metadata" and isinstance(value, dict):
                meta = value
        i = skip(i)
        if i < n and text[i] == ",":
            i = skip(i + 1)
            continue
        if i < n and text[i] == "}":
            return items, meta
        raise ValueError("bad JSON object")


def iter_lines(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """Split a watch stream into its non-empty lines (one JSON event each)."""
    rest = b""
    for chunk in chunks:
        if not chunk:
            continue
        if rest:
            chunk = rest + chunk
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            line = chunk[start:end]
            start = end + 1
            if line.strip():
                yield line
        rest = chunk[start:]
    if rest.strip():
        yield rest

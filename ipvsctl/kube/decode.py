"""The API server's JSON, decoded as it streams: a list response item by item (each trimmed
at once, so a list of 100,000 endpoints never exists as one object tree), and a watch
stream split into its events' lines.

An item that cannot be read (not an object, or nested too deeply for the decoder) is
skipped and reported, never the whole list: one bad object must not keep every other one
out of the table. A body that is not JSON at all is a failed list (ValueError)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

_DECODER = json.JSONDecoder()
_WS = " \t\n\r"
_STRUCTURE = re.compile(r'["\[\]{}]')


T = TypeVar("T")


def decode_list(
    body: bytes,
    load: Callable[[Mapping[str, Any]], T | None],
    on_skip: Callable[[str], None] | None = None,
) -> tuple[list[T], dict[str, Any]]:
    """Decode a list response item by item, each handed to `load` at once (which trims it,
    and may parse it): a list answered in one piece (resourceVersion=0 from the watch cache
    of a server older than 1.34 ignores `limit`) never exists as one full object tree, only
    as its text and what `load` keeps of each item. Returns (loaded items, metadata).
    An item that is not an object, or too deeply nested to decode, is left out and
    `on_skip(why)` told; an item `load` returns None for is left out too (it reported it).
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
                    try:
                        item, i = _DECODER.raw_decode(text, i)
                    except RecursionError:  # the C decoder's depth limit (~1,000 levels)
                        item, i = None, _value_end(text, i)
                        if on_skip is not None:
                            on_skip("nested too deeply")
                    else:
                        if isinstance(item, dict):
                            loaded = load(item)
                            if loaded is not None:
                                items.append(loaded)
                            del loaded
                        elif on_skip is not None:
                            on_skip(f"a list item that is {type(item).__name__}, not an object")
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


def _value_end(text: str, i: int) -> int:
    """The end of the array or object starting at `i`, found by its brackets alone (strings
    stepped over): how an item too deep to decode is skipped. ValueError when it never ends."""
    if i >= len(text) or text[i] not in "[{":
        raise ValueError("bad JSON array")
    depth = 0
    while (m := _STRUCTURE.search(text, i)) is not None:
        c, i = m.group(), m.end()
        if c == '"':
            while True:  # to the closing quote: one not escaped by an odd run of backslashes
                j = text.find('"', i)
                if j < 0:
                    raise ValueError("unterminated JSON string")
                k = j
                while text[k - 1] == "\\":
                    k -= 1
                i = j + 1
                if (j - k) % 2 == 0:
                    break
        elif c in "[{":
            depth += 1
        else:
            depth -= 1
            if depth == 0:
                return i
    raise ValueError("bad JSON array")


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

"""JSON with the manifests' bounds (safeyaml.py's MAX_DEPTH and MAX_BYTES): json.loads
with a depth check, and a reader that decodes a file a chunk at a time so a `kind: List`'s
items go through `keep` one by one (a 10,000-Service cluster's list is never whole in
memory). Errors say where as json.loads says it, in the whole text's lines and columns."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from ipvsctl.manifests.safeyaml import ITEMS, MAX_DEPTH, Keep


def _check_depth(doc: Any, depth: int = 1) -> None:
    stack = [(doc, depth)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ValueError(f"nested deeper than {MAX_DEPTH} levels")
        if isinstance(value, dict):
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value)


def load_json(text: str) -> Any:
    """json.loads with MAX_DEPTH; ValueError beyond it (json.JSONDecodeError is one)."""
    try:
        doc = json.loads(text)
    except RecursionError:
        raise ValueError(f"nested deeper than {MAX_DEPTH} levels") from None
    _check_depth(doc)
    return doc


_WS = re.compile(r"[ \t\n\r]*")
_NUMBER_TAIL = re.compile(r"[0-9.eE+-]*")
_DECODER = json.JSONDecoder()
CHUNK = 1 << 20


class _JsonReader:
    """A JSON text read a chunk at a time: values decoded by the C decoder (raw_decode) from a
    buffer that holds what is not yet parsed, refilled (at least doubling, so a long value
    costs O(its size)) when a value runs past its end. Errors say where as json.loads says
    it, in the whole text's lines and columns."""

    def __init__(self, read: Callable[[int], str]) -> None:
        self._read = read
        self.buf = ""
        self.pos = 0
        self.eof = False
        self._base = 0  # characters dropped before buf
        self._lines = 0  # newlines among them
        self._col = 0  # characters after the last of them

    def more(self) -> bool:
        if self.eof:
            return False
        data = self._read(max(CHUNK, len(self.buf) - self.pos))
        if not data:
            self.eof = True
            return False
        dropped = self.buf[: self.pos]
        newline = dropped.rfind("\n")
        self._lines += dropped.count("\n")
        self._col = len(dropped) - newline - 1 if newline >= 0 else self._col + len(dropped)
        self._base += self.pos
        self.buf = self.buf[self.pos :] + data
        self.pos = 0
        return True

    def peek(self) -> str:
        """The next character that is not whitespace ("" at the end)."""
        while True:
            self.pos = _WS.match(self.buf, self.pos).end()  # type: ignore[union-attr]
            if self.pos < len(self.buf) or not self.more():
                return self.buf[self.pos : self.pos + 1]

    def value(self) -> Any:
        self.peek()
        while True:
            try:
                value, end = _DECODER.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as exc:
                if self.more():
                    continue
                raise self.error(exc.msg, exc.pos) from None
            except RecursionError:
                raise ValueError(f"nested deeper than {MAX_DEPTH} levels") from None
            if _NUMBER_TAIL.fullmatch(self.buf, end) and self.more():
                continue  # a number may go on in the next chunk (0|.5)
            self.pos = end
            return value

    def expect(self, chars: str, msg: str) -> str:
        c = self.peek()
        if not c or c not in chars:
            raise self.error(msg, self.pos)
        self.pos += 1
        return c

    def rest(self) -> str:
        parts = [self.buf[self.pos :]]
        while data := self._read(CHUNK):
            parts.append(data)
        return "".join(parts)

    def error(self, msg: str, pos: int) -> json.JSONDecodeError:
        newline = self.buf.rfind("\n", 0, pos)
        line = self._lines + self.buf.count("\n", 0, pos) + 1
        col = pos - newline if newline >= 0 else self._col + pos + 1
        exc = json.JSONDecodeError(msg, "", 0)
        exc.pos, exc.lineno, exc.colno = self._base + pos, line, col
        exc.args = (f"{msg}: line {line} column {col} (char {self._base + pos})",)
        return exc


def load_json_stream(read: Callable[[int], str], keep: Keep) -> Any:
    """load_json of the text `read` returns, a top-level object's `items` array streamed
    through `keep` (a `kind: List` never whole in memory). ValueError as load_json."""
    r = _JsonReader(read)
    if r.peek() != "{":
        return load_json(r.rest())  # not an object: parsed whole, its errors said by json
    r.pos += 1
    doc: dict[str, Any] = {}
    if r.peek() == "}":
        r.pos += 1
    else:
        while True:
            if r.peek() != '"':
                raise r.error("Expecting property name enclosed in double quotes", r.pos)
            key = r.value()
            r.expect(":", "Expecting ':' delimiter")
            if key == ITEMS and r.peek() == "[":
                r.pos += 1
                kept: list[Any] = []
                if r.peek() == "]":
                    r.pos += 1
                else:
                    while True:
                        item = r.value()
                        _check_depth(item, 3)
                        kept.append(keep(item))
                        if r.expect(",]", "Expecting ',' delimiter") == "]":
                            break
                doc[key] = kept
            else:
                value = r.value()
                _check_depth(value, 2)
                doc[key] = value
            if r.expect(",}", "Expecting ',' delimiter") == "}":
                break
    if r.peek():
        raise r.error("Extra data", r.pos)
    return doc

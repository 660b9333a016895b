"""YAML with bounded depth, alias expansion (nodes and text) and size: hostile manifests
must fail with one clear error, never exhaust memory, hang, overflow the stack or kill a
thread. JSON's bounded reader is safejson.py; both share the bounds and `parse_error`.

libyaml's parser (CParser) is used when PyYAML has it: ~4x faster than the pure-Python
one on a 3,000-Service `kubectl get -o yaml` dump. Its C composer recurses without a bound
(a deeply nested document segfaults the process), so nodes are composed by PyYAML's Python
Composer, which counts depth and alias expansion here; that keeps most of the speed.
A `kind: List`'s items can be read one at a time instead (`keep`, below): items built from
the parser's events without nodes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.events import (
    AliasEvent,
    Event,
    MappingEndEvent,
    MappingStartEvent,
    ScalarEvent,
    SequenceEndEvent,
    SequenceStartEvent,
)
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.resolver import Resolver

MAX_DEPTH = 64  # Kubernetes objects nest < 20 deep
# Nodes that aliases may add to a file (each alias counts the size of what it names): a
# billion-laughs bomb is refused before anything walks its expansion.
MAX_ALIAS_NODES = 100_000
# Characters of scalars that aliases may add to a file: nodes alone do not bound it (a 1 MB
# string aliased 1,300 times is 1,300 nodes, shared in memory, but 1.3 GB to anything that
# writes it out, an error message's repr() once did).
MAX_ALIAS_CHARS = 16 << 20
MAX_BYTES = 256 << 20  # per file


class Readable(Protocol):
    def read(self, n: int = -1, /) -> str: ...


class LimitError(yaml.YAMLError):
    """A document beyond MAX_DEPTH, MAX_ALIAS_NODES or MAX_ALIAS_CHARS."""


class _Limits(Composer):
    """Composer hooks: depth and the size of every alias expansion."""

    def _init_limits(self) -> None:
        self._depth = 0
        self._composed = 0
        self._chars = 0  # scalar characters composed so far (aliases' included)
        self._alias_nodes = 0
        self._alias_chars = 0
        # id(anchored node) -> (nodes, scalar characters) under it
        self._sizes: dict[int, tuple[int, int]] = {}

    if TYPE_CHECKING:  # the Parser this is mixed with reads the events

        def peek_event(self) -> Event: ...

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        event = self.peek_event()
        if isinstance(event, AliasEvent):
            node = Composer.compose_node(self, parent, index)
            size, chars = self._sizes.get(id(node), (1, 0))
            # an alias inside an anchored node counts in its size
            self._composed += size
            self._chars += chars
            self._alias_nodes += size
            self._alias_chars += chars
            if self._alias_nodes > MAX_ALIAS_NODES:
                raise LimitError(
                    f"aliases expand to more than {MAX_ALIAS_NODES} nodes (at {event.start_mark})"
                )
            if self._alias_chars > MAX_ALIAS_CHARS:
                raise LimitError(
                    f"aliases expand to more than {MAX_ALIAS_CHARS >> 20} MiB of text "
                    f"(at {event.start_mark})"
                )
            return node
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise LimitError(f"nested deeper than {MAX_DEPTH} levels (at {event.start_mark})")
        before, chars_before = self._composed, self._chars
        try:
            node = Composer.compose_node(self, parent, index)
        finally:
            self._depth -= 1
        self._composed += 1
        if isinstance(node, ScalarNode):
            self._chars += len(node.value)
        if getattr(event, "anchor", None) is not None:  # only anchored nodes can be aliased
            self._sizes[id(node)] = (self._composed - before, self._chars - chars_before)
        return node


class PySafeLoader(
    yaml.reader.Reader, yaml.scanner.Scanner, yaml.parser.Parser, _Limits, SafeConstructor, Resolver
):
    def __init__(self, stream: str | Readable) -> None:
        yaml.reader.Reader.__init__(self, stream)
        yaml.scanner.Scanner.__init__(self)
        yaml.parser.Parser.__init__(self)
        Composer.__init__(self)
        SafeConstructor.__init__(self)
        Resolver.__init__(self)
        self._init_limits()


try:
    from yaml._yaml import CParser

    # _Limits (a Composer) first in the MRO: its Python compose_* methods take the place of
    # CParser's C ones and read CParser's events.
    class CSafeLoader(_Limits, CParser, SafeConstructor, Resolver):
        """libyaml's parser; the Python composer (with limits) in place of the C one."""

        def __init__(self, stream: str | Readable) -> None:
            CParser.__init__(self, stream)
            Composer.__init__(self)
            SafeConstructor.__init__(self)
            Resolver.__init__(self)
            self._init_limits()

    SafeLoader: type = CSafeLoader
except ImportError:  # PyYAML built without libyaml
    SafeLoader = PySafeLoader


# Streaming: `kubectl get ... -o yaml|json` prints one `kind: List` of every object; parsed
# whole, a 10,000-Service cluster's took 2.1 GB (YAML) and 629 MB (JSON). A top-level
# mapping's `items` are parsed one at a time instead, each handed to `keep` (what stays of
# it: plan trims what it does not read) before the next is read. Every bound above holds
# as when the document is parsed whole, at the same depths.
Keep = Callable[[Any], Any]
ITEMS = "items"  # a List's: what `keep` sees one at a time


def _streamed_document(loader: Any, keep: Keep) -> Any:
    """The next document, a top-level mapping's plain `items` sequence streamed through keep;
    any other document composed whole."""
    loader.get_event()  # DOCUMENT-START
    start = loader.peek_event()
    if not isinstance(start, MappingStartEvent) or start.anchor or start.tag:
        node = loader.compose_node(None, None)
        loader.get_event()  # DOCUMENT-END
        loader.anchors = {}
        return loader.construct_document(node)
    loader.get_event()
    mark: Any = start.start_mark  # libyaml's Mark or PyYAML's
    top = MappingNode(
        loader.resolve(MappingNode, None, start.implicit),
        [],
        mark,
        None,
        flow_style=start.flow_style,
    )
    loader._depth += 1
    kept: list[Any] | None = None  # the last `items` key's, when it was streamed
    while not loader.check_event(MappingEndEvent):
        key = loader.compose_node(top, None)
        value = loader.peek_event()
        if (
            isinstance(key, ScalarNode)
            and key.tag == _STR_TAG
            and key.value == ITEMS
            and isinstance(value, SequenceStartEvent)
            and value.anchor is None
            and value.tag is None
        ):
            loader.get_event()
            loader._depth += 1
            kept = []
            while not loader.check_event(SequenceEndEvent):
                kept.append(keep(_build(loader, 3)))
            end = loader.get_event()
            loader._depth -= 1
            loader._composed += 1
            marks: tuple[Any, Any] = (value.start_mark, end.end_mark)
            placeholder = SequenceNode(_SEQ_TAG, [], *marks)
            top.value.append((key, placeholder))
        else:
            if isinstance(key, ScalarNode) and key.value == ITEMS:
                kept = None
            top.value.append((key, loader.compose_node(top, key)))
    top.end_mark = loader.get_event().end_mark
    loader._depth -= 1
    loader._composed += 1
    loader.get_event()  # DOCUMENT-END
    loader.anchors = {}
    doc = loader.construct_document(top)
    if kept is not None and isinstance(doc, dict):
        doc[ITEMS] = kept
    return doc


# A streamed item is built from the parser's events straight into Python objects: the
# composer's nodes and the constructor's second walk cost ~4x the parse (12.6 of 18 s for
# 1,000 Services). Anything beyond plain mappings, sequences and scalars (an anchor, an
# alias, an explicit tag) is handed, from that node down, to the composer and constructor
# above, with the depth reached so far: the same bounds and the same values.
_SCALARS: dict[tuple[str, bool], Any] = {}  # short plain/quoted scalars' values, shared
_SCALARS_MAX = 50_000
_MERGE_TAG = "tag:yaml.org,2002:merge"
_VALUE_TAG = "tag:yaml.org,2002:value"


def _scalar(loader: Any, event: Any, is_key: bool) -> Any:
    value = event.value
    plain = event.implicit[0]
    key = (value, plain)
    if key in _SCALARS:
        return _SCALARS[key]
    tag = loader.resolve(ScalarNode, value, event.implicit)
    if tag == _STR_TAG:
        out: Any = value
    elif tag in (_MERGE_TAG, _VALUE_TAG) and is_key:
        return _Special(tag)
    elif tag in (_MERGE_TAG, _VALUE_TAG):
        return loader.construct_document(
            ScalarNode(tag, value, event.start_mark, event.end_mark, style=event.style)
        )
    else:
        node = ScalarNode(tag, value, event.start_mark, event.end_mark, style=event.style)
        out = loader.construct_document(node)
    if len(value) <= 64 and len(_SCALARS) < _SCALARS_MAX:
        _SCALARS[key] = out
    return out


class _Special:
    """A `<<` (merge) or `=` (value) key, as the constructor reads them."""

    __slots__ = ("tag",)

    def __init__(self, tag: str) -> None:
        self.tag = tag


def _build(loader: Any, depth: int, is_key: bool = False) -> Any:
    """The next node as a Python object; `depth` is its own (the composer's count)."""
    event: Any = loader.peek_event()
    kind = type(event)
    if (kind is ScalarEvent or kind is MappingStartEvent or kind is SequenceStartEvent) and (
        event.anchor is None and event.tag is None
    ):
        if depth > MAX_DEPTH:
            raise LimitError(f"nested deeper than {MAX_DEPTH} levels (at {event.start_mark})")
        loader.get_event()
        if kind is ScalarEvent:
            return _scalar(loader, event, is_key)
        if kind is SequenceStartEvent:
            seq: list[Any] = []
            while not loader.check_event(SequenceEndEvent):
                seq.append(_build(loader, depth + 1))
            loader.get_event()
            return seq
        return _build_mapping(loader, event, depth)
    # anchors, aliases, tags: the composer from here down (loader._depth is its parent's)
    saved = loader._depth
    loader._depth = depth - 1
    try:
        node = loader.compose_node(None, None)
    finally:
        loader._depth = saved
    return loader.construct_document(node)


def _build_mapping(loader: Any, start: Any, depth: int) -> dict[Any, Any]:
    out: dict[Any, Any] = {}
    merged: list[dict[Any, Any]] = []
    while not loader.check_event(MappingEndEvent):
        key_event: Any = loader.peek_event()
        key = _build(loader, depth + 1, is_key=True)
        value = _build(loader, depth + 1)
        if type(key) is _Special:
            if key.tag == _VALUE_TAG:
                key = "="
            else:
                merged.extend(_merge_sources(value, start, key_event))
                continue
        try:
            out[key] = value
        except TypeError:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping",
                start.start_mark,
                "found unhashable key",
                key_event.start_mark,
            ) from None
    loader.get_event()
    if not merged:
        return out
    # as SafeConstructor.flatten_mapping: the mapping's own keys win, then a later `<<`
    # over an earlier one, and within one `<<: [a, b]` a over b
    flat: dict[Any, Any] = {}
    for source in merged:
        flat.update(source)
    flat.update(out)
    return flat


def _merge_sources(value: Any, start: Any, at: Any) -> list[dict[Any, Any]]:
    if isinstance(value, dict):
        return [value]
    if isinstance(value, list) and all(isinstance(v, dict) for v in value):
        return list(reversed(value))
    raise yaml.constructor.ConstructorError(
        "while constructing a mapping",
        start.start_mark,
        "expected a mapping or list of mappings for merging",
        at.start_mark,
    )


_STR_TAG = "tag:yaml.org,2002:str"
_SEQ_TAG = "tag:yaml.org,2002:seq"


def load_all_yaml(text: str | Readable, keep: Keep | None = None) -> Iterator[Any]:
    """yaml.safe_load_all with the limits; yaml.YAMLError (LimitError) beyond them. With
    `keep`, a document's top-level `items` are streamed through it (above)."""
    loader = SafeLoader(text)
    try:
        if keep is None:
            while loader.check_data():
                yield loader.get_data()
        else:
            while loader.check_node():
                yield _streamed_document(loader, keep)
    except yaml.YAMLError as exc:
        # libyaml 0.2.6 (PyYAML 6.0.4's wheels) stops a flow collection at 1,000 levels in
        # its scanner, which reads a flow collection whole before our composer sees it:
        # the same refusal as ours, said the same way.
        if "maximum nesting depth" in str(exc) and not isinstance(exc, LimitError):
            raise LimitError(
                f"nested deeper than {MAX_DEPTH} levels (at {getattr(exc, 'problem_mark', '?')})"
            ) from exc
        raise
    finally:
        loader.dispose()


def parse_error(where: str, fmt: str, exc: BaseException) -> str:
    """A parser's error as one line, `FILE:LINE:COLUMN: not valid YAML: what` (an editor's
    and a compiler's shape), for PyYAML's and json's errors, without PyYAML's
    `in "<unicode string>"` (it parsed a string, not the file)."""
    if isinstance(exc, json.JSONDecodeError):
        return f"{where}:{exc.lineno}:{exc.colno}: not valid {fmt}: {exc.msg}"
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        what = ", ".join(p for p in (exc.context, exc.problem) if p) or type(exc).__name__
        what = " ".join(what.split())
        if mark is not None:
            return f"{where}:{mark.line + 1}:{mark.column + 1}: not valid {fmt}: {what}"
        return f"{where}: not valid {fmt}: {what}"
    return f"{where}: not valid {fmt}: {' '.join(str(exc).split())}"

"""YAML and JSON with bounded depth, alias expansion (nodes and text) and size: hostile
manifests must fail with one clear error, never exhaust memory, hang, overflow the stack or
kill a thread.

libyaml's parser (CParser) is used when PyYAML has it: ~4x faster than the pure-Python
one on a 3,000-Service `kubectl get -o yaml` dump. Its C composer recurses without a bound
(a deeply nested document segfaults the process), so nodes are composed by PyYAML's Python
Composer, which counts depth and alias expansion here; that keeps most of the speed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.events import AliasEvent, Event
from yaml.nodes import Node, ScalarNode
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
    def __init__(self, stream: str) -> None:
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

        def __init__(self, stream: str) -> None:
            CParser.__init__(self, stream)
            Composer.__init__(self)
            SafeConstructor.__init__(self)
            Resolver.__init__(self)
            self._init_limits()

    SafeLoader: type = CSafeLoader
except ImportError:  # PyYAML built without libyaml
    SafeLoader = PySafeLoader


def load_all_yaml(text: str) -> Iterator[Any]:
    """yaml.safe_load_all with the limits; yaml.YAMLError (LimitError) beyond them."""
    loader = SafeLoader(text)
    try:
        while loader.check_data():
            yield loader.get_data()
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


def _check_depth(doc: Any) -> None:
    stack = [(doc, 1)]
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

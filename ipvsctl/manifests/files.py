"""Manifest files read into raw objects: `ipvsctl plan -f` and, per file, the folder
`ipvsctl run --manifests DIR` follows (source.py).

Files are `*.yaml`, `*.yml`, `*.json`; multi-document YAML and `kind: List` (or any
`*List`) are unpacked, through safeyaml's bounded parsers.
"""

from __future__ import annotations

import functools
import logging
import sys
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import yaml

from ipvsctl.manifests.safejson import CHUNK, load_json_stream
from ipvsctl.manifests.safeyaml import MAX_BYTES, Keep, load_all_yaml, parse_error
from ipvsctl.source.events import (
    ObjectKind,
    RawObject,
)
from ipvsctl.source.validate import short

log = logging.getLogger("ipvsctl.manifests")

SUFFIXES = (".yaml", ".yml", ".json")
_KINDS = {k.value: k for k in ObjectKind}
STDIN = Path("-")  # `plan -f -`: YAML or JSON (a YAML subset) from standard input


class ManifestError(Exception):
    """A file that is not YAML/JSON; the message names the file and the parser's words."""


ObjectId = tuple[ObjectKind, str, str]  # kind, namespace, name
# A document ipvsctl does not read: its kind ("" when it is no object), namespace and name
# ("document N of FILE" when it has none), for `plan`'s list of what it skipped.
OtherId = tuple[str, str, str]


@dataclass(frozen=True, slots=True)
class FileObjects:
    objects: dict[ObjectId, RawObject]
    ignored: int  # documents of other kinds
    others: tuple[OtherId, ...] = ()


class _Bounded:
    """A text file's read(), refused past MAX_BYTES characters (stdin has no size to stat)."""

    def __init__(self, f: IO[str], name: str) -> None:
        self._f, self._name, self._left = f, name, MAX_BYTES

    def read(self, n: int = -1) -> str:
        data = self._f.read(n if n >= 0 else self._left + 1)
        self._left -= len(data)
        if self._left < 0:
            raise ManifestError(f"{self._name}: larger than {MAX_BYTES} bytes")
        return data


def _spooled_stdin() -> IO[str]:
    """Standard input copied to a temporary file, bounded: read a chunk at a time like a
    file, and read again from its start when JSON turns out to be YAML."""
    spool = tempfile.TemporaryFile("w+", encoding="utf-8")  # noqa: SIM115 (returned open)
    left = MAX_BYTES
    while chunk := sys.stdin.read(CHUNK):
        left -= len(chunk)
        if left < 0:
            spool.close()
            raise ManifestError(f"standard input: larger than {MAX_BYTES} bytes")
        spool.write(chunk)
    spool.seek(0)
    return spool


def _starts_json(f: IO[str]) -> bool:
    head = f.read(4096).lstrip()
    f.seek(0)
    return head.startswith("{")


def _documents(path: Path, keep: Keep | None) -> Iterator[Any]:
    name = "standard input" if path == STDIN else str(path)
    try:
        if path == STDIN:
            f = _spooled_stdin()
        else:
            if path.stat().st_size > MAX_BYTES:
                raise ManifestError(f"{path}: larger than {MAX_BYTES} bytes")
            f = path.open(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ManifestError(f"{path}: cannot read: {exc}") from None
    with f:
        bounded = _Bounded(f, name)
        fmt = "JSON" if path.suffix == ".json" else "YAML"
        shown = fmt if path == STDIN else path.suffix[1:].upper()
        try:
            if fmt == "JSON":
                yield load_json_stream(bounded.read, keep or _whole)
                return
            if path == STDIN and keep is not None and _starts_json(f):
                # kubectl's -o json on a pipe: the faster parser, and YAML if it is not JSON
                try:
                    doc = load_json_stream(bounded.read, keep)
                except (ValueError, RecursionError):
                    f.seek(0)
                    bounded = _Bounded(f, name)
                else:
                    yield doc
                    return
            yield from load_all_yaml(bounded if keep is not None else bounded.read(), keep)
        except UnicodeDecodeError as exc:
            raise ManifestError(f"{path}: cannot read: {exc}") from None
        except (ValueError, yaml.YAMLError, RecursionError) as exc:
            raise ManifestError(parse_error(name, shown, exc)) from None


def _whole(item: Any) -> Any:
    return item


def _unpack(path: Path, doc: Any) -> Iterator[Any]:
    kind = doc.get("kind") if isinstance(doc, dict) else None
    if isinstance(kind, str) and kind.endswith("List") and "items" in doc:
        items = doc.get("items") or []
        if not isinstance(items, list):
            raise ManifestError(f"{path}: {kind}: items is not a list")
        for item in items:
            yield from _unpack(path, item)
    elif doc is not None:
        yield doc


def _reduced(keep: Keep, obj: Any) -> Any:
    """What stays of an object read: keep's part of a kind read, a nested List whole (it is
    unpacked later), of anything else what names it in plan's skipped list (`_other`)."""
    if not isinstance(obj, dict):
        return 0  # no object: named by its place, as any other
    kind = obj.get("kind")
    if isinstance(kind, str) and kind in _KINDS:
        return keep(obj)
    if isinstance(kind, str) and kind.endswith("List") and "items" in obj:
        return obj
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        return {"kind": kind}
    return {"kind": kind, "metadata": {k: meta.get(k) for k in ("namespace", "name")}}


def load_file(path: Path, keep: Keep | None = None) -> FileObjects:
    """The Services, EndpointSlices and Nodes of one file. ManifestError if
    unparseable. With `keep`, only what it returns of each is kept, and a `kind: List` is
    read an item at a time (never whole in memory: a live cluster's dump)."""
    objects: dict[ObjectId, RawObject] = {}
    others: list[OtherId] = []
    reduce = None if keep is None else functools.partial(_reduced, keep)
    for doc in _documents(path, reduce):
        if reduce is not None and doc is not None:
            doc = reduce(doc)  # a document that is no List (a List's items were reduced)
        for obj in _unpack(path, doc):
            raw_kind = obj.get("kind") if isinstance(obj, dict) else None
            kind = _KINDS.get(raw_kind) if isinstance(raw_kind, str) else None
            if kind is None:
                others.append(_other(path, obj, len(others) + len(objects) + 1))
                continue
            meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
            ns = meta.get("namespace") or "default"
            name = meta.get("name") or f"<unnamed #{len(objects)}>"
            # Objects without a usable name still go through, to be reported as invalid; a
            # name that is no string keys by short(): str() of an aliased list is gigabytes.
            ns, name = (
                v if isinstance(v, str) else f"{short(v)} #{len(objects)}" for v in (ns, name)
            )
            objects[(kind, ns, name)] = obj
    return FileObjects(objects, len(others), tuple(others))


def _other(path: Path, obj: Any, n: int) -> OtherId:
    where = f"document {n} of {'standard input' if path == STDIN else path}"
    if not isinstance(obj, dict):
        return "", "", where
    found = obj.get("metadata")
    meta: dict[str, Any] = found if isinstance(found, dict) else {}

    def text(v: Any) -> str:
        return v if isinstance(v, str) else short(v)

    return (
        text(obj.get("kind") or ""),
        text(meta.get("namespace") or ""),
        text(meta.get("name") or where),
    )


def manifest_files(paths: Iterable[str | Path]) -> list[Path]:
    """Files named, and manifest files inside folders named (recursively), sorted."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out.extend(sorted(f for f in p.rglob("*") if f.is_file() and f.suffix in SUFFIXES))
        elif p.exists() or p == STDIN:
            out.append(p)
        else:
            raise ManifestError(f"{p}: no such file or folder")
    return out


def load_paths(
    paths: Iterable[str | Path],
    others: list[OtherId] | None = None,
    keep: Keep | None = None,
) -> dict[ObjectKind, list[RawObject]]:
    """Every object in the paths, by kind (later files win on a duplicate name); the
    documents of other kinds are added to `others` when it is given; `keep` as
    load_file's."""
    merged: dict[ObjectId, RawObject] = {}
    for f in manifest_files(paths):
        loaded = load_file(f, keep)
        merged.update(loaded.objects)
        if others is not None:
            others.extend(loaded.others)
    by_kind: dict[ObjectKind, list[RawObject]] = {k: [] for k in ObjectKind}
    for (kind, _, _), obj in merged.items():
        by_kind[kind].append(obj)
    return by_kind

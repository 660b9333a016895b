"""Manifest files read into raw objects: `ipvsctl plan -f` and, per file, the folder
`ipvsctl run --manifests DIR` follows (source.py).

Files are `*.yaml`, `*.yml`, `*.json`; multi-document YAML and `kind: List` (or any
`*List`) are unpacked, through safeyaml's bounded parsers.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ipvsctl.manifests.safeyaml import MAX_BYTES, load_all_yaml, load_json, parse_error
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


def _documents(path: Path) -> Iterator[Any]:
    try:
        if path == STDIN:
            text = sys.stdin.read(MAX_BYTES + 1)
            if len(text) > MAX_BYTES:
                raise ManifestError(f"standard input: larger than {MAX_BYTES} bytes")
        else:
            if path.stat().st_size > MAX_BYTES:
                raise ManifestError(f"{path}: larger than {MAX_BYTES} bytes")
            text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ManifestError(f"{path}: cannot read: {exc}") from None
    try:
        if path.suffix == ".json":
            yield load_json(text)
        else:
            yield from load_all_yaml(text)
    except (ValueError, yaml.YAMLError, RecursionError) as exc:
        name, fmt = ("standard input", "YAML") if path == STDIN else (path, path.suffix[1:].upper())
        raise ManifestError(parse_error(str(name), fmt, exc)) from None


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


def load_file(path: Path) -> FileObjects:
    """The Services, EndpointSlices and Nodes of one file. ManifestError if
    unparseable."""
    objects: dict[ObjectId, RawObject] = {}
    others: list[OtherId] = []
    for doc in _documents(path):
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
    paths: Iterable[str | Path], others: list[OtherId] | None = None
) -> dict[ObjectKind, list[RawObject]]:
    """Every object in the paths, by kind (later files win on a duplicate name); the
    documents of other kinds are added to `others` when it is given."""
    merged: dict[ObjectId, RawObject] = {}
    for f in manifest_files(paths):
        loaded = load_file(f)
        merged.update(loaded.objects)
        if others is not None:
            others.extend(loaded.others)
    by_kind: dict[ObjectKind, list[RawObject]] = {k: [] for k in ObjectKind}
    for (kind, _, _), obj in merged.items():
        by_kind[kind].append(obj)
    return by_kind

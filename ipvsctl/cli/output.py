"""`-o table|wide|json|yaml` for `status` and `plan` (kubectl's habit), and the column
layout their tables share. Pure."""

from __future__ import annotations

import enum
import json
from collections.abc import Iterator, Sequence
from typing import Any

import yaml


class Output(enum.StrEnum):
    table = "table"
    wide = "wide"
    json = "json"
    yaml = "yaml"


def choose(output: Output | None, as_json: bool) -> Output:
    """`--json` is `-o json`; both at once must agree. ValueError when they do not."""
    if as_json and output not in (None, Output.json):
        raise ValueError(f"--json and -o {output.value} contradict each other")
    return Output.json if as_json else (output or Output.table)


def json_chunks(doc: Any, size: int = 1 << 16) -> Iterator[str]:
    """dump(doc, Output.json) in pieces of about `size` characters: a 10,000-Service plan
    is 21 MB of JSON, joined whole ~80 MB more at the peak."""
    parts: list[str] = []
    held = 0
    for part in json.JSONEncoder(indent=2).iterencode(doc):
        parts.append(part)
        held += len(part)
        if held >= size:
            yield "".join(parts)
            parts, held = [], 0
    parts.append("\n")
    yield "".join(parts)


def dump(doc: Any, fmt: Output) -> str:
    if fmt is Output.json:
        return json.dumps(doc, indent=2) + "\n"
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)


def hostport(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def columns(rows: Sequence[Sequence[str]], right: frozenset[int] = frozenset()) -> list[str]:
    """Rows laid out in columns as wide as their widest cell (an IPv6 address and port is up
    to 47 characters), two spaces apart; columns in `right` are right-aligned. The last
    column is never padded."""
    if not rows:
        return []
    widths = [max(len(r[i]) for r in rows if i < len(r)) for i in range(max(map(len, rows)))]
    out = []
    for r in rows:
        cells = [
            c
            if i == len(r) - 1 and i not in right
            else c.rjust(widths[i])
            if i in right
            else c.ljust(widths[i])
            for i, c in enumerate(r)
        ]
        out.append("  ".join(cells).rstrip())
    return out

"""Equal strings that many parsed objects repeat, kept once (one bounded table per process).

The JSON decoder makes a new string for every value it reads, so 10,000 Services and their
slices hold 20,000 copies of a few namespaces and port names (~55 bytes each), and
endpoints from a source that does not intern them (kube/trim.py does, for the watch path;
manifests do not) one copy of their node name and pod namespace each. Parsing passes such
values through `share`, which returns the one copy seen before. Only fields with few
distinct values in a cluster go through it, never names or uids unique per object.

Not `sys.intern`: interned strings are immortal from Python 3.12, and these are whatever
the API server sends (anyone who may write an EndpointSlice picks its node names). The
table is bounded instead: when full it starts again empty, which costs only sharing
(objects parsed before keep their copies; equality never depends on identity).
"""

from __future__ import annotations

MAX_SHARED = 8192  # distinct values kept: far above a cluster's nodes, namespaces and ports

_table: dict[str, str] = {}


def share(text: str) -> str:
    """`text`, or an equal string returned before (the same object)."""
    found = _table.get(text)
    if found is not None:
        return found
    if len(_table) >= MAX_SHARED:
        _table.clear()
    _table[text] = text
    return text

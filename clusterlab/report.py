"""A scenario's records into its row, and rows into tables. Pure.

What counts:
- **failed requests**: new connections that did not get their whole answer (refused, reset,
  timed out, closed early): short requests, and streams that never got their first answer.
  A scenario may declare windows in which new connections are *expected* to fail (a Service
  deleted and not yet back, a Deployment scaled to zero): failures that started inside one
  are counted apart (`expected`), never hidden, and everything outside counts.
- **resets**: every connection reset a client saw (a request's or a stream's; a new
  connection's in an expected window counts there).
- **cut streams**: streams that had started (their answer's head arrived) and ended any way
  but the server's close after its last line.
- **connect p99**: the 99th percentile (nearest rank) of the TCP handshake's time over
  short requests that connected, outside expected windows. It is the client's view: in the
  emulated lab it includes the wait for the harness's own threads (one Python process runs
  every client, app and controller), so it says more about the machine than the proxy.
- **UDP**: queries unanswered within their timeout (outside expected windows), and the
  longest stall: from the first failed query of a client to its next answered one.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from clusterlab.load import StreamRecord, UdpRecord
from demo.clients import Record

Window = tuple[float, float]


@dataclass
class Failure:
    t: float  # seconds since the scenario's start
    client: str
    what: str  # request, stream, cut stream, udp
    kind: str
    pod: str | None = None


@dataclass
class Summary:
    requests: int = 0
    failed: int = 0
    failed_by_kind: dict[str, int] = field(default_factory=dict)
    expected_failed: int = 0
    resets: int = 0
    streams: int = 0
    cut_streams: int = 0
    connect_p99_ms: float | None = None
    udp_queries: int = 0
    udp_failed: int = 0
    udp_expected_failed: int = 0
    udp_longest_stall: float = 0.0
    failures: list[Failure] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not (self.failed or self.resets or self.cut_streams or self.udp_failed)

    def to_json(self) -> dict[str, Any]:
        doc = dict(self.__dict__)
        doc["failures"] = [f.__dict__ for f in self.failures]
        doc["clean"] = self.clean
        return doc


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest rank: the smallest value with at least q% of the values at or below it."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def within(t: float, windows: Iterable[Window]) -> bool:
    return any(a <= t <= b for a, b in windows)


def summarise(
    short: Iterable[tuple[str, Record]],
    streams: Iterable[StreamRecord],
    udp: Iterable[UdpRecord],
    t0: float,
    expected: Sequence[Window] = (),
) -> Summary:
    """`short` pairs each request with its client's name; times are on the lab clock and
    come out relative to `t0` (the scenario's start)."""
    s = Summary()
    kinds: Counter[str] = Counter()
    connects: list[float] = []
    for client, r in short:
        s.requests += 1
        if r.connect is not None and not within(r.start, expected):
            connects.append(r.connect)
        if r.ok:
            continue
        kind = r.error or "?"
        if within(r.start, expected):
            s.expected_failed += 1
            continue
        if kind == "reset":
            s.resets += 1
        s.failed += 1
        kinds[kind] += 1
        s.failures.append(Failure(round(r.start - t0, 3), client, "request", kind))
    for st in streams:
        s.streams += 1
        if st.outcome == "reset":
            s.resets += 1
        if not st.cut:
            continue
        if st.pod is None:  # never answered: a failed new connection
            if within(st.start, expected):
                s.expected_failed += 1
                continue
            s.failed += 1
            kinds[st.outcome] += 1
            s.failures.append(Failure(round(st.start - t0, 3), st.client, "stream", st.outcome))
        else:
            s.cut_streams += 1
            s.failures.append(
                Failure(round(st.end - t0, 3), st.client, "cut stream", st.outcome, st.pod)
            )
    by_client: dict[str, list[UdpRecord]] = {}
    for q in udp:
        s.udp_queries += 1
        by_client.setdefault(q.client, []).append(q)
        if q.ok:
            continue
        if within(q.start, expected):
            s.udp_expected_failed += 1
            continue
        s.udp_failed += 1
        s.failures.append(Failure(round(q.start - t0, 3), q.client, "udp", "no answer"))
    for queries in by_client.values():
        s.udp_longest_stall = max(s.udp_longest_stall, longest_stall(queries, expected))
    s.failed_by_kind = dict(sorted(kinds.items()))
    p99 = percentile(connects, 99)
    s.connect_p99_ms = None if p99 is None else round(p99 * 1000, 1)
    s.failures.sort(key=lambda f: f.t)
    return s


def longest_stall(queries: Sequence[UdpRecord], expected: Sequence[Window] = ()) -> float:
    """The longest time from a failed query (outside expected windows) to the next answered
    one (or the last query's end when none is answered after it)."""
    longest, since = 0.0, None
    for q in sorted(queries, key=lambda q: q.start):
        if q.ok:
            if since is not None:
                longest = max(longest, q.end - since)
            since = None
        elif since is None and not within(q.start, expected):
            since = q.start
    if since is not None:
        longest = max(longest, queries[-1].end - since)
    return round(longest, 3)


def udp_verdicts(
    diagnosis: Iterable[dict[str, Any]], expected: Sequence[Window] = ()
) -> dict[str, int]:
    """What became of each unanswered query outside expected windows (scenarios'
    `udp_diagnosis`, times relative to the scenario's start): `lost` never reached a pod;
    `late` reached one whose answer came after the client's timeout; `unanswered` reached a
    pod and no answer came back in the run (dropped on the way back, or due on a one-shot
    socket already closed)."""
    out = {"lost": 0, "late": 0, "unanswered": 0}
    for q in diagnosis:
        if within(q["sent"], expected):
            continue
        if q["received_by"] is None:
            out["lost"] += 1
        elif q["late_answer_at"] is not None:
            out["late"] += 1
        else:
            out["unanswered"] += 1
    return out


def prestops(pods: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The preStops of a scenario's deleted pods (scenarios' `pods`): how many ended drained
    and how many at the shutdown-manager's timeout, the longest wait, and the connections
    SIGKILL found open at the grace period."""
    out: dict[str, Any] = {"drained": 0, "timeout": 0, "longest_s": None, "killed": 0}
    for p in pods:
        out["killed"] += p.get("killed_connections") or 0
        answer = p.get("prestop_answer")
        if not answer:
            continue
        outcome = answer.get("outcome")
        out[outcome if outcome in ("drained", "timeout") else "timeout"] += 1
        if p.get("prestop_start") is not None and p.get("prestop_end") is not None:
            waited = round(p["prestop_end"] - p["prestop_start"], 1)
            out["longest_s"] = max(out["longest_s"] or 0.0, waited)
    return out


# --- rendering ------------------------------------------------------------------------------
def cell(summary: dict[str, Any]) -> str:
    """One mode's part of a row: failed / resets / cut / p99 (and UDP when it had any)."""
    p99 = summary["connect_p99_ms"]
    out = (
        f"{summary['failed']} / {summary['resets']} / {summary['cut_streams']} / "
        f"{'-' if p99 is None else f'{p99:g} ms'}"
    )
    if summary["udp_queries"]:
        out += f"; UDP {summary['udp_failed']} failed, stall {summary['udp_longest_stall']:g} s"
    return out


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    """rows: {"scenario", "what", "ipvsctl": summary, "nodrain": summary} (either may be
    missing) -> the benchmarks table."""
    lines = [
        "| scenario | ipvsctl: failed / resets / cut / connect p99 | draining off: failed / "
        "resets / cut / connect p99 | requests, streams (ipvsctl run) |",
        "|---|---|---|---|",
    ]
    for row in rows:
        on, off = row.get("ipvsctl"), row.get("nodrain")
        sizes = "-" if on is None else f"{on['requests']} req, {on['streams']} streams"
        if on is not None and on["udp_queries"]:
            sizes += f", {on['udp_queries']} UDP"
        lines.append(
            f"| {row['scenario']} | {'-' if on is None else cell(on)} | "
            f"{'-' if off is None else cell(off)} | {sizes} |"
        )
    return "\n".join(lines)


def render_failures(failures: Sequence[dict[str, Any]], limit: int = 12) -> list[str]:
    out = [
        f"    t={f['t']:7.2f}s {f['client']:<10} {f['what']:<10} {f['kind']}"
        + (f" (pod {f['pod']})" if f.get("pod") else "")
        for f in failures[:limit]
    ]
    if len(failures) > limit:
        out.append(f"    ... {len(failures) - limit} more")
    return out

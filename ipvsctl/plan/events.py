"""Kubernetes Events: what they say, which get written, and how repeats aggregate. Pure:
the writer (`kube/events.py`) passes the time in.

Aggregation is client-go's events.k8s.io EventBroadcaster's (tools/events): Events with the
same key (type, action, reason, regarding object; the note is not part of it) within
`FINISH_AFTER` of the last one are one Event with a `series`: the second occurrence patches
`series.count` to 2 at once, later ones only count here, and the count is written when the
series has been quiet for `FINISH_AFTER` and every `REFRESH_EVERY` while it goes on.

On top, a rate limit for a whole node (CONTRACT.md "Events": a few per minute): a token
bucket that every new Event and every first series patch takes from. A new Event with no
token is not written (its connections are still counted by the caller's metric); a series
patch with no token waits for the series' final write.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from enum import StrEnum

from ipvsctl.model import ConnectionsCut, PodRef

FINISH_AFTER = 360.0  # client-go's finishTime: a series quiet this long is written and ended
REFRESH_EVERY = 1800.0  # client-go's refreshTime: a running series is written this often
MAX_CACHED = 1024  # Events remembered for aggregation; the oldest go first beyond this
NOTE_MAX = 1024  # the API server refuses a longer note
NAME_MAX = 253

CONTROLLER = "ipvsctl.io/ipvsctl"  # reportingController: a qualified name, as the API asks
CONNECTIONS_CUT = "ConnectionsCut"
QUIESCED = "Quiesced"
QUIESCE_TIMEOUT = "QuiesceTimeout"
TABLE_RESTORED = "IPVSTableRestored"
NODE_EVENTS_NAMESPACE = "default"  # where Events about a Node are written (as the kubelet's)


class EventType(StrEnum):
    NORMAL = "Normal"
    WARNING = "Warning"


@dataclass(frozen=True, slots=True)
class EventSpec:
    """One Event to record, before aggregation."""

    reason: str
    type: EventType
    action: str
    note: str
    regarding: PodRef  # a Node: its name, in namespace "default" (where Node Events go)
    kind: str = "Pod"  # the regarding object's: Pod or Node

    @property
    def key(self) -> tuple[str, str, str, PodRef]:
        """client-go's isomorphic key (getKey): the note is left out."""
        return (self.type.value, self.action, self.reason, self.regarding)


class Outcome(StrEnum):
    """What `observe` made of an Event (values of ipvsctl_events_total's `result`)."""

    CREATE = "created"  # a new Event: to be created
    SERIES = "series"  # the second of a kind: its series patched now
    AGGREGATED = "aggregated"  # counted in a series, written later
    RATE_LIMITED = "rate_limited"  # not written: over the node's rate


@dataclass(frozen=True, slots=True)
class Write:
    """A request for the writer: create the Event, or patch its series."""

    create: bool
    name: str
    spec: EventSpec
    first: float  # eventTime (wall seconds)
    count: int  # series.count; 1: a singleton (no series)
    last: float  # series.lastObservedTime


@dataclass(slots=True)
class _Cached:
    spec: EventSpec
    name: str
    first: float
    last: float
    written: float  # when its last write was asked for
    count: int = 1
    unwritten: bool = False  # its series count moved since the last write

    def write(self, create: bool = False) -> Write:
        return Write(create, self.name, self.spec, self.first, self.count, self.last)


class TokenBucket:
    """`burst` tokens, refilled at `per_second`."""

    def __init__(self, burst: int, per_second: float, now: float) -> None:
        self.burst = burst
        self.per_second = per_second
        self._tokens = float(burst)
        self._at = now

    def take(self, now: float) -> bool:
        if now > self._at:
            self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.per_second)
            self._at = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False


def event_name(pod_name: str, now: float) -> str:
    """client-go's `<regarding name>.<unix nanoseconds in hex>`."""
    suffix = f".{int(now * 1e9):x}"
    return pod_name[: NAME_MAX - len(suffix)] + suffix


class EventSeries:
    """The aggregation cache and the rate limit of one writer. One thread uses it."""

    def __init__(self, limit: TokenBucket, max_cached: int = MAX_CACHED) -> None:
        self.limit = limit
        self.max_cached = max_cached
        self._cache: dict[tuple[str, str, str, PodRef], _Cached] = {}  # oldest first

    def __len__(self) -> int:
        return len(self._cache)

    def observe(self, spec: EventSpec, now: float) -> tuple[Outcome, Write | None]:
        cached = self._cache.get(spec.key)
        if cached is not None:
            cached.count += 1
            cached.last = now
            if cached.count > 2 or not self.limit.take(now):
                cached.unwritten = True
                return Outcome.AGGREGATED, None
            cached.written = now
            cached.unwritten = False
            return Outcome.SERIES, cached.write()
        if not self.limit.take(now):
            return Outcome.RATE_LIMITED, None
        cached = _Cached(spec, event_name(spec.regarding.name, now), now, now, now)
        self._cache[spec.key] = cached
        while len(self._cache) > self.max_cached:
            del self._cache[next(iter(self._cache))]
        return Outcome.CREATE, cached.write(create=True)

    def failed(self, write: Write) -> None:
        """A create was not written (refused, or the server unreachable): forget it, so
        that the next of its kind is a new Event rather than a patch of nothing."""
        cached = self._cache.get(write.spec.key)
        if write.create and cached is not None and cached.name == write.name:
            del self._cache[write.spec.key]

    def due(self, now: float) -> list[Write]:
        """Series to write now (ended: quiet for FINISH_AFTER, or running for
        REFRESH_EVERY since their last write); ended singletons are forgotten."""
        out: list[Write] = []
        for key, c in list(self._cache.items()):
            if now - c.last >= FINISH_AFTER:
                del self._cache[key]
                if c.count > 1 and c.unwritten:
                    out.append(c.write())
            elif c.count > 1 and (now - c.written >= REFRESH_EVERY):
                c.written = now
                c.unwritten = False
                out.append(c.write())
        return out

    def pending(self) -> list[Write]:
        """Series counts not yet written (written at shutdown, so none is lost)."""
        return [c.write() for c in self._cache.values() if c.count > 1 and c.unwritten]


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def merge_cuts(cuts: Iterable[ConnectionsCut]) -> list[tuple[ConnectionsCut, int]]:
    """The cuts of one pod together (one deadline deletes a pod's real server from each of
    its Service's virtual servers: a ClusterIP, NodePorts, ...): the connections summed,
    the longest drain, and how many virtual servers; in the order first seen."""
    merged: dict[PodRef, tuple[ConnectionsCut, int]] = {}
    for cut in cuts:
        old = merged.get(cut.pod)
        if old is None:
            merged[cut.pod] = (cut, 1)
        else:
            first, n = old
            merged[cut.pod] = (
                replace(
                    first,
                    connections=first.connections + cut.connections,
                    drained_for=max(first.drained_for, cut.drained_for),
                ),
                n + 1,
            )
    return list(merged.values())


def in_own_namespace(cut: ConnectionsCut) -> bool:
    """Whether the cut's pod may carry its Event: only a pod in the namespace of the
    EndpointSlice that named it (its Service's; a slice and its Service share one). A
    hand-written slice's targetRef may name any namespace: a tenant must not make the node
    write Warnings into another's (kube-system). No Service known: no namespace to match."""
    return cut.service is not None and cut.pod.namespace == cut.service.namespace


def connections_cut(cut: ConnectionsCut, virtual_servers: int, node: str) -> EventSpec:
    """The Event on the pod: how many, through which node, after how long a drain."""
    where = f"{cut.service} " if cut.service else ""
    more = f" and {_plural(virtual_servers - 1, 'other')}" if virtual_servers > 1 else ""
    note = (
        f"{_plural(cut.connections, 'established connection')} cut through node {node} "
        f"after {cut.drained_for:.0f}s of draining: the drain deadline passed "
        f"({where}{cut.vs} -> {cut.rs}{more})"
    )
    return EventSpec(
        CONNECTIONS_CUT, EventType.WARNING, "DeleteRealServer", note[:NOTE_MAX], cut.pod
    )


def quiesce_outcome(
    pod: PodRef,
    *,
    quiesced: bool,
    nodes: int,
    seconds: float,
    still_sending: Iterable[str] = (),
    established: int | None = None,
) -> EventSpec:
    """The shutdown-manager's Event on its pod when its barrier ends."""
    if quiesced:
        note = f"{_plural(nodes, 'node')} quiesced in {seconds:.1f}s"
        reason, type_ = QUIESCED, EventType.NORMAL
    else:
        sending = sorted(still_sending)
        shown = ", ".join(sending[:10]) + (
            f" and {len(sending) - 10} more" if len(sending) > 10 else ""
        )
        note = f"timed out after {seconds:.1f}s: {_plural(nodes, 'node')} asked"
        if sending:
            note += f", still sending: {shown}"
        reason, type_ = QUIESCE_TIMEOUT, EventType.WARNING
    if established is not None:
        note += f"; {_plural(established, 'established connection')} at the end"
    return EventSpec(reason, type_, "Quiesce", note[:NOTE_MAX], pod)


def table_restored(node: str, what: str, virtual_servers: int, kube_proxy: bool) -> EventSpec:
    """The Warning on this node's Node when another program removed the table and the
    daemon put it back (CONTRACT.md "Beside another proxy")."""
    who = (
        "kube-proxy's IPVS cleanup (its nftables table is here)"
        if kube_proxy
        else "another program"
    )
    note = (
        f"ipvsctl put back {what} ({virtual_servers} virtual servers) after {who} removed it;"
        " established connections were held meanwhile"
    )
    return EventSpec(
        TABLE_RESTORED,
        EventType.WARNING,
        "Restore",
        note[:NOTE_MAX],
        PodRef(NODE_EVENTS_NAMESPACE, node),
        kind="Node",
    )

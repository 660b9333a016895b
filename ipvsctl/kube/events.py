"""EventWriter: Kubernetes Events (events.k8s.io/v1), written off the event path.

`record` only puts on a bounded queue (never blocks; a full queue drops the item and counts
it), and one thread (`run`) writes: a slow or failing API server delays no kernel change.
What is written, and how repeats become a `series`, is `plan/events.py`'s (client-go's
EventBroadcaster). The only calls: create, and patch for series (`kube.permissions`).

A 403 (the service account may not create Events) is logged once, counted every time; other
failures are retried a few times, then dropped, one log line per streak.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from kubernetes import client as k8s_client

from ipvsctl.kube.logs import LOGGER, describe
from ipvsctl.model import ConnectionsCut
from ipvsctl.obs.logging import FailureStreaks, fields
from ipvsctl.plan.events import (
    CONTROLLER,
    EventSeries,
    EventSpec,
    Outcome,
    TokenBucket,
    Write,
    connections_cut,
    in_own_namespace,
    merge_cuts,
)

QUEUE_SIZE = 256
BATCH = 64  # items taken at once: the cuts of one pod among them become one Event
TICK = 5.0  # seconds between looks at the series due
RATE_BURST = 5  # a few Events per minute per node (CONTRACT.md "Events")
RATE_PER_MINUTE = 4.0
RETRIES = 3
RETRY_PAUSE = 1.0

# (reason, result): ipvsctl_events_total's labels.
ResultCallback = Callable[[str, str], None]

Item = ConnectionsCut | EventSpec


def micro_time(t: float) -> str:
    """metav1.MicroTime as the API server writes it."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def event_body(w: Write, instance: str) -> dict[str, Any]:
    pod = w.spec.regarding
    regarding: dict[str, Any] = {"kind": w.spec.kind, "apiVersion": "v1", "name": pod.name}
    if w.spec.kind == "Pod":  # a Node is cluster-scoped
        regarding["namespace"] = pod.namespace
    if pod.uid:
        regarding["uid"] = pod.uid
    body: dict[str, Any] = {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": w.name, "namespace": pod.namespace},
        "eventTime": micro_time(w.first),
        "reportingController": CONTROLLER,
        "reportingInstance": instance[:128],
        "action": w.spec.action,
        "reason": w.spec.reason,
        "type": w.spec.type.value,
        "regarding": regarding,
        "note": w.spec.note,
    }
    if w.count > 1:
        body["series"] = {"count": w.count, "lastObservedTime": micro_time(w.last)}
    return body


class EventWriter:
    def __init__(
        self,
        api_client: k8s_client.ApiClient,
        *,
        instance: str,
        node: str = "",
        on_result: ResultCallback = lambda reason, result: None,
        clock: Callable[[], float] = time.time,
        queue_size: int = QUEUE_SIZE,
        limit: TokenBucket | None = None,
        timeout: tuple[float, float] = (5.0, 10.0),
        retry_pause: float = RETRY_PAUSE,
    ) -> None:
        self._client = api_client
        self.instance = instance  # reportingInstance: "ipvsctl-<node>"
        self.node = node
        self._on_result = on_result
        self._clock = clock
        self._queue: queue.Queue[Item] = queue.Queue(maxsize=queue_size)
        self.series = EventSeries(limit or TokenBucket(RATE_BURST, RATE_PER_MINUTE / 60.0, clock()))
        self._timeout = timeout
        self._retry_pause = retry_pause
        self._forbidden_logged = False
        self._other_namespace_logged = False
        self._failing = FailureStreaks(LOGGER)
        self._idle = threading.Condition()
        self._pending = 0  # items recorded and not yet tried (for `flush`)

    # ---- any thread --------------------------------------------------------------------

    def record(self, item: Item) -> bool:
        """Queue an Event (a cut, or a ready EventSpec); False when the queue is full (the
        item is dropped and counted), or for a cut whose pod is in another namespace than
        its slice (`in_own_namespace`: never written; counted, logged once)."""
        if isinstance(item, ConnectionsCut) and not in_own_namespace(item):
            self._on_result(_reason(item), "other_namespace")
            if not self._other_namespace_logged:
                self._other_namespace_logged = True
                LOGGER.warning(
                    "no Event on a pod outside its slice's namespace; counting in"
                    " ipvsctl_events_total",
                    extra=fields(
                        reason=_reason(item),
                        service=item.service,
                        pod=item.pod,
                    ),
                )
            return False
        with self._idle:
            self._pending += 1  # before the put: the writer may take it at once
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self._done(1)
            self._on_result(_reason(item), "dropped")
            return False
        return True

    def _done(self, n: int) -> None:
        with self._idle:
            self._pending -= n
            self._idle.notify_all()

    def flush(self, timeout: float) -> bool:
        """Wait until everything recorded so far has been tried (tests, the
        shutdown-manager's one Event). True when it was."""
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(min(left, 0.05))
        return True

    # ---- the writer thread -------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        next_tick = time.monotonic() + TICK
        while not stop.is_set():
            try:
                first = self._queue.get(timeout=min(TICK, 0.5))
            except queue.Empty:
                first = None
            if first is not None:
                batch = [first]
                while len(batch) < BATCH:
                    try:
                        batch.append(self._queue.get_nowait())
                    except queue.Empty:
                        break
                try:
                    self.write_batch(batch, stop)
                finally:
                    self._done(len(batch))
            if time.monotonic() >= next_tick:
                next_tick = time.monotonic() + TICK
                for w in self.series.due(self._clock()):
                    self._write(w, stop)
        for w in self.series.pending():  # the counts of running series, once more
            self._write(w, stop, retries=1)

    def write_batch(self, batch: list[Item], stop: threading.Event) -> None:
        specs = [i for i in batch if isinstance(i, EventSpec)]
        cuts = [i for i in batch if isinstance(i, ConnectionsCut)]
        specs += [connections_cut(c, n, self.node) for c, n in merge_cuts(cuts)]
        for spec in specs:
            outcome, w = self.series.observe(spec, self._clock())
            if w is None:
                self._on_result(spec.reason, outcome.value)
                continue
            if self._write(w, stop):
                self._on_result(spec.reason, outcome.value)
            elif outcome is Outcome.CREATE:
                self.series.failed(w)

    def _write(self, w: Write, stop: threading.Event, retries: int = RETRIES) -> bool:
        body = event_body(w, self.instance)
        ns = w.spec.regarding.namespace
        path = f"/apis/events.k8s.io/v1/namespaces/{ns}/events"
        for attempt in range(retries):
            try:
                if w.create:
                    self._call("POST", path, body)
                else:
                    patch = {"series": body["series"]}
                    try:
                        self._call("PATCH", f"{path}/{w.name}", patch)
                    except k8s_client.ApiException as exc:
                        if exc.status != 404:
                            raise
                        # gone (expired, deleted): as client-go, create it with its series
                        self._call("POST", path, body)
            except k8s_client.ApiException as exc:
                if exc.status == 403:
                    self._forbidden(w, exc)
                    return False
                if exc.status is not None and exc.status < 500 and exc.status != 429:
                    self._failed(w, "refused", exc)  # malformed: the same again would be too
                    return False
                err: Exception = exc
            except Exception as exc:  # the connection: refused, reset, timed out
                err = exc
            else:
                self._failing.recovered("events written again")
                return True
            if attempt + 1 < retries and stop.wait(self._retry_pause * (attempt + 1)):
                break
        self._failed(w, "error", err)
        return False

    def _call(self, method: str, path: str, body: dict[str, Any]) -> None:
        """One request with the body as is: the generated API methods would re-encode the
        times (Python's isoformat drops the fraction MicroTime requires when it is 0)."""
        content_type = (
            "application/strategic-merge-patch+json" if method == "PATCH" else "application/json"
        )
        params = self._client.param_serialize(
            method=method,
            resource_path=path,
            header_params={"Content-Type": content_type, "Accept": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
        )
        resp = self._client.call_api(*params, _request_timeout=self._timeout)
        resp.read()  # type: ignore[no-untyped-call]
        if not 200 <= resp.status < 300:
            raise k8s_client.ApiException(status=resp.status, reason=resp.reason)

    def _forbidden(self, w: Write, exc: Exception) -> None:
        self._on_result(w.spec.reason, "forbidden")
        if not self._forbidden_logged:
            self._forbidden_logged = True
            LOGGER.warning(
                "may not create Events (grant create and patch on events.k8s.io events);"
                " not recording them, counting in ipvsctl_events_total",
                extra=fields(
                    reason=w.spec.reason, namespace=w.spec.regarding.namespace, error=describe(exc)
                ),
            )

    def _failed(self, w: Write, result: str, exc: Exception) -> None:
        self._on_result(w.spec.reason, result)
        self._failing.failed(
            logging.WARNING,
            "event not written",
            reason=w.spec.reason,
            pod=w.spec.regarding,
            error=describe(exc),
        )


def _reason(item: Item) -> str:
    return item.reason if isinstance(item, EventSpec) else "ConnectionsCut"

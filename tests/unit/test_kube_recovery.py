# ruff: noqa: F811  (pytest fixtures imported from test_kube_source)
"""Backoff, outage recovery, suspect lists and cache reads of the API adapter, against the
fake API server. Requests are counted on the server."""

from __future__ import annotations

import time

import pytest

from devkit.fakeapi import FakeAPIServer, objects
from ipvsctl.kube.settings import KubeSettings
from ipvsctl.source.events import PreparedReplace, Replace, Upsert
from ipvsctl.source.prepare import Preparer
from tests.unit.test_kube_source import (  # noqa: F401  (fixtures)
    EPS,
    FAST,
    SVC,
    Harness,
    _with,
    api,
    harness,
    logs,
    names,
)

# A server that must be seen working for 5 s before the backoff resets (the time criterion
# must not hide what the event criterion does).
STRICT = _with(
    FAST, backoff_initial=0.02, backoff_max=0.64, healthy_watch_seconds=5.0, probe_interval=0.0
)


def restart_fields(logs, n: int) -> list[dict]:
    return [logs.next("watch restart", resource="services").fields for _ in range(n)]


# ---- 16.1: backoff on ERROR events and repeated 410s ---------------------------------------


def test_410_on_every_watch_relists_once_at_once_then_backs_off(api, harness, logs) -> None:
    # Regression: the ERROR event counted as progress, so this relisted with zero delay in a
    # tight loop (tens of thousands of lists in seconds).
    h = harness(STRICT).start()
    h.synced()
    api.fail_next("watch", "Service", status=410, as_event=True, times=1000)
    api.close_watches("Service")
    fields = restart_fields(logs, 7)[1:]  # the first is the clean close
    assert [f["reason"] for f in fields] == ["expired"] * 6
    delays = [f["backoff"] for f in fields]
    assert delays[0] == 0.0  # the first 410 relists at once ...
    assert all(d > 0 for d in delays[1:])  # ... a repeated one backs off, growing
    assert delays[5] > 4 * delays[2], delays
    h.close()
    lists = api.count("list", "Service")
    assert lists <= 1 + 6 + 1, lists  # initial + one per restart (+ one in flight at stop)


@pytest.mark.parametrize("status", [500, 504])
def test_error_events_back_off_instead_of_relisting_at_the_initial_delay(
    api, harness, logs, status: int
) -> None:
    # Regression: an ERROR 500/504 event reset the backoff, so every retry came after
    # backoff_initial, forever.
    h = harness(STRICT).start()
    h.synced()
    api.fail_next("watch", "Service", status=status, as_event=True, times=1000)
    api.close_watches("Service")
    fields = restart_fields(logs, 7)[1:]
    assert {f["reason"] for f in fields} == {"error"}
    delays = [f["backoff"] for f in fields]
    assert delays[:4] == sorted(delays[:4]) and delays[5] > 8 * delays[0], delays
    # A 5xx is the server's trouble, not ours: the watch resumes, nothing is relisted.
    assert not any(f["relist"] for f in fields)
    assert api.count("list", "Service") == 1
    h.close()


def test_a_watch_that_delivered_then_failed_does_not_reset_the_backoff(api, harness, logs):
    """Delivering something and failing within the healthy time is no progress
    (client-go: only time resets the backoff, `BackoffManager`'s tests)."""
    h = harness(STRICT).start()
    h.synced()
    api.fail_next("watch", "Service", status=500, as_event=True, times=4)
    api.close_watches("Service")
    fields = restart_fields(logs, 5)
    assert fields[4]["backoff"] > 4 * fields[1]["backoff"]
    api.wait_for(lambda: api.open_watches("Service") == 1)
    api.add(objects.service("web", cluster_ip="10.96.0.10"))  # progress on the new watch
    assert isinstance(h.next(SVC), Upsert)
    api.fail_next("watch", "Service", status=500, as_event=True, times=1)
    api.close_watches("Service")
    fields = restart_fields(logs, 2)
    assert fields[1]["reason"] == "error"
    assert fields[1]["backoff"] > 4 * STRICT.backoff_initial  # still backing off
    h.close()


# ---- 16.2: catch-up after an outage --------------------------------------------------------


def test_after_an_outage_a_change_arrives_soon_after_the_server_returns(api, harness) -> None:
    # The backoff has grown to 30 s; the /readyz probe ends the pause once the server is
    # back. Regression: the change waited out the whole backoff.
    settings = _with(
        FAST,
        backoff_initial=30.0,
        backoff_max=30.0,
        probe_interval=0.05,
        recovery_spread=0.05,
        healthy_watch_seconds=5.0,
    )
    h = harness(settings).start()
    h.synced()
    api.down()
    assert h.restart("services") == "error"
    api.add(objects.service("after", cluster_ip="10.96.0.20"))
    api.up()
    returned = time.monotonic()
    event = h.next(SVC)  # waits at most 5 s, far less than the 30 s backoff
    assert isinstance(event, Upsert) and event.obj["metadata"]["name"] == "after"
    assert time.monotonic() - returned < 5.0
    assert api.count("list") == 2  # the outage cost no relist: the watches resumed
    assert h.source.probe.probes > 0
    assert any(r.path == "/readyz" for r in api.requests)
    h.close()


def test_probe_does_not_raise_the_retry_rate_of_a_server_that_answers_but_fails(
    api, harness
) -> None:
    # /readyz answers while every list fails with 503: retries keep the backoff's pace
    # (0.4 s, >= 0.32 s with jitter), not the probe's (every ~0.02 s).
    settings = _with(
        FAST,
        backoff_initial=0.4,
        backoff_max=0.4,
        probe_interval=0.02,
        recovery_spread=0.0,
        healthy_watch_seconds=5.0,
    )
    h = harness(settings).start()
    h.synced()
    api.fail_next("list", "Service", status=503, times=1000)
    api.expire_watches("Service")
    assert h.restart("services") == "expired"
    assert h.restart("services") == "error"
    began = time.monotonic()
    for _ in range(3):
        assert h.restart("services") == "error"
    assert time.monotonic() - began >= 3 * 0.32
    assert h.source.probe.probes > 0  # it was probing all along
    h.close()


# ---- 11.7: a Service list without default/kubernetes ---------------------------------------


# Raw lists, and lists parsed as they are decoded (the daemon's): the check reads either.
PREPARE = pytest.mark.parametrize("prepare", [None, Preparer()], ids=["raw", "prepared"])


@PREPARE
def test_empty_service_list_is_refused_and_retried_with_backoff(
    api, harness, logs, prepare
) -> None:
    api.add(objects.service("web", cluster_ip="10.96.0.10"))
    h = harness(_with(STRICT, backoff_initial=0.01, backoff_max=0.08), prepare).start()
    h.synced()
    api.serve_empty_lists("Service", times=3)
    api.expire_watches("Service")
    reasons = [h.restart("services") for _ in range(4)]
    assert reasons == ["expired", "suspect", "suspect", "suspect"]
    again = h.next(SVC)  # the first Service event after the empty lists: the real list
    assert isinstance(again, Replace | PreparedReplace) and names(again) == ["web"]
    assert api.count("list", "Service") == 1 + 3 + 1
    refused = [r for r in logs.all() if r.getMessage() == "list refused, table kept"]
    assert len(refused) == 1 and "default/kubernetes" in refused[0].fields["problem"]
    assert [r for r in logs.all() if r.getMessage() == "list accepted again"]
    suspect = [
        r.fields
        for r in logs.all()
        if r.getMessage() == "watch restart" and r.fields.get("reason") == "suspect"
    ]
    assert suspect[2]["backoff"] > suspect[0]["backoff"]  # backed off
    h.close()


@PREPARE
def test_initial_list_without_default_kubernetes_is_not_applied(prepare) -> None:
    with FakeAPIServer(kubernetes_service=False) as bare:
        bare.add(objects.service("web", cluster_ip="10.96.0.10"))
        hh = Harness(bare, _with(FAST, backoff_initial=0.01, backoff_max=0.02), prepare).start()
        try:
            assert hh.restart("services") == "suspect"
            assert isinstance(hh.next(EPS), Replace | PreparedReplace)  # slices are not held back
            assert hh.empty(SVC)  # no Service Replace: the daemon stays unready
            bare.add(
                {
                    "kind": "Service",
                    "metadata": {"name": "kubernetes"},
                    "spec": {"clusterIP": "None"},
                }
            )
            assert names(hh.replace(SVC)) == ["web"]
        finally:
            hh.close()


# ---- 17.2: lists from the watch cache ------------------------------------------------------


def test_lists_are_served_from_the_watch_cache(api, harness) -> None:
    h = harness().start()
    h.synced()
    first = [r.query for r in api.requests if r.verb == "list"]
    assert {q.get("resourceVersion") for q in first} == {"0"}
    rv = h.source.reflectors[0].resource_version
    api.expire_watches("Service")
    assert isinstance(h.replace(SVC), Replace | PreparedReplace)
    relist = [r.query for r in api.requests if r.verb == "list" and r.resource == "services"][-1]
    # The relist never goes back before what was applied: NotOlderThan our version.
    assert relist["resourceVersion"] == rv and relist["resourceVersionMatch"] == "NotOlderThan"
    assert api.list_reads() == {"cache": 3, "etcd": 0}
    h.close()


def test_relist_falls_back_to_a_consistent_read_when_the_cache_cannot_serve(api, harness) -> None:
    h = harness().start()
    h.synced()
    api.fail_next("list", "Service", status=504)  # "Too large resource version"
    api.expire_watches("Service")
    assert h.restart("services") == "expired"
    assert h.restart("services") == "error"
    assert isinstance(h.replace(SVC), Replace | PreparedReplace)
    queries = [r.query for r in api.requests if r.verb == "list" and r.resource == "services"]
    assert "resourceVersion" not in queries[-1]  # etcd, once
    assert api.list_reads("Service") == {"cache": 2, "etcd": 1}
    h.wait_watching("Service")
    api.expire_watches("Service")
    assert isinstance(h.replace(SVC), Replace | PreparedReplace)
    assert api.list_reads("Service") == {"cache": 3, "etcd": 1}  # back to the cache
    h.close()


@pytest.mark.parametrize("cache_pagination", [True, False])
def test_cache_lists_with_and_without_pagination(cache_pagination: bool) -> None:
    with FakeAPIServer(cache_pagination=cache_pagination) as server:
        for i in range(7):
            server.add(objects.service(f"s{i}", cluster_ip=f"10.96.1.{i}"))
        h = Harness(server, _with(FAST, page_size=3)).start()
        try:
            services, _ = h.synced()
            assert names(services) == [f"s{i}" for i in range(7)]
            pages = [
                r.query for r in server.requests if r.verb == "list" and r.resource == "services"
            ]
            assert len(pages) == (3 if cache_pagination else 1)
            # Later pages carry the continue token and no resourceVersion (400 otherwise).
            assert all("resourceVersion" not in q for q in pages[1:])
        finally:
            h.close()


def test_settings_defaults_meet_the_catch_up_target() -> None:
    s = KubeSettings()
    # Worst case after the server returns: one jittered probe interval, the spread, a list.
    assert 1.5 * s.probe_interval + s.recovery_spread + s.probe_timeout <= 10.0


def test_daemon_keeps_its_table_when_a_relist_comes_back_empty(tmp_path) -> None:
    # Regression (11.7): a 200 OK list without items deleted every virtual server at once.
    from devkit.builders import endpoint, endpoint_slice, service
    from devkit.harness import rs, vs
    from ipvsctl.kernel.fake import FakeKernel
    from tests.unit.test_daemon import wait_for
    from tests.unit.test_daemon_api import A, start_daemon

    with FakeAPIServer() as server:
        server.add(service("web"))
        server.add(endpoint_slice("web", [endpoint(A, pod="web-1")]))
        kernel = FakeKernel()
        d = start_daemon(server, tmp_path, kernel)
        try:
            wait_for(lambda: kernel.weight(vs(), rs(A)) == 1)
            with d.loop.lock:
                kernel.take_ops()
            assert server.wait_for(lambda: server.open_watches("Service") == 1)
            server.serve_empty_lists("Service", times=2)
            server.expire_watches("Service")
            wait_for(
                lambda: (
                    d.metrics.value(
                        "ipvsctl_watch_restarts_total",
                        {"resource": "services", "reason": "suspect"},
                    )
                    >= 2
                )
            )
            server.add(service("marker", cluster_ip="10.96.0.99"))  # seen once relisted
            wait_for(lambda: any("10.96.0.99" in op for op in list(kernel.ops)))
            assert not [op for op in list(kernel.ops) if op.startswith("del")]
            assert kernel.weight(vs(), rs(A)) == 1
        finally:
            d.shutdown()


# ---- 17.4: relists after a long outage are spread by cluster size --------------------------


@PREPARE
def test_relist_after_a_long_outage_is_spread_by_cluster_size(api, harness, logs, prepare) -> None:
    api.add(
        objects.endpoint_slice(
            "web-1", "web", [objects.endpoint(f"10.244.{n}.5", node=f"node-{n}") for n in range(3)]
        )
    )
    h = harness(_with(FAST, relist_spread_per_node=0.05, probe_interval=0.0), prepare).start()
    h.synced()
    assert h.source.cluster_nodes == 3
    api.down()
    assert h.restart("services") == "error"
    api.add(objects.service("during", cluster_ip="10.96.0.30"))
    api.compact()  # longer than the watch history: the resumed watch will get 410
    api.up()
    rec = logs.next("watch restart", resource="services", reason="expired")
    assert 0.0 < rec.fields["backoff"] <= 0.05 * 3  # spread, not at once
    assert isinstance(h.replace(SVC), Replace | PreparedReplace)
    h.close()


# ---- 17.2: WatchList where the server offers it, lists where it does not -------------------


def _watch_list_requests(server: FakeAPIServer, plural: str) -> list[dict]:
    return [
        dict(r.query)
        for r in server.requests
        if r.resource == plural and r.verb == "watch" and r.query.get("sendInitialEvents") == "true"
    ]


def test_watch_list_streams_the_initial_state_without_a_list() -> None:
    with FakeAPIServer() as server:
        server.add(objects.service("web", cluster_ip="10.96.0.10"))
        h = Harness(server, _with(FAST, watch_list=True)).start()
        try:
            services, _ = h.synced()
            assert names(services) == ["web"]
            assert server.count("list") == 0
            q = _watch_list_requests(server, "services")
            assert len(q) == 1 and q[0]["resourceVersionMatch"] == "NotOlderThan"
            server.add(objects.service("later", cluster_ip="10.96.0.11"))
            event = h.next(SVC)  # on the regular watch from the end bookmark's version
            assert isinstance(event, Upsert) and event.obj["metadata"]["name"] == "later"
            server.expire_watches("Service")
            assert names(h.replace(SVC)) == ["later", "web"]
            assert server.count("list") == 0
            assert len(_watch_list_requests(server, "services")) == 2
        finally:
            h.close()


@pytest.mark.parametrize("mode", ["off", "ignore"])
def test_watch_list_falls_back_to_lists_for_good(mode: str, logs) -> None:
    with FakeAPIServer(watch_list=mode) as server:
        server.add(objects.service("web", cluster_ip="10.96.0.10"))
        h = Harness(server, _with(FAST, watch_list=True, list_read_timeout=0.3)).start()
        try:
            assert names(h.replace(SVC)) == ["web"]
            assert server.count("list", "Service") == 1
            logs.next("watch-list not offered, listing instead", resource="services")
            # The regular watch is open (an ignored watch-list stream may linger on the
            # server until its timeout, so open watches are not counted exactly).
            assert server.wait_for(
                lambda: (
                    server.count("watch", "Service") > len(_watch_list_requests(server, "services"))
                    and server.open_watches("Service")
                )
            )
            server.expire_watches("Service")
            assert names(h.replace(SVC)) == ["web"]
            assert server.count("list", "Service") == 2
            assert len(_watch_list_requests(server, "services")) <= 1  # never tried again
        finally:
            h.close()

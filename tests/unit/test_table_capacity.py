"""The node's IPVS table is bounded (`--max-table-entries`): the rule (plan/capacity.py) over
every arrival order, and the engine keeping to it at every transition: the newest Services
are refused whole, a refused one takes nothing from a programmed one, freed room lets the
refused ones in with work only for them, a restart admits what the running daemon did."""

from __future__ import annotations

import dataclasses
import itertools
import logging
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from devkit.builders import endpoint, endpoint_slice, service
from devkit.harness import NODE, Harness, vs
from ipvsctl.kernel.fake import FakeKernel
from ipvsctl.model import NodeContext, ServiceRef
from ipvsctl.plan.capacity import Capacity, admit, rank
from ipvsctl.reconcile.cluster import plan_objects
from ipvsctl.source.events import ObjectKind


def ref(name: str, namespace: str = "default") -> ServiceRef:
    return ServiceRef(namespace, name)


# --- the rule -----------------------------------------------------------------------------

# (Services: (name, created, size), limit, refused)
CASES = [
    ("everything fits", [("a", 1.0, 40), ("b", 2.0, 60)], 100, set()),
    ("the newest is refused", [("a", 1.0, 40), ("b", 2.0, 40), ("c", 3.0, 40)], 100, {"c"}),
    ("order of creation, not of name", [("z", 1.0, 60), ("a", 2.0, 60)], 100, {"a"}),
    ("a big one refused, a smaller newer one still fits", [("a", 1.0, 60), ("b", 2.0, 50),
     ("c", 3.0, 30)], 100, {"b"}),
    ("one alone over the limit", [("huge", 1.0, 101), ("a", 2.0, 1)], 100, {"huge"}),
    ("same second: namespace/name", [("b", 5.0, 60), ("a", 5.0, 60)], 100, {"b"}),
    ("no creation time ranks after one", [("m", None, 60), ("n", 9.0, 60)], 100, {"m"}),
    ("exactly at the limit fits", [("a", 1.0, 50), ("b", 2.0, 50)], 100, set()),
]  # fmt: skip


def sizes_of(services: list[tuple[str, float | None, int]]) -> dict[ServiceRef, Any]:
    return {ref(n): (rank(created, ref(n)), size) for n, created, size in services}


@pytest.mark.parametrize(
    ("services", "limit", "refused"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_the_newest_services_are_refused_whatever_the_arrival_order(services, limit, refused):
    expected = {ref(n) for n in refused}
    assert admit(sizes_of(services), limit) == expected
    for order in itertools.permutations(services):
        c = Capacity(limit)
        for n, created, size in order:
            c.update(ref(n), rank(created, ref(n)), size)
        assert c.refused == expected, order
        assert c.used == sum(s for n, _, s in services if ref(n) not in expected)


def test_an_update_says_which_other_services_changed_side():
    c = Capacity(100)
    assert c.update(ref("a"), rank(1.0, ref("a")), 40) == set()
    assert c.update(ref("b"), rank(2.0, ref("b")), 40) == set()
    assert c.update(ref("c"), rank(3.0, ref("c")), 40) == set()  # c itself: refused
    assert c.refused == {ref("c")}
    assert c.update(ref("a"), rank(1.0, ref("a")), 40) == set()  # unchanged: no work
    assert c.update(ref("a"), None, 0) == {ref("c")}  # a gone: c gets in
    assert c.update(ref("a"), rank(1.0, ref("a")), 70) == {ref("b"), ref("c")}  # old one back
    assert c.refused == {ref("b"), ref("c")} and c.used == 70
    assert c.size(ref("b")) == 40 and c.size(ref("zz")) == 0


ops = st.lists(
    st.tuples(
        st.sampled_from("abcdefgh"),
        st.one_of(st.none(), st.integers(0, 5).map(float)),
        st.integers(0, 40),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(ops, st.integers(0, 120))
def test_incremental_updates_end_where_the_whole_set_rule_does(changes, limit):
    """Any sequence of changes (sizes, creation times, Services gone: size 0) leaves the
    same refusals as the rule applied to the end state, and each update's answer names
    exactly the Services that changed side."""
    c = Capacity(limit)
    now: dict[ServiceRef, Any] = {}
    created_of: dict[str, float | None] = {}
    for name, created, size in changes:
        created = created_of.setdefault(name, created)  # a Service's creation time is fixed
        r = ref(name)
        before = c.refused
        flipped = c.update(r, rank(created, r), size)
        if size:
            now[r] = (rank(created, r), size)
        else:
            now.pop(r, None)
        assert c.refused == admit(now, limit)
        assert flipped == set(before ^ c.refused) - {r}
        assert c.used == sum(s for x, (_, s) in now.items() if x not in c.refused)


# --- the engine ---------------------------------------------------------------------------

PORTS = 8
PER_SERVICE = PORTS * (1 + 3)  # 8 virtual servers of 3 real servers each: 32 entries


def tenant(i: int, created: str, ports: int = PORTS, pods: int = 3, **spec: Any) -> list[dict]:
    """A Service of `ports` ports on its cluster IP with `pods` endpoints, and its slice."""
    name = f"svc{i:03d}"
    svc = service(
        name,
        cluster_ip=f"10.96.{i // 250}.{i % 250 + 1}",
        ports=[{"name": f"p{j}", "port": 1000 + j, "protocol": "TCP"} for j in range(ports)],
        namespace="tenant",
        **spec,
    )
    svc["metadata"]["creationTimestamp"] = created
    sl = endpoint_slice(
        name,
        [endpoint(f"10.{100 + i // 250}.{i % 250}.{k + 1}") for k in range(pods)],
        ports=[{"name": f"p{j}", "port": 8000 + j, "protocol": "TCP"} for j in range(ports)],
        namespace="tenant",
    )
    return [svc, sl]


def at(minute: int) -> str:
    return f"2025-01-01T{minute // 60:02d}:{minute % 60:02d}:00Z"


def node(limit: int) -> NodeContext:
    return dataclasses.replace(NODE, max_table_entries=limit)


def programmed(h: Harness) -> set[str]:
    """The Services with virtual servers in the kernel at weight 1, by name."""
    owner = h.engine.state.owner
    return {
        owner[v.key].name
        for v in h.fake.list_virtual_servers()
        if any(r.weight for r in h.fake.list_real_servers(v.key))
    }


def entries_in_kernel(h: Harness) -> int:
    keys = [v.key for v in h.fake.list_virtual_servers()]
    return len(keys) + sum(len(h.fake.list_real_servers(k)) for k in keys)


def invalid(h: Harness) -> float:
    return h.metrics.value("ipvsctl_invalid_objects_total", {"kind": "Service"})


def split(objs: list[list[dict]]) -> tuple[list[dict], list[dict]]:
    return [o[0] for o in objs], [o[1] for o in objs]


def test_many_services_at_the_per_service_limit_do_not_fill_the_node():
    """The attack's shape: Services of 1,024 ports (the per-Service limit) with a few pods
    each. Without a node-wide limit every one was programmed (40 x 20 pods: 819,200 real
    servers, a 15 s sync under the loop lock); now the oldest that fit are, the rest are
    refused whole, counted, and the table stays within the limit."""
    per_service = 1024 * (1 + 5)
    limit = 3 * per_service + 100
    h = Harness(node=node(limit))
    services, slices = split([tenant(i, at(i), ports=1024, pods=5) for i in range(10)])
    h.start(services, slices)
    assert programmed(h) == {"svc000", "svc001", "svc002"}
    assert entries_in_kernel(h) == 3 * per_service <= limit
    assert invalid(h) == 7
    assert h.metrics.value("ipvsctl_table_refused_services") == 7
    assert h.metrics.value("ipvsctl_table_entries") == 3 * per_service
    assert h.metrics.value("ipvsctl_table_entries_limit") == limit


def test_a_new_service_that_does_not_fit_changes_nothing_programmed(caplog):
    h = Harness(node=node(3 * PER_SERVICE))
    h.start(*split([tenant(i, at(i)) for i in range(3)]))
    h.ops()
    svc, sl = tenant(9, at(9))
    h.upsert(sl)
    h.upsert(svc)
    assert h.ops() == []
    assert programmed(h) == {"svc000", "svc001", "svc002"}
    lines = [r for r in caplog.records if r.getMessage() == "virtual servers refused"]
    assert len(lines) == 1 and lines[0].fields["service"] == "tenant/svc009"
    assert "--max-table-entries 96" in lines[0].fields["reason"]
    for k in range(4, 7):  # its slice changes: its size changes, no new line, no count
        h.upsert(endpoint_slice(
            "svc009", [endpoint(f"10.100.9.{j}") for j in range(1, k)],
            ports=sl["ports"], namespace="tenant",
        ))  # fmt: skip
    assert invalid(h) == 1
    assert len([r for r in caplog.records if r.getMessage() == "virtual servers refused"]) == 1


def test_a_refused_service_takes_no_address_from_a_programmed_one():
    """An older Service naming a newer one's external IP would win it by the conflict rule;
    refused by the table, it claims nothing, and the programmed one keeps it."""
    h = Harness(node=node(3 * PER_SERVICE))
    mine_svc, mine_sl = tenant(1, at(30), ports=2, externalIPs=["203.0.113.7"])
    h.start([mine_svc], [mine_sl])
    key = vs("203.0.113.7", 1000)
    assert h.engine.state.owner[key] == ref("svc001", "tenant")
    # older (the conflict rule's winner), and too big for the table on its own
    big_svc, big_sl = tenant(2, at(1), ports=200, externalIPs=["203.0.113.7"])
    h.upsert(big_sl)
    h.upsert(big_svc)
    assert h.engine.state.owner[key] == ref("svc001", "tenant")
    assert {r.weight for r in h.fake.list_real_servers(key)} == {1}
    assert h.metrics.value("ipvsctl_table_refused_services") == 1
    assert h.metrics.value("ipvsctl_virtual_server_conflict_losers") == 0


def test_freed_room_lets_the_refused_services_in_syncing_only_them():
    h = Harness(node=node(3 * PER_SERVICE))
    objs = [tenant(i, at(i)) for i in range(40)]
    h.start(*split(objs))
    assert programmed(h) == {"svc000", "svc001", "svc002"}
    h.delete(objs[1][0], sync=False)
    result = h.engine.sync()
    assert programmed(h) == {"svc000", "svc002", "svc003"}  # the oldest refused one
    assert result.services == 2  # the deleted one and the one let in, not all 40
    assert h.metrics.value("ipvsctl_table_refused_services") == 36
    # a change to a refused Service that still does not fit costs its own rebuild only
    slice9 = objs[9][1]
    slice9["endpoints"] = slice9["endpoints"][:2]
    h.upsert(slice9, sync=False)
    assert h.engine.sync().services == 1
    assert programmed(h) == {"svc000", "svc002", "svc003"}


def test_an_older_service_that_grows_makes_the_newest_drain_not_vanish():
    """Past the limit the newest give way, whoever grew: they drain as a deleted Service's
    virtual servers do (weight 0, --service-drain-timeout), and come back in place."""
    h = Harness(node=node(3 * PER_SERVICE), service_drain_timeout=30.0)
    objs = [tenant(i, at(i)) for i in range(3)]
    h.start(*split(objs))
    grown = objs[0][1]
    grown["endpoints"] = [endpoint(f"10.100.0.{k}") for k in range(1, 6)]  # 3 -> 5 pods
    h.upsert(grown)
    assert programmed(h) == {"svc000", "svc001"}
    newest = vs("10.96.0.3", 1000)
    assert [r.weight for r in h.fake.list_real_servers(newest)] == [0, 0, 0]
    assert h.engine.drains.draining_virtual_servers[newest] == ref("svc002", "tenant")
    grown["endpoints"] = grown["endpoints"][:3]  # back to 3: the newest gets back in place
    h.upsert(grown)
    assert programmed(h) == {"svc000", "svc001", "svc002"}
    assert [r.weight for r in h.fake.list_real_servers(newest)] == [1, 1, 1]
    assert not h.engine.drains.draining_virtual_servers


@pytest.mark.parametrize("seed", range(4))
def test_arrival_order_and_restart_do_not_change_who_is_programmed(seed):
    objs = [tenant(i, at(60 - i)) for i in range(12)]  # names and ages in opposite orders
    expected = {f"svc{i:03d}" for i in range(9, 12)}  # the three oldest
    rng = random.Random(seed)
    order = objs[:]
    rng.shuffle(order)
    kernel = FakeKernel()
    h = Harness(kernel, node=node(3 * PER_SERVICE))
    h.start(*split(order[:6]))
    for svc, sl in order[6:]:  # the rest as watch events, in a random order
        h.upsert(sl)
        h.upsert(svc)
    assert programmed(h) == expected
    # a restart over that table, the list in yet another order: nothing written
    h.ops()
    rng.shuffle(order)
    again = Harness(kernel, node=node(3 * PER_SERVICE))
    again.start(*split(order))
    assert programmed(again) == expected
    assert again.ops() == []


def test_status_shows_the_table_and_the_refused_services():
    h = Harness(node=node(2 * PER_SERVICE))
    h.start(*split([tenant(i, at(i)) for i in range(3)]))
    from ipvsctl.daemon.status_json import engine_status

    doc = engine_status(h.view)
    assert doc["table"] == {"entries": 2 * PER_SERVICE, "limit": 2 * PER_SERVICE}
    assert doc["skipped_total"] == 1
    assert doc["skipped"] == [
        {
            "kind": "Service",
            "namespace": "tenant",
            "name": "svc002",
            "reason": "does not fit in what older Services leave of the node's IPVS table "
            "(--max-table-entries 64): refused whole",
        }
    ]


def test_plan_refuses_what_the_daemon_would():
    objs = [tenant(i, at(10 - i)) for i in range(4)]
    services, slices = split(objs)
    chosen, problems = plan_objects(
        {ObjectKind.SERVICE: services, ObjectKind.ENDPOINT_SLICE: slices}, node(2 * PER_SERVICE)
    )
    assert {d.ref.name for d, _ in chosen} == {"svc003", "svc002"}  # the two oldest
    refused = [p for p in problems if "--max-table-entries" in p.reason]
    assert sorted(p.name for p in refused) == ["tenant/svc000", "tenant/svc001"]
    assert all(p.fatal for p in refused)


def test_the_refusal_is_one_warning_line_per_service(caplog):
    caplog.set_level(logging.WARNING)
    h = Harness(node=node(PER_SERVICE))
    h.start(*split([tenant(i, at(i)) for i in range(3)]))
    lines = [r for r in caplog.records if r.getMessage() == "virtual servers refused"]
    assert sorted(r.fields["service"] for r in lines) == ["tenant/svc001", "tenant/svc002"]


def test_status_text_names_the_refused_services_and_the_full_table():
    from ipvsctl.cli.status import join_status, render_status
    from ipvsctl.daemon.status_json import engine_status

    h = Harness(node=node(2 * PER_SERVICE))
    h.start(*split([tenant(i, at(i)) for i in range(3)]))
    text = render_status(join_status(None, "n/a", engine_status(h.view), None, "test"))
    assert "table: 64 of 64 entries (--max-table-entries)" in text
    assert "refused services: 1\n  tenant/svc002: does not fit in what older Services" in text
    roomy = Harness(node=node(100 * PER_SERVICE))
    roomy.start(*split([tenant(i, at(i)) for i in range(3)]))
    text = render_status(join_status(None, "n/a", engine_status(roomy.view), None, "test"))
    assert "table:" not in text and "refused" not in text

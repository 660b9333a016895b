"""Cost grows with the change, not the cluster: counted on the in-memory kernel."""

from __future__ import annotations

import random

from devkit.builders import endpoint, endpoint_slice, service
from devkit.harness import Harness
from ipvsctl.kernel.fake import FakeKernel, FaultyKernel
from ipvsctl.model import ServiceRef

N_SERVICES = 10_000


def cluster_ip(i: int) -> str:
    return f"10.96.{i // 250}.{i % 250 + 1}"


def pod_ip(i: int, j: int) -> str:
    return f"10.{100 + i // 2500}.{(i // 10) % 250}.{(i % 10) * 20 + j + 1}"


def test_one_endpoint_change_among_10000_services_touches_only_its_service():
    services = [service(f"s{i}", cluster_ip=cluster_ip(i)) for i in range(N_SERVICES)]
    slices = [
        endpoint_slice(f"s{i}", [endpoint(pod_ip(i, j)) for j in range(10)])
        for i in range(N_SERVICES)
    ]
    h = Harness()
    h.start(services, slices)
    assert len(h.fake.services) == N_SERVICES
    assert h.metrics.value("ipvsctl_real_servers", {"state": "active"}) == 10 * N_SERVICES
    h.ops()

    h.fake.dumps = h.fake.table_reads = 0
    i = 4321
    eps = [endpoint(pod_ip(i, j)) for j in range(1, 10)] + [endpoint("10.200.0.1")]
    h.upsert(endpoint_slice(f"s{i}", eps), sync=False)
    assert h.engine.dirty == {ServiceRef("default", f"s{i}")}  # the one to build again
    result = h.engine.sync()
    assert (result.services, result.pending) == (1, set())  # built, diffed, applied: it alone

    assert h.ops() == [
        f"add-rs {cluster_ip(i)}:80/TCP -> 10.200.0.1:8080 weight 1",
        f"set-rs {cluster_ip(i)}:80/TCP -> {pod_ip(i, 0)}:8080 weight 0",
    ]
    assert h.fake.dumps == 0
    h.check(1)  # the drain check: one dump, of the one virtual server with an entry
    assert (h.fake.dumps, h.fake.table_reads) == (1, 0)


def test_random_changes_with_kernel_failures_converge_to_the_same_table():
    """FaultyKernel fails 20% of mutations; retried syncs must end where a clean run does."""
    rng = random.Random(7)
    n = 40
    services = [service(f"s{i}", cluster_ip=cluster_ip(i)) for i in range(n)]
    clean, faulty = Harness(), Harness(kernel=FaultyKernel(FakeKernel(), 0.2, seed=3))
    for h in (clean, faulty):
        h.start(services, [])
    for _ in range(300):
        i = rng.randrange(n)
        if rng.random() < 0.1:
            obj = service(
                f"s{i}",
                cluster_ip=cluster_ip(i),
                ports=[{"name": "http", "port": rng.choice([80, 81])}],
            )
        else:
            eps = [endpoint(pod_ip(i, j)) for j in rng.sample(range(10), rng.randrange(4))]
            obj = endpoint_slice(f"s{i}", eps)
        for h in (clean, faulty):
            h.upsert(obj)
            h.check(0)  # nothing has connections: drained ones go at once
    for _ in range(50):  # the loop would retry with backoff; here, until done
        if not faulty.engine.dirty and not len(faulty.engine.drains.queue):
            break
        faulty.engine.sync()
        faulty.check(0)
    assert faulty.kernel.failures > 0
    assert faulty.fake.dump() == clean.fake.dump()
    assert (
        faulty.metrics.value("ipvsctl_netlink_errors_total", {"operation": "add_real_server"}) > 0
    )

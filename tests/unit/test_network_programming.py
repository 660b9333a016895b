"""ipvsctl_network_programming_duration_seconds: kube-proxy's SLI, from the EndpointSlice's
`endpoints.kubernetes.io/last-change-trigger-time` to the kernel change. Hostile times
(malformed, in the future) are counted and never observed."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from devkit.builders import endpoint, endpoint_slice, service
from devkit.harness import Harness, rs, vs
from ipvsctl.kube.trim import trim_endpoint_slice
from ipvsctl.model import RealServerKey, ServiceKey
from ipvsctl.source.convert import TRIGGER_TIME_ANNOTATION, parse_endpoint_slice

A, B = "10.244.1.5", "10.244.1.6"
NAME = "ipvsctl_network_programming_duration_seconds"


def rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def sl(*addresses: str, trigger: object = None) -> dict:
    obj = endpoint_slice("web", [endpoint(a) for a in addresses])
    if trigger is not None:
        obj["metadata"]["annotations"] = {TRIGGER_TIME_ANNOTATION: trigger}
    return obj


def started() -> Harness:
    h = Harness()
    h.start([service("web")], [sl(A, trigger=rfc3339(h.clock.wall() - 600))])
    h.ops()
    return h


def count(h: Harness) -> float:
    return h.metrics.value(f"{NAME}_count")


def skipped(h: Harness, reason: str) -> float:
    return h.metrics.value("ipvsctl_network_programming_skipped_total", {"reason": reason})


def test_a_change_is_observed_from_its_trigger_time_to_the_kernel():
    h = started()
    assert count(h) == 0  # the first list: changes made before the daemon ran
    h.clock.advance(10)
    h.upsert(sl(A, B, trigger=rfc3339(h.clock.wall() - 3)))
    assert count(h) == 1
    assert h.metrics.value(f"{NAME}_sum") == pytest.approx(3.0)
    assert h.metrics.value(f"{NAME}_bucket", {"le": "2.0"}) == 0
    assert h.metrics.value(f"{NAME}_bucket", {"le": "3.0"}) == 1


def test_an_unchanged_slice_with_a_new_trigger_time_observes_nothing():
    h = started()
    h.clock.advance(10)
    h.upsert(sl(A, trigger=rfc3339(h.clock.wall() - 1)))
    assert count(h) == 0 and h.ops() == []


@pytest.mark.parametrize(
    "bad",
    ["yesterday", "2026-13-45T99:00:00Z", 12345, {"a": 1}, "9" * 5000, ""],
)
def test_a_malformed_time_is_counted_and_ignored(bad: object):
    h = started()
    h.clock.advance(10)
    h.upsert(sl(A, B, trigger=bad))
    assert count(h) == 0 and skipped(h, "malformed") == 1
    assert h.fake.weight(*_key(B)) == 1  # the slice itself is used


def test_a_future_time_is_counted_never_a_negative_observation():
    h = started()
    h.clock.advance(10)
    h.upsert(sl(A, B, trigger=rfc3339(h.clock.wall() + 3600)))
    assert count(h) == 0 and skipped(h, "future") == 1
    assert h.metrics.value(f"{NAME}_sum") == 0


def test_trim_keeps_only_the_trigger_annotation():
    obj = sl(A, trigger="2026-01-01T00:00:00Z")
    obj["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"] = "{}"
    trimmed = trim_endpoint_slice(obj)
    assert trimmed["metadata"]["annotations"] == {TRIGGER_TIME_ANNOTATION: "2026-01-01T00:00:00Z"}
    info = parse_endpoint_slice(trimmed).value
    assert info.trigger_time == datetime(2026, 1, 1, tzinfo=UTC).timestamp()
    assert info == parse_endpoint_slice(sl(A)).value  # not part of equality


def _key(address: str) -> tuple[ServiceKey, RealServerKey]:
    return vs(), rs(address)

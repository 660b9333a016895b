"""parse_endpoint_slice's per-endpoint cost (bench hot spot 4: ~40% of one change's
CPU): the common shapes take the fast path, no error text is built unless there is
an error, and every error still names its place as before. Counted in calls, not timed."""

from __future__ import annotations

import pytest

from ipvsctl.source import convert
from ipvsctl.source.validate import GENERAL_CHECKS, InvalidObject


def _slice(endpoints: list) -> dict:
    return {
        "metadata": {
            "name": "web-a",
            "namespace": "ns",
            "labels": {"kubernetes.io/service-name": "web"},
        },
        "addressType": "IPv4",
        "ports": [{"name": "http", "protocol": "TCP", "port": 80}],
        "endpoints": endpoints,
    }


def _ep(i: int, **extra) -> dict:
    return {
        "addresses": [f"10.244.0.{i}"],
        "nodeName": "n1",
        "conditions": {"ready": True, "serving": True, "terminating": False},
        "targetRef": {"kind": "Pod", "name": f"web-{i}"},
        **extra,
    }


def _general_checks(obj: dict) -> tuple[int, convert.Parsed[convert.SliceInfo]]:
    before = GENERAL_CHECKS.calls
    parsed = convert.parse_endpoint_slice(obj)
    return GENERAL_CHECKS.calls - before, parsed


def test_common_endpoints_call_no_general_check():
    base, few = _general_checks(_slice([_ep(i) for i in range(1, 3)]))
    n, many = _general_checks(_slice([_ep(i) for i in range(1, 201)]))
    assert n == base > 0  # the per-slice checks only: none per endpoint
    assert len(many.value.endpoints) == 200 and len(few.value.endpoints) == 2
    e = many.value.endpoints[6]
    assert (e.address, e.ready, e.serving, e.terminating, e.node_name, str(e.pod)) == (
        "10.244.0.7",
        True,
        True,
        False,
        "n1",
        "ns/web-7",
    )
    # an uncommon shape (no conditions, no targetRef) takes them, endpoint by endpoint
    n, _ = _general_checks(_slice([{"addresses": [f"10.244.0.{i}"]} for i in range(1, 201)]))
    assert n >= base + 200


@pytest.mark.parametrize(
    ("endpoint", "message"),
    [
        ("x", "endpoints[1] is not an object"),
        ({"addresses": "10.0.0.1"}, "endpoints[1].addresses is not a list"),
        ({"addresses": []}, "endpoints[1].addresses is empty"),
        ({"addresses": [7]}, "endpoints[1].addresses[0]: 7 is not an IP address"),
        ({"addresses": ["nope"]}, "endpoints[1].addresses[0]: 'nope' is not an IP address"),
        ({"addresses": ["fd00::1"]}, "endpoints[1].addresses[0]: fd00::1 is not an IPv4 address"),
        ({"addresses": ["10.0.0.1"], "conditions": []}, "endpoints[1].conditions is not an object"),
        (
            {"addresses": ["10.0.0.1"], "conditions": {"ready": "yes"}, "targetRef": 1},
            "endpoints[].conditions.ready: 'yes' is not a boolean",
        ),  # ready is checked first
        ({"addresses": ["10.0.0.1"], "targetRef": []}, "endpoints[1].targetRef is not an object"),
        (
            {"addresses": ["10.0.0.1"], "targetRef": {"kind": "Pod", "name": 5}},
            "endpoints[1].targetRef.name",
        ),
        (
            {"addresses": ["10.0.0.1"], "targetRef": {"kind": "Pod", "name": "p", "namespace": 5}},
            "endpoints[1].targetRef.namespace",
        ),
    ],
)
def test_a_bad_endpoint_is_refused_with_its_place(endpoint, message):
    with pytest.raises(InvalidObject) as err:
        convert.parse_endpoint_slice(_slice([_ep(1), endpoint]))
    assert message in str(err.value)


def test_missing_parts_default():
    e = convert.parse_endpoint_slice(_slice([{"addresses": ["10.1.2.3"]}])).value.endpoints[0]
    assert (e.ready, e.serving, e.terminating, e.node_name, e.pod, e.hints) == (
        True,
        True,
        False,
        None,
        None,
        None,
    )

"""Hostile manifests: every shape is one clear line, never a traceback,
and the other objects are planned as before."""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devkit.builders import endpoint, endpoint_slice, service
from ipvsctl.manifests import ManifestError, load_file, load_paths
from ipvsctl.model import NodeContext
from ipvsctl.reconcile.cluster import plan_objects
from ipvsctl.source.convert import parse_endpoint_slice, parse_service
from ipvsctl.source.events import ObjectKind, Replace
from ipvsctl.source.node import parse_node
from ipvsctl.source.store import ObjectStore
from ipvsctl.source.validate import InvalidObject

NODE = NodeContext("node-a", ("192.0.2.10",))
GOOD_SVC = service("good", cluster_ip="10.96.0.10")
GOOD_SLICE = endpoint_slice("good", [endpoint("10.244.1.5")])


def _svc(**over: Any) -> dict[str, Any]:
    s = service("bad", cluster_ip="10.96.0.20")
    for path, value in over.items():
        *parents, leaf = path.split("__")
        d = s
        for p in parents:
            d = d.setdefault(p, {})
        d[leaf] = value
    return s


def _slice(**over: Any) -> dict[str, Any]:
    s = endpoint_slice("bad", [endpoint("10.244.1.6")])
    s["metadata"]["name"] = "bad-1"
    for key, value in over.items():
        if key == "labels":
            s["metadata"]["labels"] = value
        elif key == "target":
            s["endpoints"][0]["targetRef"] = value
        else:
            s[key] = value
    return s


HOSTILE = {
    "kind-list": {"kind": ["Service"], "metadata": {"name": "x"}},
    "kind-map": {"kind": {"Service": 1}, "metadata": {"name": "x"}},
    "name-list": _svc(metadata__name=["bad"]),
    "name-map": _svc(metadata__name={"a": 1}),
    "namespace-list": _svc(metadata__namespace=["x"]),
    "namespace-map": _svc(metadata__namespace={"x": 1}),
    "type-list": _svc(spec__type=["NodePort"]),
    "type-map": _svc(spec__type={"a": 1}),
    "scheduler-list": _svc(metadata__annotations={"ipvsctl.io/scheduler": ["rr"]}),
    "scheduler-map": _svc(metadata__annotations={"ipvsctl.io/scheduler": {"rr": 1}}),
    "addresstype-list": _slice(addressType=["IPv4"]),
    "addresstype-map": _slice(addressType={"IPv4": 1}),
    "label-list": _slice(labels={"kubernetes.io/service-name": ["good"]}),
    "label-map": _slice(labels={"kubernetes.io/service-name": {"good": 1}}),
    "labels-list": _slice(labels=["good"]),
    "targetref-name-list": _slice(target={"kind": "Pod", "name": ["p"]}),
    "targetref-namespace-map": _slice(target={"kind": "Pod", "name": "p", "namespace": {}}),
    "affinity-above-u32": _svc(
        spec__sessionAffinity="ClientIP",
        spec__sessionAffinityConfig={"clientIP": {"timeoutSeconds": 2**32}},
    ),
    "affinity-above-kube-max": _svc(
        spec__sessionAffinity="ClientIP",
        spec__sessionAffinityConfig={"clientIP": {"timeoutSeconds": 86401}},
    ),
    "zone-id-cluster-ip": _svc(spec__clusterIP="fe80::1%eth0", spec__clusterIPs=["fe80::1%eth0"]),
    "zone-id-external-ip": _svc(spec__externalIPs=["fe80::1%eth0"]),
    "zone-id-endpoint": _slice(endpoints=[{"addresses": ["fe80::1%eth0"]}]),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_object_is_one_line_and_the_others_still_plan(tmp_path: Path, name: str) -> None:
    f = tmp_path / "m.json"
    f.write_text(json.dumps({"kind": "List", "items": [HOSTILE[name], GOOD_SVC, GOOD_SLICE]}))
    result, problems = plan_objects(load_paths([f]), NODE)
    planned = {(str(d.ref), tuple(r.address for r in v.real_servers)) for d, v in result}
    assert ("default/good", ("10.244.1.5",)) in planned
    # a document of no known kind is ignored; any other hostile object is reported
    assert problems or name.startswith("kind-")
    # each problem is one line naming its object
    assert all("\n" not in p.reason and p.name for p in problems)


@pytest.mark.parametrize(
    "text, why",
    [
        ("[" * 100_000 + "]" * 100_000, "nested deeper"),
        ("a: " + "[" * 100_000 + "]" * 100_000, "nested deeper"),
        (
            "".join(
                f"l{i}: &l{i} [{','.join([f'*l{i - 1}' if i else 'x'] * 9)}]\n" for i in range(10)
            ),
            "aliases expand",
        ),
        ("kind: List\nitems: 5\n", "items is not a list"),
        ("kind: List\nitems: {a: 1}\n", "items is not a list"),
    ],
    ids=["deep-flow", "deep-in-map", "alias-bomb", "items-int", "items-map"],
)
def test_a_hostile_yaml_file_is_one_clear_error_in_bounded_time(
    tmp_path: Path, text: str, why: str
) -> None:
    f = tmp_path / "m.yaml"
    f.write_text(text)
    t0 = time.monotonic()
    with pytest.raises(ManifestError, match=why) as err:
        load_file(f)
    assert str(f) in str(err.value) and "\n" not in str(err.value)
    assert time.monotonic() - t0 < 5


def test_deep_json_is_one_clear_error(tmp_path: Path) -> None:
    f = tmp_path / "m.json"
    f.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ManifestError, match="nested deeper"):
        load_file(f)


def test_aliases_within_the_limit_still_load(tmp_path: Path) -> None:
    f = tmp_path / "m.yaml"
    f.write_text(
        "kind: Service\nmetadata: &m {name: a}\nspec: {clusterIP: 10.96.0.1, "
        "ports: [{port: 80}]}\nstatus: {x: *m}\n"
    )
    assert len(load_file(f).objects) == 1


def _aliased_bomb(string_chars: int, aliases: int, where: str) -> str:
    """A Service whose annotation `where` is a list of `aliases` aliases of one string."""
    return "\n".join(
        [
            "kind: Service",
            f"x: &s {'x' * string_chars}",
            "metadata:",
            "  name: bomb",
            "  annotations:",
            f"    {where}: [{', '.join(['*s'] * aliases)}]",
            "spec: {clusterIP: 10.96.0.9, ports: [{port: 80}]}",
        ]
    )


def test_aliases_of_a_long_string_are_one_clear_error_not_gigabytes(tmp_path: Path) -> None:
    # 1,300 aliases of a 1 MB string: 1,301 nodes (far under the node limit), shared in
    # memory, but 1.3 GB to anything that writes the value out (plan's warning did).
    f = tmp_path / "m.yaml"
    f.write_text(_aliased_bomb(1_000_000, 1_300, "ipvsctl.io/metrics"))
    t0 = time.monotonic()
    with pytest.raises(ManifestError, match="aliases expand to more than 16 MiB of text"):
        load_file(f)
    assert time.monotonic() - t0 < 5


@pytest.mark.parametrize(
    "value",
    [
        "yes" * 300_000,  # a plain long string: 900 KB
        ["x" * 100_000] * 150,  # an aliased list under the limits: 15 MB written out
        {"k" * 1000: "v" * 100_000},
    ],
    ids=["long-string", "aliased-list", "map"],
)
@pytest.mark.parametrize(
    "annotation",
    ["ipvsctl.io/metrics", "ipvsctl.io/scheduler", "kube-router.io/service.flags"],
)
def test_an_annotation_value_is_echoed_bounded(value: Any, annotation: str) -> None:
    svc = _svc(metadata__annotations={annotation: value})
    _, problems = plan_objects({ObjectKind.SERVICE: [svc, GOOD_SVC]}, NODE)
    (problem,) = problems
    assert annotation in problem.reason and len(problem.reason) < 300


def test_many_long_kube_router_annotation_keys_are_one_bounded_line() -> None:
    keys = {f"kube-router.io/service.{i:04d}{'x' * 10_000}": "1" for i in range(1_000)}
    _, problems = plan_objects({ObjectKind.SERVICE: [_svc(metadata__annotations=keys)]}, NODE)
    (problem,) = problems
    assert "kube-router annotations ignored" in problem.reason
    assert "and 992 more" in problem.reason and len(problem.reason) < 2_000


def test_plan_prints_a_bounded_line_for_a_long_annotation(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from ipvsctl.cli.app import app

    f = tmp_path / "m.yaml"
    f.write_text(_aliased_bomb(100_000, 150, "ipvsctl.io/metrics"))  # 15 MB: loads
    result = CliRunner().invoke(app, ["plan", "-f", str(f), "--node-ip", "192.0.2.10"])
    assert result.exit_code == 0, result.output
    (line,) = [ln for ln in result.output.splitlines() if "ipvsctl.io/metrics" in ln]
    assert len(line) < 300


# --- fuzz: any JSON shape through the converters and the store ----------------------
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.text(max_size=8),
    st.sampled_from(
        [
            "Service",
            "TCP",
            "UDP",
            "IPv4",
            "IPv6",
            "ClientIP",
            "Pod",
            "10.0.0.1",
            "fe80::1%eth0",
            "None",
            "LoadBalancer",
            "rr",
            "Local",
        ]
    ),
)
_json = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(
            st.sampled_from(
                [
                    "kind",
                    "metadata",
                    "name",
                    "namespace",
                    "spec",
                    "type",
                    "ports",
                    "port",
                    "protocol",
                    "clusterIP",
                    "clusterIPs",
                    "labels",
                    "annotations",
                    "addressType",
                    "endpoints",
                    "addresses",
                    "targetRef",
                    "conditions",
                    "sessionAffinity",
                    "sessionAffinityConfig",
                    "clientIP",
                    "timeoutSeconds",
                    "nodePort",
                    "externalIPs",
                    "status",
                    "loadBalancer",
                    "ingress",
                    "ip",
                    "items",
                    "kubernetes.io/service-name",
                    "ipvsctl.io/scheduler",
                    "deletionTimestamp",
                    "nodeName",
                    "uid",
                    "hints",
                    "forZones",
                    "forNodes",
                    "trafficDistribution",
                    "topology.kubernetes.io/zone",
                ]
            ),
            inner,
            max_size=6,
        ),
    ),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(list(ObjectKind)), _json)
def test_fuzz_any_shape_is_parsed_or_invalid_never_a_crash(kind: ObjectKind, obj: Any) -> None:
    parse = {
        ObjectKind.SERVICE: parse_service,
        ObjectKind.ENDPOINT_SLICE: parse_endpoint_slice,
        ObjectKind.NODE: parse_node,
    }.get(kind)
    if parse is not None:
        with contextlib.suppress(InvalidObject):
            parse(obj)
    store = ObjectStore()
    store.apply(Replace(kind, [obj, obj], 0.0))  # the store never raises
    hash(tuple(store.services.items()))  # whatever it kept is hashable and comparable


@settings(max_examples=100, deadline=None)
@given(st.lists(_json, max_size=3))
def test_fuzz_any_file_loads_or_is_one_manifest_error(docs: list[Any]) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "m.json"
        f.write_text(json.dumps({"kind": "List", "items": docs}))
        try:
            objects = load_paths([f])
        except ManifestError:
            return
        plan_objects(objects, NODE)


def test_a_zone_id_in_a_source_range_is_ignored_not_sent_to_nft() -> None:
    svc = _svc(
        spec__type="LoadBalancer", spec__loadBalancerSourceRanges=["fe80::%eth0/64", "10.0.0.0/8"]
    )
    parsed = parse_service(svc)
    assert parsed.value.source_ranges == ("10.0.0.0/8",)
    assert any("fe80::%eth0/64" in w for w in parsed.warnings)


def test_a_zone_id_in_cluster_cidr_is_a_flag_error() -> None:
    from ipvsctl.netfilter.ruleset import parse_cidrs

    with pytest.raises(ValueError, match="not a CIDR"):
        parse_cidrs(["fd00::%eth0/64"])


def test_a_value_that_does_not_fit_netlink_is_a_kernel_error_not_a_crash() -> None:
    # Regression: struct.error escaped the adapter's error translation and killed the loop.
    import struct

    from ipvsctl.kernel.netlink.errors import errors
    from ipvsctl.kernel.port import KernelError

    with pytest.raises(KernelError), errors("add_virtual_server", "10.96.0.1:80/TCP"):
        struct.pack("=I", 2**33)

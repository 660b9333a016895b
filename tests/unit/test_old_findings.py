"""Old findings: the YAML alias repr bomb, text-format log forging."""

from __future__ import annotations

import logging
import resource
import subprocess
import sys

import pytest

from ipvsctl.obs.logging import TextFormatter, fields
from ipvsctl.source.validate import short

MEMORY_LIMIT = 1 << 30  # address space of the `ipvsctl plan` below; the bomb is ~7 GB


def _bomb(field: str) -> str:
    """A 250 KB Service whose `field` is a list aliased 27,000 times over one 250 KB string
    (within safeyaml's alias limit): its repr() or str() is 6.7 GB."""
    anchors = [
        "anchors:",  # a field ipvsctl ignores, first: aliases follow their anchor
        f"  s: &s {'A' * 250_000}",
        "  l1: &l1 [" + ", ".join(["*s"] * 30) + "]",
        "  l2: &l2 [" + ", ".join(["*l1"] * 30) + "]",
        "  l3: &l3 [" + ", ".join(["*l2"] * 30) + "]",
    ]
    meta = ["metadata:", f"  name: bomb-{field.replace('.', '-').replace('/', '-').lower()}"]
    spec = ["spec:", "  clusterIP: 10.96.0.77", "  ports: [{port: 80}]"]
    if field.startswith("metadata."):
        meta.append(f"  {field.split('.', 1)[1]}: *l3")
    elif field.startswith("annotation:"):
        meta += ["  annotations:", f"    {field.split(':', 1)[1]}: *l3"]
    elif field == "externalIPs":
        spec.append("  externalIPs: [*l3]")
    else:
        spec.append(f"  {field}: *l3")
    return "\n".join(["apiVersion: v1", "kind: Service", *anchors, *meta, *spec]) + "\n"


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


FIELDS = [
    "type",
    "externalIPs",
    "loadBalancerSourceRanges",
    "trafficDistribution",
    "metadata.creationTimestamp",
    "metadata.namespace",
    "annotation:ipvsctl.io/scheduler",
    "annotation:ipvsctl.io/scheduler-flags",
    "annotation:ipvsctl.io/drain-timeout",
    "annotation:ipvsctl.io/metrics",
]

# The same value built in Python, where no YAML limit applies (a source that hands the
# parser shared objects): each field's error text must still be short, in bounded memory.
_IN_PROCESS = """
import sys
from ipvsctl.model import NodeContext
from ipvsctl.reconcile.cluster import plan_objects
from ipvsctl.source.events import ObjectKind

field = sys.argv[1]
l3 = [[["A" * 250_000] * 30] * 30] * 30
meta = {"name": "bomb"}
spec = {"clusterIP": "10.96.0.77", "ports": [{"port": 80}]}
if field != "type":
    spec["type"] = "LoadBalancer"
if field.startswith("metadata."):
    meta[field.split(".", 1)[1]] = l3
elif field.startswith("annotation:"):
    meta["annotations"] = {field.split(":", 1)[1]: l3}
elif field == "externalIPs":
    spec["externalIPs"] = [l3]
else:
    spec[field] = l3
svc = {"apiVersion": "v1", "kind": "Service", "metadata": meta, "spec": spec}
_, problems = plan_objects({ObjectKind.SERVICE: [svc]}, NodeContext("node-a"))
for p in problems:
    print(p.name, p.reason, file=sys.stderr)
"""


@pytest.mark.parametrize("field", FIELDS)
def test_an_aliased_value_is_shown_short_within_the_memory_limit(field):
    """repr() before truncation (validate._short) and an untruncated `{value!r}` in convert
    took a 296 KB file to 1.6 GB; each field here is one such place."""
    r = subprocess.run(
        [sys.executable, "-c", _IN_PROCESS, field],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=_limit_memory,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Traceback" not in r.stderr and "MemoryError" not in r.stderr
    assert r.stderr.strip(), "the value was reported"
    assert all(len(line) < 400 for line in r.stderr.splitlines()), r.stderr[:2000]


@pytest.mark.parametrize("field", FIELDS)
def test_an_aliased_yaml_bomb_is_one_clear_error_within_the_memory_limit(field, tmp_path):
    """The same value from YAML (a 296 KB file): its aliases bring 6.7 GB of text, refused
    at load as one line (safeyaml's MAX_ALIAS_CHARS), before anything walks it."""
    path = tmp_path / "bomb.yaml"
    path.write_text(_bomb(field))
    if field != "type":
        path.write_text(path.read_text().replace("spec:\n", "spec:\n  type: LoadBalancer\n", 1))
    r = subprocess.run(
        [sys.executable, "-m", "ipvsctl", "plan", "-f", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=_limit_memory,
    )
    assert r.returncode == 2, r.stderr[-2000:]
    assert "Traceback" not in r.stderr and "MemoryError" not in r.stderr
    (line,) = r.stderr.splitlines()
    assert "aliases expand to more than 16 MiB of text" in line and len(line) < 400


def test_short_is_bounded_for_every_shape():
    shared = ["x" * 10_000] * 1000
    deep = [[[shared] * 1000] * 1000] * 1000
    for value in (deep, {"k" * 500: deep}, 10**5000, "y" * 10**6, b"z" * 10**6, {1, 2, 3}):
        assert len(short(value)) <= 80


def _line(**kw: object) -> str:
    record = logging.LogRecord("ipvsctl.test", logging.INFO, __file__, 1, "drain started", (), None)
    record.__dict__.update(fields(**kw))
    return TextFormatter().format(record)


@pytest.mark.parametrize(
    "value",
    [
        "web\n2026-01-01T00:00:00.000Z ERROR ipvsctl.daemon: stopped",
        "a=b",
        "x level=ERROR",
        'quote"d',
        "back\\slash",
        "tab\there",
        "line\rreturn",
        "nel\x85sep\u2028",
        "",
    ],
)
def test_a_value_never_forges_a_field_or_a_line(value):
    """Text lines are `msg key=value ...`: a value with a newline or `=` (an object's name, a
    peer's error text) must come out quoted and escaped, one line, its own field only."""
    line = _line(service=value, rs="10.0.0.1:80")
    assert "\n" not in line and "\r" not in line and "\x85" not in line and "\u2028" not in line
    rest = line.split("drain started ", 1)[1]
    assert rest.endswith(" rs=10.0.0.1:80")
    assert rest.count("=") - value.count("=") == 2  # service= and rs=, nothing forged


def test_plain_values_stay_bare():
    assert _line(vs="TCP/10.96.0.10:80", ref="default/web", n=3).endswith(
        "drain started vs=TCP/10.96.0.10:80 ref=default/web n=3"
    )

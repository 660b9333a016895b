"""A `kind: List` read an item at a time (plan on a live cluster's dump): the same objects
as the whole document parsed, the same bounds, errors said where they are."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.plan_input import items
from ipvsctl.kube.trim import trim_for_plan
from ipvsctl.manifests import ManifestError, load_file, load_paths, safejson
from ipvsctl.manifests.safejson import load_json_stream
from ipvsctl.manifests.safeyaml import load_all_yaml


def _same(x: Any) -> Any:
    return x


_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False),
    st.text(max_size=12),
    st.sampled_from(["<<", "=", "~", "null", "yes", "0x1f", "2026-01-01", "1e3", ".inf", ""]),
)
_json = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=20,
)


def _yaml_load(text: str, keep: Any) -> Any:
    try:
        return list(load_all_yaml(text, keep))
    except yaml.YAMLError as exc:
        return ("error", type(exc).__name__)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_json, max_size=5), st.booleans(), st.booleans())
def test_a_streamed_yaml_list_is_what_the_whole_document_is(
    docs: list[Any], shared: bool, flow: bool
) -> None:
    if shared and docs:
        docs = [*docs, docs[0], docs[-1]]  # the same objects again: anchors and aliases
    text = yaml.safe_dump(
        {"apiVersion": "v1", "items": docs, "kind": "List"}, default_flow_style=flow
    )
    assert _yaml_load(text, _same) == _yaml_load(text, None)


@pytest.mark.parametrize(
    "text",
    [
        "kind: List\nitems:\n- &a {kind: Service, x: 1}\n- *a\n- <<: *a\n  y: 2\n",
        "base: &b {p: 1, q: 2}\nitems:\n- <<: [*b, {p: 3}]\n  q: 9\n- {=: 5, a: =}\n",
        "items:\n- !!str 5\n- !!binary aGVsbG8=\n- 2026-01-01T00:00:00Z\n- [1, .inf, 0x1f, ~]\n",
        "items: [1]\nitems: 5\n",
        "items: 5\nitems: [1, 2]\n",
        "items: &s [1]\nother: *s\n",
        "items:\n- a: <<\n",
        "items:\n- {[1]: 2}\n",
        "items:\n- <<: 5\n",
        "---\nitems: [a]\n---\n- x\n---\nplain\n",
        "items:\n- ? a\n  : b\n- {? c}\n",
        "items:\n- &x a\n- {k: *x}\n",
        "!tagged {items: [1]}\n",
        "&top {items: [1]}\n",
    ],
)
def test_yaml_beyond_plain_items_is_read_as_the_whole_document(text: str) -> None:
    # merges, tags, anchors, aliases, duplicate keys, complex keys: the same value (or the
    # same kind of error) streamed as whole
    assert _yaml_load(text, _same) == _yaml_load(text, None)


@settings(max_examples=200, deadline=None)
@given(_json.filter(lambda d: not isinstance(d, float)), st.integers(1, 64))
def test_json_read_in_chunks_is_json_loads(doc: Any, chunk: int) -> None:
    text = json.dumps({"a": doc, "items": [doc, {"k": doc}], "z": [doc]}, indent=1)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(safejson, "CHUNK", chunk)
        assert load_json_stream(io.StringIO(text).read, _same) == json.loads(text)
        other = json.dumps(doc)  # any document, List or not
        assert load_json_stream(io.StringIO(other).read, _same) == json.loads(other)


@pytest.mark.parametrize(
    "text",
    [
        '{"items": [1, 2,, 3]}',
        '{"items": [1, 2]\n\n  "x": 1}',
        '{"a": 1} {"b": 2}',
        '{"a" 1}',
        '{\n  "items": [\n    {"a": tru}\n  ]\n}',
        '{"items": [1, 2',
        "{'a': 1}",
    ],
)
def test_a_json_error_says_where_as_json_does(text: str) -> None:
    with pytest.raises(json.JSONDecodeError) as whole:
        json.loads(text)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(safejson, "CHUNK", 3)
        with pytest.raises(ValueError) as streamed:
            load_json_stream(io.StringIO(text).read, _same)
    # the same place: line, column and character
    assert str(streamed.value).split(": line ")[1] == str(whole.value).split(": line ")[1]
    assert isinstance(streamed.value, json.JSONDecodeError)
    assert (streamed.value.lineno, streamed.value.colno) == (whole.value.lineno, whole.value.colno)


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_deep_nesting_inside_an_item_is_one_clear_error(tmp_path: Path, suffix: str) -> None:
    f = tmp_path / f"m{suffix}"
    deep = "[" * 100 + "]" * 100
    f.write_text('{"kind": "List", "items": [{"kind": "Service"}, ' + deep + "]}")
    with pytest.raises(ManifestError, match="nested deeper than 64 levels"):
        load_file(f, trim_for_plan)
    # 64 levels in all still load: the List 1, items 2, the item 3
    ok = "[" * 61 + "]" * 61
    f.write_text('{"kind": "List", "items": [' + ok + "]}")
    assert load_file(f, trim_for_plan).ignored == 1


def test_an_alias_bomb_among_streamed_items_is_one_clear_error(tmp_path: Path) -> None:
    f = tmp_path / "m.yaml"
    levels = "".join(
        f"l{i}: &l{i} [{','.join([f'*l{i - 1}' if i else 'x'] * 9)}]\n" for i in range(6)
    )
    f.write_text(levels + "kind: List\nitems:\n" + "- *l5\n" * 10)
    with pytest.raises(ManifestError, match="aliases expand to more than"):
        load_file(f, trim_for_plan)


def test_standard_input_beyond_the_bound_is_one_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import ipvsctl.manifests.files as files

    monkeypatch.setattr(files, "MAX_BYTES", 1000)
    monkeypatch.setattr("sys.stdin", io.StringIO('{"items": [' + "1, " * 1000 + "1]}"))
    with pytest.raises(ManifestError, match="standard input: larger than 1000 bytes"):
        load_paths(["-"], keep=trim_for_plan)


def test_json_on_standard_input_that_is_yaml_is_read_as_yaml(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    text = (
        "{kind: List, items: [{kind: Service, metadata: {name: a}, spec: {clusterIP: 10.96.0.1}}]}"
    )
    monkeypatch.setattr("sys.stdin", io.StringIO(text))
    objects = load_paths(["-"], keep=trim_for_plan)
    assert [o["metadata"]["name"] for kind in objects for o in objects[kind]] == ["a"]


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_a_dump_keeps_what_plan_reads_and_drops_managed_fields(tmp_path: Path, suffix: str) -> None:
    others = [{"kind": "ConfigMap", "metadata": {"name": "c", "namespace": "n", "x": [1]}}, 5]
    dump = {"apiVersion": "v1", "items": [*items(3, 2), *others], "kind": "List"}
    f = tmp_path / f"m{suffix}"
    f.write_text(json.dumps(dump) if suffix == ".json" else yaml.safe_dump(dump))
    kept = load_file(f, trim_for_plan).objects
    whole = load_file(f).objects
    assert kept.keys() == whole.keys()
    # what plan skips is named as when read whole
    assert load_file(f, trim_for_plan).others == load_file(f).others
    assert len(load_file(f).others) == 2
    assert all("managedFields" not in o["metadata"] for o in kept.values())
    assert all(trim_for_plan(whole[k]) == kept[k] for k in kept)
    node = next(o for (kind, _, _), o in kept.items() if kind.value == "Node")
    assert node["status"]["addresses"][0] == {"address": "192.0.2.0", "type": "InternalIP"}

"""Manifest files: formats, errors, and following a folder per changed file."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from devkit.builders import endpoint, endpoint_slice, pod, service
from ipvsctl.manifests import ManifestError, ManifestSource, load_paths
from ipvsctl.source.events import Delete, ObjectKind, Upsert


def test_multi_document_yaml_lists_and_json(tmp_path):
    (tmp_path / "a.yaml").write_text(
        yaml.safe_dump_all(
            [
                service("a"),
                {"kind": "ConfigMap", "metadata": {"name": "x"}},
                {"kind": "List", "items": [service("b", cluster_ip="10.96.0.11"), pod("p")]},
            ]
        )
    )
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.json").write_text(
        json.dumps(
            {"kind": "EndpointSliceList", "items": [endpoint_slice("a", [endpoint("10.0.0.1")])]}
        )
    )
    (tmp_path / "ignored.txt").write_text("not a manifest")
    objs = load_paths([tmp_path])
    assert sorted(o["metadata"]["name"] for o in objs[ObjectKind.SERVICE]) == ["a", "b"]
    assert len(objs[ObjectKind.ENDPOINT_SLICE]) == 1  # a Pod is ignored like the ConfigMap


def test_unparseable_file_names_the_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(ManifestError, match=r"bad\.json:\d+:\d+: not valid JSON"):
        load_paths([bad])


def test_following_a_folder_emits_only_the_changed_files_objects(tmp_path):
    (tmp_path / "a.yaml").write_text(yaml.safe_dump_all([service("a", cluster_ip="10.96.0.1")]))
    (tmp_path / "b.yaml").write_text(
        yaml.safe_dump_all(
            [service("b", cluster_ip="10.96.0.2"), service("c", cluster_ip="10.96.0.3")]
        )
    )
    src = ManifestSource(tmp_path, interval=0)
    replaces = {r.kind: r for r in src.initial()}
    assert len(replaces[ObjectKind.SERVICE].objects) == 3
    assert src.poll() == []

    (tmp_path / "b.yaml").write_text(yaml.safe_dump_all([service("b", cluster_ip="10.96.0.9")]))
    os.utime(tmp_path / "b.yaml", (1, 1))
    events = src.poll()
    assert [
        (type(e), e.name if isinstance(e, Delete) else e.obj["metadata"]["name"]) for e in events
    ] == [(Delete, "c"), (Upsert, "b")]

    (tmp_path / "a.yaml").write_text("{{{")  # broken: its objects stay
    os.utime(tmp_path / "a.yaml", (2, 2))
    assert src.poll() == []
    (tmp_path / "a.yaml").unlink()
    assert [type(e) for e in src.poll()] == [Delete]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ipvsctl", *args], capture_output=True, text=True, timeout=60
    )


def test_plan_cli_json_table_and_errors(tmp_path):
    (tmp_path / "web.yaml").write_text(
        yaml.safe_dump_all(
            [
                service(
                    "web", type="NodePort", ports=[{"name": "http", "port": 80, "nodePort": 30080}]
                ),
                endpoint_slice(
                    "web", [endpoint("10.244.1.5"), {"addresses": ["nope"]}], name="bad"
                ),
                endpoint_slice("web", [endpoint("10.244.1.6")], name="good"),
            ]
        )
    )
    r = _cli("plan", "-f", str(tmp_path), "--node-ip", "192.0.2.10", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [
        (v["address"], v["port"], [x["address"] for x in v["real_servers"]])
        for v in doc["virtual_servers"]
    ] == [("10.96.0.10", 80, ["10.244.1.6"]), ("192.0.2.10", 30080, ["10.244.1.6"])]
    assert "default/bad" in r.stderr and "not an IP address" in r.stderr

    r = _cli("plan", "-f", str(tmp_path / "web.yaml"), "--node-ip", "192.0.2.10")
    assert r.returncode == 0 and "default/web:http (NodePort)" in r.stdout

    (tmp_path / "broken.yaml").write_text("a: [")
    r = _cli("plan", "-f", str(tmp_path / "broken.yaml"))
    assert r.returncode == 2 and "broken.yaml" in r.stderr

    r = _cli("plan", "-f", str(tmp_path), "--node-ip", "not-an-ip")
    assert r.returncode == 2 and "--node-ip" in r.stderr


def test_daemon_flag_errors_exit_2():
    assert _cli("run", "--log-format", "xml").returncode == 2
    assert _cli("run", "--no-such-flag").returncode == 2


def test_missing_manifests_folder_is_exit_2_with_one_line(tmp_path):
    """As `plan -f` with a missing path: a flag's value that cannot be used."""
    r = _cli(
        "run",
        "--manifests",
        str(tmp_path / "none"),
        "--state-dir",
        str(tmp_path / "s"),
        "--listen",
        "127.0.0.1:0",
    )
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and r.stderr.startswith("ipvsctl: ")

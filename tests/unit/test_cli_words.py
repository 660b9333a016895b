"""Errors in ipvsctl's words: a flag value typer checks (a choice, a number, a range) is
said in one line as ipvsctl's own checks say theirs, without the validator's "Value error,"
or "Input should be"; a file that does not parse is named with its line and column, never
PyYAML's `"<unicode string>"`."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from ipvsctl.cli.app import app
from ipvsctl.cli.errors import plain

EXAMPLES = str(Path(__file__).parents[2] / "examples")


def invoke(*args: str, stdin: str | None = None):
    return CliRunner().invoke(app, list(args), prog_name="ipvsctl", input=stdin)


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (("plan", "-f", EXAMPLES, "-o", "xml"), "ipvsctl: -o/--output: 'xml' is not one of "),
        (("version", "-o", "xml"), "ipvsctl: -o/--output: 'xml' is not one of 'text'"),
        (("completion", "tcsh"), "ipvsctl: SHELL: 'tcsh' is not one of 'bash', 'zsh', 'fish'"),
        (
            ("plan", "-f", EXAMPLES, "--max-table-entries", "many"),
            "ipvsctl: --max-table-entries: not a whole number",
        ),
        (("shutdown-manager", "--daemon-port", "99999"), "ipvsctl: --daemon-port: at most 65535"),
    ],
)
def test_a_bad_flag_value_is_one_line_in_ipvsctls_words(args, line):
    r = invoke(*args)
    assert r.exit_code == 2
    (said,) = r.stderr.splitlines()
    assert said.startswith(line), said
    assert "Value error" not in said and "Input should" not in said


def test_a_missing_flag_keeps_clicks_usage_and_words():
    r = invoke("plan")
    assert r.exit_code == 2 and "Missing option '-f' / '--filename'" in r.stderr


@pytest.mark.parametrize(
    ("validator", "ours"),
    [
        ("Value error, 'x' is not one of 'a', 'b'.", "'x' is not one of 'a', 'b'"),
        (
            "Input should be a valid integer, unable to parse string as an integer",
            "not a whole number",
        ),
        ("Input should be greater than or equal to 1", "at least 1"),
        ("Input should be a valid boolean", "must be a valid boolean"),
        ("already ours", "already ours"),
    ],
)
def test_validator_words_become_ours(validator, ours):
    assert plain(validator) == ours


def test_a_manifest_that_does_not_parse_is_named_with_its_line(tmp_path):
    f = tmp_path / "web.yaml"
    f.write_text("apiVersion: v1\nkind: Service\nmetadata:\n  name: [web\n")
    r = invoke("plan", "-f", str(f))
    assert r.exit_code == 2
    (said,) = r.stderr.splitlines()
    assert said.startswith(f"ipvsctl: {f}:5:1: not valid YAML: while parsing a flow sequence")
    assert "<unicode string>" not in said


def test_json_and_standard_input_are_named_with_their_line(tmp_path):
    f = tmp_path / "web.json"
    f.write_text('{"kind": "Service",\n "metadata": }')
    assert invoke("plan", "-f", str(f)).stderr == (
        f"ipvsctl: {f}:2:14: not valid JSON: Expecting value\n"
    )
    r = invoke("plan", "-f", "-", stdin="kind: Service\n bad: indent\n")
    assert r.stderr.startswith("ipvsctl: standard input:2:5: not valid YAML: ")


def test_a_config_file_that_does_not_parse_is_named_with_its_line(tmp_path):
    f = tmp_path / "config.conf"
    f.write_text(
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: [\n"
    )
    r = invoke("run", "--config", str(f))
    assert r.exit_code == 2
    assert f"ipvsctl: --config {f}:4:1: not valid YAML: " in r.stderr
    assert "<unicode string>" not in r.stderr


def test_version_is_a_command_beside_the_flag():
    assert invoke("version").stdout.splitlines()[0] == invoke("--version").stdout.strip()

"""Help and docs agree, for every command the CLI has (derived from it, so a command that
lands later is held the day it lands): README's Commands block shows it with flags it
really has, reference.md's contents link its section, and every duration flag says
DURATION in `--help` and in every flag table."""

from __future__ import annotations

import re

import pytest

from .helpers import REPO
from .test_deploy_reference import cli_commands

README = REPO / "README.md"
REFERENCE = REPO / "docs" / "reference.md"
FLAG_TABLES = [REFERENCE, REPO / "docs" / "shutdown-manager.md", REPO / "docs" / "node-drain.md"]
# What a duration flag is called: the same parser (source/duration.py) reads them all.
DURATION_NAME = re.compile(r"--[a-z-]*(timeout|interval|delay|grace)$")


def commands() -> dict[str, object]:
    return {name: cmd for name, cmd in cli_commands().items() if name}


def flags_of(cmd: object) -> set[str]:
    names = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)}  # type: ignore[attr-defined]
    return {n for n in names if n.startswith("-")} | {"-h", "--help"}


def readme_block() -> dict[str, str]:
    """README's Commands block: each command's usage, its continuation lines joined."""
    text = README.read_text()
    block = re.search(r"^## Commands\n\n```\n(.*?)```", text, re.S | re.M).group(1)  # type: ignore[union-attr]
    usage: dict[str, str] = {}
    current = None
    for line in block.splitlines():
        m = re.match(r"ipvsctl ([\w-]+)(.*)", line)
        if m:
            current = m.group(1)
            usage[current] = m.group(2)
        elif current is not None:
            usage[current] += " " + line.strip()
    return usage


@pytest.mark.parametrize("name", sorted(commands()))
def test_readme_commands_block_shows_every_command(name):
    assert name in readme_block(), f"README's Commands block lacks `ipvsctl {name}`"


@pytest.mark.parametrize("name", sorted(readme_block()))
def test_readme_commands_block_shows_only_real_commands_and_flags(name):
    cmds = commands()
    assert name in cmds, f"README shows `ipvsctl {name}`, which the CLI does not have"
    shown = set(re.findall(r"(?<![\w-])(--?[a-z][a-z0-9-]*)", readme_block()[name]))
    assert shown <= flags_of(cmds[name]), sorted(shown - flags_of(cmds[name]))


@pytest.mark.parametrize("name", sorted(commands()))
def test_reference_contents_link_every_command(name):
    contents = REFERENCE.read_text().split("\n## ", 1)[0]
    assert f"(#ipvsctl-{name})" in contents, f"reference.md's contents lack {name}"


def duration_flags() -> list[object]:
    return [
        pytest.param(name, opt, p, id=f"{name or 'ipvsctl'} {opt}")
        for name, cmd in cli_commands().items()
        for p in cmd.params  # type: ignore[attr-defined]
        for opt in p.opts
        if DURATION_NAME.match(opt)
    ]


def test_there_are_duration_flags():
    assert len(duration_flags()) >= 9


@pytest.mark.parametrize(("name", "opt", "param"), duration_flags())
def test_every_duration_flag_says_duration_in_help(name, opt, param):
    assert param.metavar == "DURATION", (name, opt, param.metavar)


@pytest.mark.parametrize("doc", FLAG_TABLES, ids=lambda p: p.name)
def test_every_duration_flag_says_duration_in_the_docs(doc):
    wrong = [
        (flag, metavar)
        for flag, metavar in re.findall(r"`(--[a-z-]+) ([A-Z][A-Z0-9_:-]*)`", doc.read_text())
        if DURATION_NAME.match(flag) and metavar != "DURATION"
    ]
    assert not wrong, wrong


def test_every_duration_flag_says_duration_in_the_readme():
    wrong = [
        (flag, metavar)
        for usage in readme_block().values()
        for flag, metavar in re.findall(r"\[(--[a-z-]+) ([^\]\s]+)\]", usage)
        if DURATION_NAME.match(flag) and metavar != "DURATION"
    ]
    assert not wrong, wrong

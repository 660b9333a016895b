"""docs/reference.md against the real program: every command's flags, env vars and defaults
(both ways), the metrics table against what the daemon exports (both ways), the JSON example
against `ipvsctl plan`; and every relative link in README.md and docs/ resolves."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import REPO

REFERENCE = REPO / "docs" / "reference.md"


def cli_root():
    import typer.main

    from ipvsctl.cli.app import app

    return typer.main.get_command(app)


def cli_commands() -> dict[str, object]:
    root = cli_root()
    return {"": root, **root.commands}  # type: ignore[attr-defined]


def sections() -> dict[str, str]:
    """`### \\`ipvsctl CMD\\`` section bodies by command ("" for `ipvsctl` itself)."""
    text = REFERENCE.read_text()
    out = {}
    for m in re.finditer(r"^### `ipvsctl( [\w-]+)?`\n(.*?)(?=^##)", text, re.S | re.M):
        out[(m.group(1) or "").strip()] = m.group(2)
    return out


def flag_rows(body: str) -> list[list[str]]:
    rows = []
    for line in body.splitlines():
        if line.startswith("| `-"):
            rows.append([c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))])
    return rows


def documented(body: str) -> tuple[set[str], set[str], dict[str, str]]:
    """(flags, env vars, default cell by flag) of one command's table."""
    flags: set[str] = set()
    envs: set[str] = set()
    defaults: dict[str, str] = {}
    for flag_cell, env_cell, default_cell, *_ in flag_rows(body):
        names = re.findall(r"(?<![\w-])(--?[a-z][a-z0-9-]*)", flag_cell.split("`")[1])
        flags.update(names)
        envs.update(re.findall(r"`([A-Z][A-Z0-9_]*)`", env_cell))
        for n in names:
            defaults[n] = default_cell
    return flags, envs, defaults


def real(command) -> tuple[set[str], set[str], dict[str, object]]:
    flags: set[str] = set()
    envs: set[str] = set()
    defaults: dict[str, object] = {}
    for p in command.params:
        names = [o for o in (*p.opts, *p.secondary_opts) if o.startswith("-")]
        flags.update(names)
        if p.envvar:
            envs.update([p.envvar] if isinstance(p.envvar, str) else p.envvar)
        for n in p.opts:
            defaults[n] = p.default
    flags.discard("--help")
    return flags, envs, defaults


def test_every_command_has_a_section():
    assert set(sections()) == set(cli_commands())


@pytest.mark.parametrize("name", sorted(cli_commands()), ids=lambda n: n or "ipvsctl")
def test_flags_and_env_vars_match_the_cli_both_ways(name):
    body = sections()[name]
    doc_flags, doc_envs, _ = documented(body)
    cli_flags, cli_envs, _ = real(cli_commands()[name])
    missing, invented = sorted(cli_flags - doc_flags), sorted(doc_flags - cli_flags)
    assert not missing, f"ipvsctl {name}: undocumented {missing}"
    assert not invented, f"ipvsctl {name}: no such flag {invented}"
    assert doc_envs == cli_envs


def _shown(value: object) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


@pytest.mark.parametrize("name", sorted(cli_commands()), ids=lambda n: n or "ipvsctl")
def test_defaults_match_the_cli(name):
    _, _, doc_defaults = documented(sections()[name])
    _, _, cli_defaults = real(cli_commands()[name])
    checked = 0
    for flag, default in cli_defaults.items():
        if default in (None, "", (), []) or isinstance(default, bool) or flag not in doc_defaults:
            continue
        assert f"`{_shown(default)}`" in doc_defaults[flag], (
            f"ipvsctl {name} {flag}: the code's default is {default!r}, "
            f"the reference says {doc_defaults[flag]!r}"
        )
        checked += 1
    if name in ("run", "shutdown-manager"):
        assert checked >= 5


def test_the_checks_catch_a_missing_and_an_invented_flag():
    body = sections()["status"]
    flags, _, _ = documented(body.replace("| `--endpoint URL`", "| `--endpoint-url URL`"))
    real_flags, _, _ = real(cli_commands()["status"])
    assert "--endpoint" in real_flags - flags and "--endpoint-url" in flags - real_flags


def _exported() -> dict[str, tuple[str, tuple[str, ...]]]:
    """name -> (type, label names) of every ipvsctl_ metric the daemon defines."""
    from prometheus_client.metrics import MetricWrapperBase

    from ipvsctl.obs.metrics import Metrics, ServiceTrafficCollector

    out = {}
    metrics = Metrics()
    for m in vars(metrics).values():
        if isinstance(m, MetricWrapperBase):
            name = m._name + ("_total" if m._type == "counter" else "")
            out[name] = (m._type, tuple(m._labelnames))
    # the per-Service traffic series, made at scrape time by the service-metrics feature's
    # collector (no children)
    for family in ServiceTrafficCollector().describe():
        name = family.name + ("_total" if family.type == "counter" else "")
        labels = tuple(getattr(family, "_labelnames", ()))
        out[name] = (family.type, labels)
    return out


def test_metrics_table_matches_the_daemon_both_ways():
    text = REFERENCE.read_text()
    table = text[text.index("## Metrics") : text.index("## Shell completion")]
    rows = {}
    for line in table.splitlines():
        if not line.startswith("| `ipvsctl_"):
            continue
        name, kind, labels, *_ = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip("|"))]
        # label names are the code spans not after "=" or "\|" (those are values)
        names = re.findall(r"(?:^|, )`([a-z_]+)`", labels)
        rows[name.strip("`")] = (kind, tuple(names))
    exported = _exported()
    assert not set(exported) - set(rows), f"undocumented: {sorted(set(exported) - set(rows))}"
    assert not set(rows) - set(exported), f"not exported: {sorted(set(rows) - set(exported))}"
    for name, (kind, labels) in exported.items():
        assert rows[name][0] == kind, name
        assert set(rows[name][1]) == set(labels), (name, rows[name][1], labels)


def test_plan_json_example_is_what_plan_prints():
    text = REFERENCE.read_text()
    example = re.search(r"`plan -o json`.*?```json\n(.*?)```", text, re.S).group(1)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "ipvsctl",
            "plan",
            "-f",
            "examples/",
            "--node-ip",
            "192.0.2.10",
            "-o",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(example) == json.loads(r.stdout)


def markdown_files() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def relative_links(doc: Path) -> list[str]:
    """The link targets in a Markdown file that are paths (no URL, no anchor alone), code
    blocks aside."""
    text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)
    return [t for t in re.findall(r"\]\(([^)\s]+)\)", text) if not re.match(r"^[a-z]+:|^#", t)]


@pytest.mark.parametrize("doc", markdown_files(), ids=lambda p: p.name)
def test_relative_links_resolve_inside_the_repository(doc):
    for target in relative_links(doc):
        path = (doc.parent / target.split("#")[0]).resolve()
        assert path.exists(), f"{doc.name}: link to {target} leads nowhere"
        assert REPO in path.parents or path == REPO, f"{doc.name}: {target} is outside the repo"


def test_the_link_check_has_links_to_check():
    """A docs/ folder moved away, or a link pattern that stopped matching, must not pass as
    nothing to check (README and nine guides held 54 links when this was written)."""
    docs = markdown_files()
    assert len(docs) >= 8
    assert sum(len(relative_links(d)) for d in docs) >= 40
    assert relative_links(REPO / "README.md")


def test_readme_links_to_the_reference():
    readme = (REPO / "README.md").read_text()
    assert "(docs/reference.md)" in readme and "shared/CONTRACT.md" not in readme


def test_readme_plan_example_is_what_plan_prints():
    readme = (REPO / "README.md").read_text()
    block = re.search(r"```\n\$ (ipvsctl plan -f examples/ [^\n]*)\n(.*?)```", readme, re.S)
    assert block, "README has no plan example"
    r = subprocess.run(
        [sys.executable, "-m", *block.group(1).split()],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout == block.group(2)


def seconds_flags() -> list[str]:
    """`ipvsctl run`'s flags documented as taking a DURATION."""
    return re.findall(r"^\| `(--[a-z-]+) DURATION`", sections()["run"], re.M)


def seconds_examples() -> list[str]:
    """The values the reference says a DURATION flag takes: the code spans of the clause (up
    to a ";" or a sentence's end) that says so."""
    text = REFERENCE.read_text()
    section = text[text.index("## Durations and exit codes") :]
    clause = re.search(r"Every DURATION flag[^;]*?(?:;|\.\s)", section, re.S)
    assert clause, "the reference does not say what a DURATION flag takes"
    return re.findall(r"`(\d[^`]*)`", clause.group(0))


def run_exit(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ipvsctl", "run", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )


def test_seconds_flags_take_what_the_reference_says():
    """Each example the reference gives for DURATION flags, on every DURATION flag of `run`, is
    accepted (the run stops at a bad --scheduler, checked after them), and Go durations are
    among the examples, since the flags take them."""
    flags, examples = seconds_flags(), seconds_examples()
    assert len(flags) >= 5 and "--drain-timeout" in flags
    assert [e for e in examples if re.search(r"\d(ms|s|m|h)\b", e)], examples
    for value in examples:
        r = run_exit(*(a for f in flags for a in (f, value)), "--scheduler", "no-such")
        assert r.returncode == 2 and "--scheduler" in r.stderr, (value, r.stderr)
        assert not [f for f in flags if f in r.stderr], (value, r.stderr)
    r = run_exit("--drain-timeout", "2 minutes", "--scheduler", "no-such")
    assert r.returncode == 2 and "--drain-timeout" in r.stderr, r.stderr


SECTION_REF = re.compile(r'\b([A-Za-z][\w-]*\.md),? "([^"\n]{3,80})"')


def section_refs() -> list[tuple[str, str, str]]:
    """(file that cites, Markdown file, section title): each Markdown file's name followed by
    a quoted section title, in the repository's docs, manifests, code and tests (CONTRACT.md,
    outside the repository, aside)."""
    files = [
        REPO / "README.md",
        *(REPO / "docs").glob("*.md"),
        *(REPO / "bench").glob("*.md"),
        *(
            p
            for d in ("daemonset", "ipvsctl", "tests", "devkit", "bench")
            for p in (REPO / d).rglob("*")
            if p.suffix in (".py", ".yaml", ".md", ".sh")
        ),
    ]
    return [
        (str(f.relative_to(REPO)), name, title)
        for f in sorted(set(files))
        for name, title in SECTION_REF.findall(f.read_text(errors="replace"))
        if name != "CONTRACT.md"
    ]


def test_quoted_sections_exist():
    """A quoted section of a Markdown file is one of its headings, or how one starts (the
    alert rules once sent readers to an "Alerts" section that had another title)."""
    refs = section_refs()
    assert len(refs) >= 8
    for cited_in, name, title in refs:
        doc = REPO / name if name == "README.md" else REPO / "docs" / name
        assert doc.exists(), f"{cited_in}: no {name}"
        headings = [
            h.replace("`", "")
            for h in re.findall(
                r"^#+ (.+)$", re.sub(r"```.*?```", "", doc.read_text(), flags=re.S), re.M
            )
        ]
        assert any(h.startswith(title) for h in headings), (
            f'{cited_in}: {name} has no section "{title}"'
        )


# What the project's own development leaves in text, and a user cannot follow: its issue
# numbers, branch names, who shared the machine, its internal contract file.
INTERNAL = re.compile(
    r"\bissues? \d+|(?<![\w/.-])#\d+\b|\bbranch(es)?\b(?!-)|\bengineers?\b"
    r"|\bshared \d[- ]cores?|machine (was |is )?shared|\bloaded machine|CONTRACT\.md",
    re.I,
)


@pytest.mark.parametrize("doc", markdown_files(), ids=lambda p: p.name)
def test_user_docs_cite_nothing_internal(doc):
    """Method notes of that kind live in bench/notes.md; the docs keep results and method."""
    text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)
    found = [m.group(0) for m in INTERNAL.finditer(text)]
    assert not found, f"{doc.name}: {found}"


def test_the_internal_check_catches_what_it_should():
    # the ticket-number samples are made from their shape, so this file cites no ticket
    numbered = [shape.replace("N", n) for shape, n in (("until issue N", "23"), ("see #N", "12"))]
    caught = [
        *numbered,
        "issue N, item 3".replace("N", "14"),
        "branch `perf`",
        "seven other engineers",
        "shared 2 cores",
        "a shared 2-core VM",
        "the machine was shared",
        "the loaded machine",
        "(CONTRACT.md)",
    ]
    fine = [
        "kubernetes/kubernetes#56374",
        "shared by concurrent callers",
        "`#ipvsctldown`",
        "a branch-free loop",
        "no mark bit is shared with the CNI",
    ]
    assert all(INTERNAL.search(t) for t in caught), [t for t in caught if not INTERNAL.search(t)]
    assert not [t for t in fine if INTERNAL.search(t)]


def test_benchmarks_md_is_what_bench_report_renders():
    """docs/benchmarks.md is generated from bench/ (summary, results, extra, method): edit
    those, then `python -m bench.report --no-copy`."""
    from bench import report

    rendered = report.render(report.load(REPO / "out" / "nonexistent", copy=False))
    assert (REPO / "docs" / "benchmarks.md").read_text() == rendered
    assert "bench/notes.md" in rendered and "## How these numbers were taken" in rendered

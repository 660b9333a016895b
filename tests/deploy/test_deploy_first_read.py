"""What a newcomer reads first stays short: README up to "Install" reads in a minute, and
operations.md's failure modes have one short row each at a glance, each linking to the
group of the detailed table that holds its full row."""

from __future__ import annotations

import re

from .helpers import REPO
from .test_deploy_monitoring import github_anchors

OPERATIONS = REPO / "docs" / "operations.md"


def test_readme_says_what_and_why_in_a_minute():
    intro = (REPO / "README.md").read_text().split("\n## ", 1)[0]
    assert "graceful termination" in intro.split("\n\n")[1]  # the first paragraph
    assert len(intro.split()) <= 250, len(intro.split())  # a minute, at a reading pace


def rows(part: str) -> list[str]:
    heads = ("| failure |", "| what happens |")
    return [
        line for line in part.splitlines() if line.startswith("| ") and not line.startswith(heads)
    ]


def failure_tables() -> tuple[list[str], list[str]]:
    text = OPERATIONS.read_text()
    start = text.index("## Failure modes")
    section = text[start : text.index("\n## ", start + 1)]
    glance, detail = section.split("### In detail")
    return rows(glance), rows(detail)


def test_every_failure_has_a_short_row_linking_to_its_detail():
    glance, detail = failure_tables()
    assert len(glance) == len(detail) >= 50
    anchors = github_anchors(OPERATIONS.read_text())
    for row in glance:
        (link,) = re.findall(r"\[more\]\(#([^)]+)\)", row)
        assert link in anchors, row
        assert len(row.split(" | ")[0]) <= 80, row  # the failure in a few words

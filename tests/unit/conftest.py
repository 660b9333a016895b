"""Shared by every unit test."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _root_logger_restored() -> Iterator[None]:
    """`ipvsctl run` invoked in-process sets the root logger's handler to CliRunner's
    stderr, closed once the invocation returns: every later log line of the session would
    be a "Logging error" traceback. Each test gets the root logger back as it found it."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)

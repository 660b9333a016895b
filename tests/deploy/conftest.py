"""Fixtures shared by the deploy tests."""

from __future__ import annotations

import pytest

from .helpers import contract_path


@pytest.fixture(scope="session")
def contract() -> str:
    """shared/CONTRACT.md's text; the tests that need it are skipped without it."""
    path = contract_path()
    if path is None:
        pytest.skip("shared/CONTRACT.md not found beside the repository")
    return path.read_text()

"""`--log-level debug` is ipvsctl's own account: pyroute2's netlink message dicts (and the
other libraries' chatter) stay out below warning unless IPVSCTL_LOG_LIBRARIES asks for
them; their warnings and errors always show."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from ipvsctl.obs.logging import LibraryFilter

# A real pyroute2 exchange (rtnetlink needs no privilege and no IPVS) under setup("debug").
SCRIPT = """
import logging
from ipvsctl.obs import logging as obs_logging
obs_logging.setup("text", "debug")
from pyroute2 import IPRoute  # imported after setup, as the daemon does: it resets its level
with IPRoute() as ipr:
    ipr.get_links()
logging.getLogger("ipvsctl.engine").debug("sync complete", extra=obs_logging.fields(services=1))
logging.getLogger("pyroute2.netlink.core").warning("a warning of its own")
"""


def run(env: dict[str, str]) -> list[str]:
    r = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60, env=env
    )
    assert r.returncode == 0, r.stderr
    return r.stderr.splitlines()


def test_debug_shows_ipvsctls_decisions_and_not_pyroute2s_messages():
    lines = run({"PATH": "/usr/bin:/bin"})
    assert [line.split(" ", 1)[1] for line in lines] == [
        "DEBUG ipvsctl.engine: sync complete services=1",
        "WARNING pyroute2.netlink.core: a warning of its own",
    ]


def test_pyroute2s_debug_log_is_there_when_asked_for():
    lines = run({"PATH": "/usr/bin:/bin", "IPVSCTL_LOG_LIBRARIES": "pyroute2"})
    theirs = [line for line in lines if " DEBUG pyroute2." in line]
    assert theirs, lines
    assert not any(" asyncio: " in line for line in lines)  # only what was named


@pytest.mark.parametrize(
    ("opted_in", "name", "level", "shown"),
    [
        ("", "pyroute2.netlink.core", logging.DEBUG, False),
        ("", "pyroute2", logging.INFO, False),
        ("", "pyroute2.netlink.core", logging.WARNING, True),
        ("", "urllib3.connectionpool", logging.DEBUG, False),
        ("", "ipvsctl.engine", logging.DEBUG, True),
        ("", "pyroute2x", logging.DEBUG, True),  # a prefix of a name is not the library
        ("pyroute2", "pyroute2.netlink.core", logging.DEBUG, True),
        ("pyroute2", "urllib3", logging.DEBUG, False),
        (" urllib3 , pyroute2", "urllib3.connectionpool", logging.DEBUG, True),
        ("all", "asyncio", logging.DEBUG, True),
    ],
)
def test_library_filter(opted_in, name, level, shown):
    record = logging.LogRecord(name, level, __file__, 1, "m %s", ({"attrs": []},), None)
    assert LibraryFilter(opted_in).filter(record) is shown

"""ipvsctl's own requests never go through http_proxy/HTTPS_PROXY: a pod that inherits a
proxy environment must still reach its node's daemon and the other nodes' daemons."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from ipvsctl.cli.status import fetch_daemon_status
from ipvsctl.httpd import HTTPServer, as_json
from ipvsctl.shutdown.probes import fetch_quiesced


@pytest.fixture
def proxied(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[bytes]]:
    """A "proxy" that records what it is sent and never answers, set in every variable."""
    proxy = socket.socket()
    proxy.bind(("127.0.0.1", 0))
    proxy.listen(16)
    url = f"http://127.0.0.1:{proxy.getsockname()[1]}"
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy"):
        monkeypatch.setenv(name, url)
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    seen: list[bytes] = []
    yield seen
    proxy.setblocking(False)
    try:
        while True:
            seen.append(proxy.accept()[0].recv(100))
    except BlockingIOError:
        pass
    proxy.close()
    assert seen == [], "a request went to the proxy"


@pytest.fixture
def daemon() -> Iterator[str]:
    srv = HTTPServer(
        "127.0.0.1:0",
        {
            "/status": lambda q: as_json(
                200, {"node": "n", "ready": True, "virtual_servers": [], "drain_queue": []}
            ),
            "/v1/quiesced": lambda q: as_json(
                200, {"ip": q["ip"][0], "ready": True, "quiesced": True}
            ),
        },
    )
    srv.start()
    yield f"http://127.0.0.1:{srv.port}"
    srv.stop()


def test_status_command_ignores_proxy_env(proxied: list[bytes], daemon: str) -> None:
    doc, error = fetch_daemon_status(daemon, timeout=2)
    assert error is None and doc is not None and doc["node"] == "n"


def test_shutdown_manager_probe_ignores_proxy_env(proxied: list[bytes], daemon: str) -> None:
    report = fetch_quiesced(daemon, "10.244.1.5", timeout=2)
    assert report.ready and report.quiesced

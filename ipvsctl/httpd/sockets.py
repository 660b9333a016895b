"""Sockets for ipvsctl's HTTP: the one way every listener is opened, and the one way its
own requests go out (never through a proxy)."""

from __future__ import annotations

import errno
import socket
from typing import Any


def direct_opener() -> Any:
    """A urllib opener that never goes through a proxy: ipvsctl's own requests (to the
    node's daemon, to other nodes' daemons) are direct, whatever http_proxy/HTTPS_PROXY a
    pod inherited (through a proxy they would time out or reach the wrong daemon)."""
    import urllib.request

    return urllib.request.build_opener(urllib.request.ProxyHandler({}))


def listen_socket(host: str | None, port: int, backlog: int = 128) -> socket.socket:
    """A listening TCP socket on host:port (IPv6 when host has a colon). host None: every
    address of the node, dual-stack `::` where IPv6 exists, else 0.0.0.0 (as kube-proxy's
    health check ports listen)."""
    if host is None:
        try:
            sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        except OSError as exc:
            if exc.errno not in (errno.EAFNOSUPPORT, errno.EPROTONOSUPPORT):
                raise
            sock, host = socket.socket(socket.AF_INET, socket.SOCK_STREAM), "0.0.0.0"
        else:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            host = "::"
    else:
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    return sock

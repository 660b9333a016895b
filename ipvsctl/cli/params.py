"""Checks of the CLI's values that every command shares, done while the flags are parsed
(exit 2, one line, before anything touches the host), and kubectl's `-o=json`. Pure."""

from __future__ import annotations

import urllib.parse
from collections.abc import Sequence

from ipvsctl.model.hostport import host_port

__all__ = ["ENDPOINT_ENV", "daemon_url", "host_port", "split_short_equals"]

# Where the node's daemon answers, for the commands that ask it (`--endpoint`): set in the
# daemon's container when it listens on the node's address only (daemonset/listen-node-ip).
ENDPOINT_ENV = "IPVSCTL_ENDPOINT"


def daemon_url(value: str) -> str:
    """A daemon's base URL from `http(s)://HOST:PORT[/path]` or a bare `HOST:PORT` (taken
    as http://), without a trailing slash. ValueError says what is wrong."""
    value = value.strip()
    if "://" not in value:
        host, port = host_port(value)
        return f"http://[{host}]:{port}" if ":" in host else f"http://{value}"
    parts = urllib.parse.urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("must be http://HOST:PORT, https://HOST:PORT or HOST:PORT")
    try:
        parts.port  # noqa: B018 - raises for a port out of range
    except ValueError:
        raise ValueError(f"port {parts.netloc.rpartition(':')[2]} is not in 0-65535") from None
    return f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}"


def split_short_equals(args: Sequence[str]) -> list[str]:
    """kubectl's `-o=json` (pflag takes it; click would read the value as `=json`):
    `-X=VALUE` becomes `-X VALUE`. Arguments after `--` are left alone."""
    out: list[str] = []
    for i, arg in enumerate(args):
        if arg == "--":
            return out + list(args[i:])
        if len(arg) > 2 and arg[0] == "-" and arg[1].isalpha() and arg[2] == "=":
            out += [arg[:2], arg[3:]]
        else:
            out.append(arg)
    return out

"""`HOST:PORT` as the listening flags take it (`--listen`, `--healthz-bind-address`, the
shutdown-manager's). Pure."""

from __future__ import annotations

import re

from ipvsctl.model.keys import normalize_ip

_HOSTNAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?$")


def host_port(value: str) -> tuple[str, int]:
    """`HOST:PORT`, `[IPV6]:PORT` or `:PORT` (every address) -> (host, port). HOST is an
    address or a name; PORT 0 to 65535 (0: any free port). ValueError says what is wrong."""
    host, sep, port = value.strip().rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError("must be HOST:PORT")
    if int(port) > 65535:
        raise ValueError(f"port {port} is not in 0-65535")
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if bare:
        try:
            normalize_ip(bare)
        except ValueError:
            if bare is not host or not _HOSTNAME.match(bare):
                raise ValueError(f"{host!r} is not an address or a host name") from None
    return bare, int(port)

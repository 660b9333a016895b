"""The daemon's action token: a random secret in its state dir (0600, root's), which a
client on the node shows to ask for an action (`POST /v1/handover`) from a node address
rather than loopback (`--listen` on the node's own address: daemonset/listen-node-ip). A
pod's connection can reach the daemon from a node address (masqueraded); it cannot read
the node's /var/lib/ipvsctl. Made anew at every start: a token copied once is good until
the daemon restarts, never after."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

FILE = "action-token"
TOKEN_HEADER = "x-ipvsctl-token"  # lower case: the HTTP server's header names are
MAX_BYTES = 256


def write_token(state_dir: str | Path) -> str:
    """A new token, written atomically (a temporary file renamed over the old one) with mode
    0600; OSError when it cannot be."""
    token = secrets.token_hex(16)
    path = Path(state_dir) / FILE
    tmp = path.with_name(f".{FILE}.{os.getpid()}")
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, 0o600)
    try:
        os.write(fd, token.encode() + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return token


def read_token(state_dir: str | Path) -> str | None:
    """The token, None when there is none this process may read."""
    try:
        fd = os.open(Path(state_dir) / FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        data = os.read(fd, MAX_BYTES)
    except OSError:
        return None
    finally:
        os.close(fd)
    text = data.decode("ascii", "replace").strip()
    return text or None

"""The files a kubeconfig or the in-cluster configuration names (the kubeconfig itself, a
bearer token, a CA, a client certificate or key), read bounded: a regular file only, opened
non-blocking, at most a size. A FIFO named by mistake must not hang start-up or a token
re-read (an open for reading blocks until a writer comes), and `/dev/zero` or a huge file
must not take the node's memory. Every refusal is one short line (`FileRefused`)."""

from __future__ import annotations

import os
import stat

TOKEN_LIMIT = 64 * 1024  # a service-account token is ~1 KB; a bound, not a guess at its size
CERT_LIMIT = 64 * 1024  # a client certificate (with its chain) or key
# A CA bundle: a kubeconfig may name the system's (Debian's is ~220 KB with ~140 CAs) when
# the API server has a public certificate.
CA_LIMIT = 1024 * 1024
KUBECONFIG_LIMIT = 4 * 1024 * 1024  # many contexts, each with its certificates inline

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class FileRefused(Exception):
    """A file that cannot be used: missing, unreadable, not a regular file, too large.
    `missing` tells the first apart (a KUBECONFIG list tolerates missing files)."""

    def __init__(self, message: str, *, missing: bool = False) -> None:
        super().__init__(message)
        self.missing = missing


def read_bounded(path: str, limit: int) -> bytes:
    """The contents of the regular file at `path` (symlinks followed, as a projected token's
    are), at most `limit` bytes; FileRefused otherwise. Opened with O_NONBLOCK, so a FIFO is
    refused at once instead of waiting for a writer."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise FileRefused(
            exc.strerror or type(exc).__name__, missing=isinstance(exc, FileNotFoundError)
        ) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = next((name for test, name in _KINDS if test(mode)), "not a file")
            raise FileRefused(f"not a regular file ({kind})")
        chunks: list[bytes] = []
        size = 0
        while size <= limit:  # never trust st_size: /proc and growing files lie about it
            chunk = os.read(fd, limit + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise FileRefused(f"larger than {limit} bytes")
        return b"".join(chunks)
    except OSError as exc:
        raise FileRefused(exc.strerror or type(exc).__name__) from None
    finally:
        os.close(fd)


def read_token(path: str) -> str:
    """A bearer token file's token: bounded, UTF-8, surrounding whitespace stripped (a
    newline in a header would fail every request), not empty."""
    try:
        token = read_bounded(path, TOKEN_LIMIT).decode().strip()
    except UnicodeDecodeError:
        raise FileRefused("not UTF-8 text") from None
    if not token:
        raise FileRefused("empty")
    if any(c in token for c in "\r\n\0"):
        raise FileRefused("more than one line")
    return token

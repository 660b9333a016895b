"""nfnetlink's generation and table lookups, as the netfilter sync reads them: the messages
packed and parsed, errors told apart (the lab runs them against the real kernel)."""

from __future__ import annotations

import errno
import struct

import pytest

from ipvsctl.netfilter.generation import (
    NFT_MSG_GETGEN,
    NFT_MSG_GETTABLE,
    NftGeneration,
    attributes,
    parse_generation,
    table_request,
)

HEADER = struct.Struct("=IHHII")


def answer(seq: int, kind: int, body: bytes) -> bytes:
    return HEADER.pack(HEADER.size + len(body), kind, 0, seq, 0) + body


def newgen(seq: int, gen: int) -> bytes:
    nla = struct.pack("=HH", 8, 1) + gen.to_bytes(4, "big")
    return answer(seq, (10 << 8) | 15, struct.pack("=BBH", 0, 0, 0) + nla)


def error(seq: int, code: int) -> bytes:
    return answer(seq, 2, struct.pack("=i", -code) + b"\0" * 16)


class FakeSocket:
    """Answers each request with what the test queued for its kind: an errno, a generation,
    "table" (a table's answer), or "broken" (the socket fails)."""

    def __init__(self, answers: dict[int, list[int | str]]) -> None:
        self.answers = answers
        self.pending: list[bytes] = []
        self.closed = False

    def settimeout(self, t: float) -> None: ...

    def bind(self, addr: object) -> None: ...

    def close(self) -> None:
        self.closed = True

    def send(self, data: bytes) -> int:
        _, kind, _, seq, _ = HEADER.unpack_from(data, 0)
        queued = self.answers[kind & 0xFF].pop(0)
        late = error(seq - 1, 0)  # an earlier request's ack, read first
        if queued == "broken":
            raise OSError(errno.ENOBUFS, "No buffer space available")
        if queued == "table":
            self.pending = [late, answer(seq, (10 << 8) | 0, b"\0" * 4)]
        elif kind & 0xFF == NFT_MSG_GETGEN:
            assert isinstance(queued, int)
            self.pending = [late, newgen(seq, queued)]
        else:
            assert isinstance(queued, int)
            self.pending = [late, error(seq, queued)]
        return len(data)

    def recv(self, n: int) -> bytes:
        return self.pending.pop(0)


def test_a_table_request_names_the_table_and_its_family():
    msg = table_request(7, 1, "ipvsctl")
    length, kind, flags, seq, _ = HEADER.unpack_from(msg, 0)
    assert (length, kind, flags, seq) == (len(msg), (10 << 8) | NFT_MSG_GETTABLE, 1, 7)
    assert msg[16] == 1  # nfgenmsg family: inet
    assert attributes(msg, 20) == {1: b"ipvsctl\0"}
    assert len(msg) % 4 == 0


def test_the_generation_is_read_from_its_attribute_and_a_missing_one_is_an_error():
    assert parse_generation(newgen(1, 0x01020304)) == 0x01020304
    with pytest.raises(OSError):
        parse_generation(answer(1, (10 << 8) | 15, struct.pack("=BBH", 0, 0, 0)))


def test_a_missing_table_is_false_other_errors_raise_and_a_broken_socket_is_reopened():
    sockets: list[FakeSocket] = []

    def open_socket() -> FakeSocket:
        s = FakeSocket(
            {
                NFT_MSG_GETGEN: [5, 6],
                NFT_MSG_GETTABLE: [errno.ENOENT, "table", errno.EPERM, "broken"],
            }
        )
        sockets.append(s)
        return s

    watch = NftGeneration("inet ipvsctl", open_socket)  # type: ignore[arg-type]
    assert watch.generation() == 5
    assert watch.table_exists() is False
    assert watch.table_exists() is True
    with pytest.raises(OSError) as exc:
        watch.table_exists()  # EPERM: no CAP_NET_ADMIN
    assert exc.value.errno == errno.EPERM
    assert len(sockets) == 1 and not sockets[0].closed  # the kernel's answers: one socket
    with pytest.raises(OSError):
        watch.table_exists()
    assert sockets[0].closed  # a failed socket is not used again
    assert watch.generation() == 5 and len(sockets) == 2

"""nfnetlink's generation and table lookups, as the netfilter sync reads them: the messages
packed and parsed, the kernel's answers told apart from a failed socket. A datagram socket
pair plays the kernel here; the lab asks the real one."""

from __future__ import annotations

import errno
import socket
import struct

import pytest

from ipvsctl.kernel.netlink import wire
from ipvsctl.kernel.netlink.nftables import (
    NFT_MSG_GETTABLE,
    NftGeneration,
    message_type,
    parse_generation,
    table_request,
)

HEADER = struct.Struct("=IHHII")
NEWGEN = message_type(15)


def answer(seq: int, kind: int, body: bytes) -> bytes:
    return HEADER.pack(HEADER.size + len(body), kind, 0, seq, 0) + body


def newgen(seq: int, gen: int) -> bytes:
    return answer(seq, NEWGEN, struct.pack("=BBH", 0, 0, 0) + wire.nla(1, gen.to_bytes(4, "big")))


def error(seq: int, code: int) -> bytes:
    return answer(seq, wire.NLMSG_ERROR, struct.pack("=i", -code) + b"\0" * 16)


def test_a_table_request_names_the_table_and_its_family():
    flags, payload = table_request(1, "ipvsctl")
    msg = wire.message(message_type(NFT_MSG_GETTABLE), (flags, payload), 7)
    length, kind, got_flags, seq, _ = HEADER.unpack_from(msg, 0)
    assert (length, kind, got_flags, seq) == (len(msg), (10 << 8) | 1, wire.FLAGS_REQ, 7)
    assert msg[16] == 1  # nfgenmsg family: inet
    assert wire.attributes(msg, 20) == {1: b"ipvsctl\0"}
    assert len(msg) % 4 == 0


def test_the_generation_is_read_from_its_attribute_and_a_missing_one_is_an_error():
    assert parse_generation(newgen(1, 0x01020304)) == 0x01020304
    with pytest.raises(OSError):
        parse_generation(answer(1, NEWGEN, struct.pack("=BBH", 0, 0, 0)))


def test_a_missing_table_is_false_other_errors_raise_and_a_broken_socket_is_reopened():
    # the kernel's answers to the four questions below, queued when the socket opens (a
    # stray ack of another sequence number first: dropped, as RawSocket drops it)
    script = [
        error(0, 0),
        newgen(1, 5),
        error(1, 0),
        error(2, errno.ENOENT),
        answer(3, message_type(0), b"\0" * 4),
        error(3, 0),
        error(4, errno.EPERM),
    ]
    scripts = [script, [newgen(6, 7), error(6, 0)]]  # the second socket's: question 6
    opened: list[tuple[socket.socket, socket.socket]] = []

    def open_socket() -> socket.socket:
        mine, kernel = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        mine.setblocking(False)
        for datagram in scripts[len(opened)]:
            kernel.send(datagram)
        opened.append((mine, kernel))
        return mine

    watch = NftGeneration("inet ipvsctl", open_socket=open_socket)
    assert watch.generation() == 5
    assert watch.table_exists() is False
    assert watch.table_exists() is True
    with pytest.raises(OSError) as exc:
        watch.table_exists()  # no CAP_NET_ADMIN: the kernel said so
    assert exc.value.errno == errno.EPERM
    assert len(opened) == 1  # the kernel's answers: one socket throughout
    opened[0][0].close()  # the socket fails
    with pytest.raises(OSError):
        watch.table_exists()
    assert watch.generation() == 7 and len(opened) == 2  # a fresh socket

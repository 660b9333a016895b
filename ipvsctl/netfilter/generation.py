"""nftables' ruleset generation and one table's presence, over nfnetlink: one small message
each (NFT_MSG_GETGEN, NFT_MSG_GETTABLE), some tens of microseconds, where listing the table
with `nft` costs a process. The netfilter sync reads the generation every second: it moves
with every nftables transaction on the node, anyone's; only then is the table looked up, so
a deleted `inet ipvsctl` (an operator's `nft flush ruleset`, another tool's cleanup) is
noticed within a second, not at the next 30 s check.

The socket is opened by `open_socket` (default: in the calling thread's network namespace;
the daemon's wiring passes one that opens it where `nft` runs).
"""

from __future__ import annotations

import errno
import os
import socket
import struct
import threading
from collections.abc import Callable

NETLINK_NETFILTER = 12
NFNL_SUBSYS_NFTABLES = 10
NFT_MSG_GETTABLE, NFT_MSG_GETGEN = 1, 16
NFTA_TABLE_NAME = 1
NFTA_GEN_ID = 1
NFPROTO = {"inet": 1, "ip": 2, "ip6": 10, "arp": 3, "bridge": 7, "netdev": 5}
NLM_F_REQUEST = 1
NLMSG_ERROR, NLMSG_DONE = 2, 3
RECV = 1 << 16

_HEADER = struct.Struct("=IHHII")  # nlmsghdr
_NFGEN = struct.Struct("=BBH")  # nfgenmsg: family, version, resource id
_NLA = struct.Struct("=HH")


def attributes(data: bytes, offset: int) -> dict[int, bytes]:
    """The netlink attributes of one message from `offset` on, by type (flags masked)."""
    out: dict[int, bytes] = {}
    while offset + _NLA.size <= len(data):
        length, kind = _NLA.unpack_from(data, offset)
        if length < _NLA.size or offset + length > len(data):
            break
        out[kind & 0x3FFF] = data[offset + _NLA.size : offset + length]
        offset += (length + 3) & ~3
    return out


def table_request(seq: int, family: int, name: str) -> bytes:
    raw = name.encode() + b"\0"
    nla = _NLA.pack(_NLA.size + len(raw), NFTA_TABLE_NAME) + raw
    nla += b"\0" * (-len(nla) % 4)
    return _request(seq, NFT_MSG_GETTABLE, family, nla)


def generation_request(seq: int) -> bytes:
    return _request(seq, NFT_MSG_GETGEN, 0, b"")


def _request(seq: int, msg: int, family: int, attrs: bytes) -> bytes:
    body = _NFGEN.pack(family, 0, 0) + attrs
    kind = (NFNL_SUBSYS_NFTABLES << 8) | msg
    return _HEADER.pack(_HEADER.size + len(body), kind, NLM_F_REQUEST, seq, 0) + body


def parse_generation(message: bytes) -> int:
    """The generation id of a NFT_MSG_NEWGEN answer."""
    value = attributes(message, _HEADER.size + _NFGEN.size).get(NFTA_GEN_ID)
    if value is None or len(value) != 4:
        raise OSError(errno.EPROTO, "no generation id in the answer")
    return int.from_bytes(value, "big")


def open_netfilter_socket() -> socket.socket:
    return socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)


class NftGeneration:
    """The generation and whether one table exists. Raises OSError when nfnetlink cannot
    answer (no nf_tables, no CAP_NET_ADMIN): the caller then checks at its own pace."""

    def __init__(
        self, target: str, open_socket: Callable[[], socket.socket] = open_netfilter_socket
    ) -> None:
        family, _, name = target.partition(" ")
        self.family, self.name = NFPROTO[family], name
        self.open_socket = open_socket
        self._sock: socket.socket | None = None
        self._seq = 0
        self._lock = threading.Lock()

    def generation(self) -> int:
        return parse_generation(self._ask(generation_request))

    def table_exists(self) -> bool:
        try:
            self._ask(lambda seq: table_request(seq, self.family, self.name))
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                return False
            raise
        return True

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None

    def _ask(self, build: Callable[[int], bytes]) -> bytes:
        with self._lock:
            if self._sock is None:
                sock = self.open_socket()
                sock.settimeout(2.0)
                sock.bind((0, 0))
                self._sock = sock
            self._seq += 1
            seq = self._seq
            try:
                self._sock.send(build(seq))
                while True:
                    data = self._sock.recv(RECV)
                    if len(data) < _HEADER.size:
                        raise OSError(errno.EPROTO, "short netlink answer")
                    length, kind, _flags, got, _pid = _HEADER.unpack_from(data, 0)
                    if got != seq:
                        continue  # an earlier request's late answer
                    if kind == NLMSG_ERROR:
                        code = -struct.unpack_from("=i", data, _HEADER.size)[0]
                        if code == 0:
                            continue  # an ack
                        break
                    if kind == NLMSG_DONE:
                        raise OSError(errno.EPROTO, "no answer")
                    return data[:length]
            except OSError:
                self._sock.close()  # a fresh socket next time: no answer left queued
                self._sock = None
                raise
        raise OSError(code, os.strerror(code))  # the kernel's answer: the socket is fine

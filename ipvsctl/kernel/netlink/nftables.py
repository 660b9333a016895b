"""nftables' ruleset generation and one table's presence, over nfnetlink: one small message
each (NFT_MSG_GETGEN, NFT_MSG_GETTABLE), some tens of microseconds, where listing the table
with `nft` costs a process. The netfilter sync (netfilter/sync.py, its GenerationReader)
reads the generation every second: it moves with every nftables transaction on the node,
anyone's; only then is the table looked up, so a deleted `inet ipvsctl` is noticed within
a second, not at the next 30 s check.

The socket is opened in `netns` (the daemon's own namespace when None), as `nft` runs.
"""

from __future__ import annotations

import errno
import socket
import struct
import threading
from collections.abc import Callable
from typing import Any

from pyroute2 import NetlinkError

from ipvsctl.kernel.netlink import wire
from ipvsctl.kernel.netlink.raw import RawSocket
from ipvsctl.kernel.netns import run_in_netns

NETLINK_NETFILTER = 12
NFNL_SUBSYS_NFTABLES = 10
NFT_MSG_GETTABLE, NFT_MSG_GETGEN = 1, 16
NFTA_TABLE_NAME = 1
NFTA_GEN_ID = 1
NFPROTO = {"inet": 1, "ip": 2, "ip6": 10, "arp": 3, "bridge": 7, "netdev": 5}

_NFGEN = struct.Struct("=BBH")  # nfgenmsg: family, version, resource id
_ATTRS = 16 + _NFGEN.size  # nlmsghdr, nfgenmsg


def message_type(msg: int) -> int:
    return (NFNL_SUBSYS_NFTABLES << 8) | msg


def generation_request() -> wire.Request:
    return wire.FLAGS_REQ, _NFGEN.pack(0, 0, 0)


def table_request(family: int, name: str) -> wire.Request:
    return wire.FLAGS_REQ, _NFGEN.pack(family, 0, 0) + wire.nla(
        NFTA_TABLE_NAME, name.encode() + b"\0"
    )


def parse_generation(message: bytes) -> int:
    """The generation id of a NFT_MSG_NEWGEN answer (OSError without one)."""
    value = wire.attributes(message, _ATTRS).get(NFTA_GEN_ID)
    if value is None or len(value) != 4:
        raise OSError("no generation id in nftables' answer")
    return int.from_bytes(value, "big")


def open_netfilter_socket() -> socket.socket:
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
    sock.setblocking(False)  # RawSocket polls for the answer
    sock.bind((0, 0))
    return sock


class NftGeneration:
    """The generation and whether one table (`target`: "inet ipvsctl") exists. OSError when
    nfnetlink cannot say (no nf_tables, no CAP_NET_ADMIN): the caller then checks at its own
    pace. A socket that failed is closed and opened afresh at the next question."""

    def __init__(
        self,
        target: str,
        netns: str | None = None,
        open_socket: Callable[[], Any] = open_netfilter_socket,
    ) -> None:
        family, _, name = target.partition(" ")
        self.family, self.name = NFPROTO[family], name
        self.netns = netns
        self.open_socket = open_socket  # a test's stand-in for the kernel
        self._raw: RawSocket | None = None
        self._seq = 0
        self._lock = threading.Lock()

    def generation(self) -> int:
        (answer,) = self._ask(NFT_MSG_GETGEN, generation_request())
        return parse_generation(answer)

    def table_exists(self) -> bool:
        try:
            self._ask(NFT_MSG_GETTABLE, table_request(self.family, self.name))
        except FileNotFoundError:
            return False
        return True

    def close(self) -> None:
        with self._lock:
            if self._raw is not None:
                self._raw.sock.close()
                self._raw = None

    def _ask(self, msg: int, request: wire.Request) -> list[bytes]:
        with self._lock:
            if self._raw is None:
                self._raw = RawSocket(run_in_netns(self.netns, self.open_socket))
            self._seq += 1
            try:
                answers = self._raw.request(message_type(msg), request, self._seq)
            except (NetlinkError, OSError) as exc:
                code = getattr(exc, "code", None)  # NetlinkError's: the kernel's errno
                if code is not None and code != errno.ETIMEDOUT:  # an answer: socket fine
                    raise OSError(code, f"nftables: {exc}") from None
                self._raw.sock.close()  # no answer, or a failed socket: a fresh one next
                self._raw = None
                raise OSError(code or getattr(exc, "errno", None), f"nftables: {exc}") from None
            if len(answers) != 1:
                raise OSError(f"nftables: {len(answers)} answers to one question")
            return answers

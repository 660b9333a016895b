"""pyroute2's per-thread netlink sockets, used raw: hand-packed requests (wire.py) out,
answers in, for the hot calls where pyroute2's generic request path was most of the cost
(IPVS service and dest commands and dumps, the VIP interface's address add/del).

pyroute2 still opens, owns and closes the sockets (and resolves the IPVS family); a socket
is used raw only by the thread it belongs to, with sequence numbers pyroute2 never uses, so
the two never read each other's answers.
"""

from __future__ import annotations

import errno
import itertools
import select
import threading
from typing import Any

from pyroute2 import NetlinkError

from ipvsctl.kernel.netlink import wire

ANSWER_TIMEOUT = 30.0  # seconds; the kernel answers at once, this only bounds a lost answer
_DUMP_BUFFER, _ACK_BUFFER = 1 << 18, 1 << 14
# pyroute2 numbers its requests from 0xFF to 0xFFFF: ours never meet them
_SEQ_FIRST, _SEQ_LAST = 0x01000000, 0x7FFFFFFF


class RawSocket:
    """One pyroute2 socket, raw. Blocks (poll: any descriptor number) for the answer; stray
    answers of other sequence numbers are dropped, as pyroute2 drops them."""

    def __init__(self, sock: Any) -> None:
        self.sock = sock
        self._poll = select.poll()
        self._poll.register(sock.fileno(), select.POLLIN)

    def request(self, msg_type: int, request: wire.Request, seq: int) -> list[bytes]:
        """The answers to one request (whole messages) before its ACK or end of dump;
        NetlinkError with the kernel's errno for an error answer."""
        self.sock.send(wire.message(msg_type, request, seq))
        size = _DUMP_BUFFER if request[0] == wire.FLAGS_DUMP else _ACK_BUFFER
        out: list[bytes] = []
        while True:
            # The kernel answers inside send() (and makes each further dump part inside
            # recv()), so the answer is normally there already: recv first, poll only when
            # it is not. Each call releases the GIL, and getting it back costs up to the
            # switch interval while a reader thread is busy: one fewer per request.
            try:
                data = self.sock.recv(size)
            except BlockingIOError:
                if not self._poll.poll(ANSWER_TIMEOUT * 1000):
                    raise NetlinkError(errno.ETIMEDOUT, "no answer from the kernel") from None
                continue
            for kind, _flags, answer_seq, msg in wire.split(data):
                if answer_seq != seq:
                    continue
                if kind == wire.NLMSG_ERROR:
                    code = wire.error_code(msg)
                    if code:
                        raise NetlinkError(code)
                    return out
                if kind == wire.NLMSG_DONE:
                    return out
                out.append(msg)


class RawRequests:
    """Requests on the calling thread's pyroute2 object (`owner`: its socket is
    `owner.asyncore.socket`), raw."""

    def __init__(self) -> None:
        self._seq = itertools.count()
        self._local = threading.local()

    def send(self, owner: Any, msg_type: int, request: wire.Request) -> list[bytes]:
        seq = _SEQ_FIRST + next(self._seq) % (_SEQ_LAST - _SEQ_FIRST)
        return self._raw(owner).request(msg_type, request, seq)

    def _raw(self, owner: Any) -> RawSocket:
        cached = getattr(self._local, "raw", None)
        if cached is None or cached[0] is not owner:  # a new socket for this thread
            cached = self._local.raw = (owner, RawSocket(owner.asyncore.socket))
        raw: RawSocket = cached[1]
        return raw

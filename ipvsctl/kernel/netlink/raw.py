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
from collections.abc import Sequence
from typing import Any

from pyroute2 import NetlinkError

from ipvsctl.kernel.netlink import wire

ANSWER_TIMEOUT = 30.0  # seconds; the kernel answers at once, this only bounds a lost answer
# A batch's answers are all queued (or dropped) inside its send(): one that has not come
# within this is lost, not late. The wait is under the loop's lock: short.
BATCH_ANSWER_WAIT = 1.0
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
        self._buffer: bytearray | None = None  # dumps(): one buffer for every answer

    def _receive(self, size: int) -> bytes:
        """The next datagram. The kernel answers inside send() (and makes each further dump
        part inside recv()), so the answer is normally there already: recv first, poll
        only when it is not. Each call releases the GIL, and getting it back costs up to
        the switch interval while a reader thread is busy: one fewer per request."""
        while True:
            try:
                data: bytes = self.sock.recv(size)
                return data
            except BlockingIOError:
                if not self._poll.poll(ANSWER_TIMEOUT * 1000):
                    raise NetlinkError(errno.ETIMEDOUT, "no answer from the kernel") from None

    def request(self, msg_type: int, request: wire.Request, seq: int) -> list[bytes]:
        """The answers to one request (whole messages) before its ACK or end of dump;
        NetlinkError with the kernel's errno for an error answer."""
        self.sock.send(wire.message(msg_type, request, seq))
        size = _DUMP_BUFFER if request[0] == wire.FLAGS_DUMP else _ACK_BUFFER
        out: list[bytes] = []
        while True:
            for kind, _flags, answer_seq, msg in wire.split(self._receive(size)):
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

    def batch(
        self, msg_type: int, requests: Sequence[wire.Request], seqs: Sequence[int]
    ) -> tuple[list[int], int]:
        """Many requests in one send(): the kernel's errno per request (0: done), and how
        many had their answer lost. The kernel runs a datagram's messages one after another
        inside send() and answers a failed one whatever its flags, a done one only when it
        asks for an ACK: only the last asks, so its answer is the end and the answers
        before it are the failures. Two system calls for the batch where one request each
        takes two.

        Every answer is queued, or dropped, by the time send() returns: a full receive
        buffer drops the rest and says ENOBUFS once; an answer not there within
        BATCH_ANSWER_WAIT is lost too. Then each request whose answer is unknown (it may be
        done or not) gets ENOBUFS (ETIMEDOUT when the kernel said nothing), and the answers
        still queued are read to the end, so that the next request's answer finds room
        (left there, they made the next batch's end be dropped: a 30 s wait)."""
        last = len(requests) - 1
        head = wire.HEADER
        parts = []
        for i, ((flags, payload), seq) in enumerate(zip(requests, seqs, strict=True)):
            if i != last:
                flags &= ~wire.NLM_F_ACK
            parts.append(head.pack(16 + len(payload), msg_type, flags, seq, 0) + payload)
        self.sock.send(b"".join(parts))
        index = {seq: i for i, seq in enumerate(seqs)}
        codes = [0] * len(requests)
        answered = [False] * len(requests)
        end = seqs[last]
        overrun = False
        while True:
            try:
                data: bytes = self.sock.recv(_ACK_BUFFER)
            except BlockingIOError:
                if overrun or not self._poll.poll(BATCH_ANSWER_WAIT * 1000):
                    break  # nothing more will come
                continue
            except OSError as exc:
                if exc.errno != errno.ENOBUFS:
                    raise
                overrun = True  # answers were dropped; those queued before are still here
                continue
            for kind, _flags, answer_seq, msg in wire.split(data):
                at = index.get(answer_seq)
                if at is None or kind != wire.NLMSG_ERROR:
                    continue  # another request's answer, dropped as pyroute2 does
                codes[at] = wire.error_code(msg)
                answered[at] = True
                if answer_seq == end and not overrun:
                    return codes, 0
        lost = errno.ENOBUFS if overrun else errno.ETIMEDOUT
        unknown = [i for i, known in enumerate(answered) if not known]
        for i in unknown:
            codes[i] = lost
        return codes, len(unknown)

    def dumps(
        self, msg_type: int, payloads: Sequence[bytes], seqs: Sequence[int]
    ) -> list[list[bytes] | int]:
        """Many dumps, one after another (the kernel runs one dump per socket at a time: a
        second request while one is running gets EBUSY): per request the datagrams of its
        answer (whole, for wire.py), or the kernel's errno. A drain check dumps 1,000
        virtual servers for one real server of each, found in these bytes
        (wire.find_dests): no Python here walks their messages. The kernel answers each
        request in datagrams of its own and ends a dump with NLMSG_DONE alone in the last
        (netlink_dump adds it only on the call after the data): a datagram is told by its
        first message. Three system calls a dump (send, the answer, NLMSG_DONE: the kernel
        makes the last while the answer is read)."""
        buf = self._buffer
        if buf is None:  # only the drain check's thread dumps so
            buf = self._buffer = bytearray(_DUMP_BUFFER)
        view = memoryview(buf)
        head = wire.HEADER
        out: list[list[bytes] | int] = []
        for payload, seq in zip(payloads, seqs, strict=True):
            self.sock.send(
                head.pack(16 + len(payload), msg_type, wire.FLAGS_DUMP, seq, 0) + payload
            )
            datagrams: list[bytes] = []
            result: list[bytes] | int | None = None
            while result is None:
                try:
                    n = self.sock.recv_into(buf)
                except BlockingIOError:
                    # the end inside a datagram with data (no kernel sends it so): no wait
                    result = wire.dump_end(datagrams, seq)
                    if result is None and not self._poll.poll(ANSWER_TIMEOUT * 1000):
                        raise NetlinkError(errno.ETIMEDOUT, "no answer from the kernel") from None
                    continue
                if n < 16:
                    continue
                _length, kind, _flags, answer_seq, _pid = head.unpack_from(buf, 0)
                if answer_seq != seq:
                    continue  # an answer to an earlier request, dropped as pyroute2 does
                if kind == wire.NLMSG_DONE:
                    result = datagrams
                elif kind == wire.NLMSG_ERROR:
                    result = -wire.ERROR_CODE.unpack_from(buf, 16)[0] or datagrams
                else:
                    datagrams.append(bytes(view[:n]))
            out.append(result)
        return out


class RawRequests:
    """Requests on the calling thread's pyroute2 object (`owner`: its socket is
    `owner.asyncore.socket`), raw."""

    def __init__(self) -> None:
        self._seq = itertools.count()
        self._local = threading.local()

    def send(self, owner: Any, msg_type: int, request: wire.Request) -> list[bytes]:
        seq = _SEQ_FIRST + next(self._seq) % (_SEQ_LAST - _SEQ_FIRST)
        return self._raw(owner).request(msg_type, request, seq)

    def batch(
        self, owner: Any, msg_type: int, requests: Sequence[wire.Request]
    ) -> tuple[list[int], int]:
        """RawSocket.batch on the calling thread's socket."""
        span = _SEQ_LAST - _SEQ_FIRST
        seqs = [_SEQ_FIRST + next(self._seq) % span for _ in requests]
        return self._raw(owner).batch(msg_type, requests, seqs)

    def dumps(
        self, owner: Any, msg_type: int, payloads: Sequence[bytes]
    ) -> list[list[bytes] | int]:
        """RawSocket.dumps on the calling thread's socket."""
        span = _SEQ_LAST - _SEQ_FIRST
        seqs = [_SEQ_FIRST + next(self._seq) % span for _ in payloads]
        return self._raw(owner).dumps(msg_type, payloads, seqs)

    def _raw(self, owner: Any) -> RawSocket:
        cached = getattr(self._local, "raw", None)
        if cached is None or cached[0] is not owner:  # a new socket for this thread
            cached = self._local.raw = (owner, RawSocket(owner.asyncore.socket))
        raw: RawSocket = cached[1]
        return raw

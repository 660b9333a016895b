"""The IPVS commands ipvsctl sends, one method each, on the calling thread's IPVS socket:
service and dest add/set/del (the dest add also many in one send, for a Service's new real
servers), the two dumps (the dest dump also many back to back, for the drain check), and
the connection timeouts.

The service and dest commands and the dumps' requests are packed by wire.py (pyroute2's
bytes, ~60x cheaper to build) and sent on pyroute2's own socket for this thread, with its
family id; answers are read until the ACK, error or end of dump, dump messages parsed by
wire.py too (pyroute2's generic decoding was most of a dump's cost), and errors go through
errors.py like every other netlink error. Only add/set/del/get/dump are used (pyroute2's
"update" sends a DELETE). A dest dump of a missing service is an empty list, not an error,
so an empty one is followed by a get. The drain check's batch of dest dumps reads the
answers' bytes for its draining real servers only (wire.find_dests). The timeouts go
through pyroute2's own request path
(rare, and pyroute2 has no wrapper for them to bypass).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from pyroute2.netlink import NLM_F_ACK, NLM_F_REQUEST

from ipvsctl.kernel.netlink import wire
from ipvsctl.kernel.netlink.codec import IPVSTimeouts, timeouts_from_message, timeouts_message
from ipvsctl.kernel.netlink.errors import DestSubject, NetlinkError, errors, translate_error
from ipvsctl.kernel.netlink.raw import RawRequests
from ipvsctl.kernel.netlink.sockets import Sockets, get_config
from ipvsctl.kernel.port import KernelError, KernelNotFound
from ipvsctl.model import RealServerKey, RealServerStatus, ServiceKey, ServiceStats, VirtualServer
from ipvsctl.obs.logging import FailureStreaks

log = logging.getLogger("ipvsctl.kernel")

# Requests in one send: each failure's answer echoes its request (~150 bytes), so even a
# batch that fails whole stays far below a socket's receive buffer (~200 KB).
BATCH_SIZE = 128


class IPVSCalls:
    """IPVS over generic netlink. Errors come out as KernelErrors (errors.py).
    `on_answers_lost(n)`: a batch lost the answers of n requests (each reported failed)."""

    def __init__(
        self, sockets: Sockets, on_answers_lost: Callable[[int], object] | None = None
    ) -> None:
        self.sockets = sockets
        self._raw = RawRequests()
        self.on_answers_lost = on_answers_lost
        self._lost = FailureStreaks(log)

    def _ipvs(self) -> Any:
        return self.sockets.ipvs()

    def _send(self, request: wire.Request) -> list[bytes]:
        ipvs = self._ipvs()
        return self._raw.send(ipvs, ipvs.prid, request)

    # --- reads ------------------------------------------------------------------------
    def list_virtual_servers(self) -> list[VirtualServer]:
        with errors("list_virtual_servers"):
            found = [wire.parse_service(m) for m in self._send(wire.dump_services())]
        # In the kernel's order, not sorted: a sort of 20,000 keys is one C call that holds
        # the GIL for ~10 ms, the audit's longest stall of the loop at 10,000 Services.
        # Who shows the table sorts it (kernel/table.py).
        return [vs for vs in found if vs is not None]

    def read_service_stats(self) -> dict[ServiceKey, ServiceStats]:
        """Every virtual server's traffic counters: the same one service dump (the kernel
        fills the stats into each service message anyway), parsed for the counters."""
        with errors("read_service_stats"):
            found = [wire.parse_service_stats(m) for m in self._send(wire.dump_services())]
        return dict(f for f in found if f is not None)

    def list_real_servers(self, key: ServiceKey) -> list[RealServerStatus]:
        with errors("list_real_servers", key):
            found = [wire.parse_dest(m, key) for m in self._send(wire.dump_dests(key))]
            # the kernel answers an empty dump for a missing service too: a get says ESRCH
            if not found:
                self._send(wire.get_service(key))
        return sorted(found, key=lambda r: r.key)

    def dump_real_servers(
        self,
        keys: Sequence[ServiceKey],
        only: Mapping[ServiceKey, Collection[RealServerKey]] | None = None,
    ) -> dict[ServiceKey, list[RealServerStatus] | KernelError | None]:
        """One dest dump per virtual server, back to back on this thread's socket (port.py's
        `dump_real_servers`). With `only`, the wanted dests are found in the answer's
        bytes by their address (wire.find_dests): the others are never parsed."""
        with errors("list_real_servers"):  # the socket itself failed: no reading at all
            ipvs = self._ipvs()
            answers = self._raw.dumps(ipvs, ipvs.prid, [wire.dump_dests(k)[1] for k in keys])
        out: dict[ServiceKey, list[RealServerStatus] | KernelError | None] = {}
        for key, answer in zip(keys, answers, strict=True):
            if isinstance(answer, int):
                out[key] = _not_found_is_none(
                    translate_error(NetlinkError(answer), "list_real_servers", str(key))
                )
                continue
            want = None if only is None else only.get(key, ())
            try:
                with errors("list_real_servers", key):
                    if want is None:
                        msgs = wire.dump_messages(answer)
                    else:
                        msgs = wire.find_dests(answer, wire.packed_addresses(want))
                    found = [wire.parse_dest(m, key) for m in msgs]
                    if not answer:  # an empty dump, also for a missing service:
                        self._send(wire.get_service(key))  # a get says ESRCH
            except KernelError as exc:
                out[key] = _not_found_is_none(exc)
                continue
            out[key] = sorted(
                (r for r in found if want is None or r.key in want), key=lambda r: r.key
            )
        return out

    # --- writes -----------------------------------------------------------------------
    def add_service(self, vs: VirtualServer) -> None:
        with errors("add_virtual_server", vs.key, scheduler=vs.scheduler):
            self._send(wire.new_service(vs))

    def set_service(self, vs: VirtualServer) -> None:
        with errors("update_virtual_server", vs.key, scheduler=vs.scheduler):
            self._send(wire.set_service(vs))

    def delete_service(self, key: ServiceKey) -> None:
        with errors("delete_virtual_server", key):
            self._send(wire.del_service(key))

    def add_dest(self, key: ServiceKey, rs: RealServerKey, weight: int) -> None:
        with errors("add_real_server", DestSubject(key, rs)):
            self._send(wire.new_dest(key, rs, weight))

    def add_dests(
        self, key: ServiceKey, real_servers: Sequence[RealServerKey], weight: int
    ) -> list[KernelError | None]:
        """add_dest for each, BATCH_SIZE to a send (raw.py's batch): the error of each,
        None for one added. One that cannot be packed fails alone; a failed socket fails
        its batch and the rest (raised when it was the first: none is known added)."""
        ipvs = self._ipvs()
        out: list[KernelError | None] = [None] * len(real_servers)
        for start in range(0, len(real_servers), BATCH_SIZE):
            sent: list[int] = []  # indexes into real_servers, in the batch's order
            requests: list[wire.Request] = []
            for i in range(start, min(start + BATCH_SIZE, len(real_servers))):
                try:
                    with errors("add_real_server", DestSubject(key, real_servers[i])):
                        requests.append(wire.new_dest(key, real_servers[i], weight))
                    sent.append(i)
                except KernelError as exc:
                    out[i] = exc
            if not requests:
                continue
            try:
                with errors("add_real_server", key):
                    codes, lost = self._raw.batch(ipvs, ipvs.prid, requests)
            except KernelError as exc:
                if start == 0:
                    raise
                out[start:] = [exc] * (len(real_servers) - start)
                return out
            if lost:
                # Unknown whether those were made: each is a failure (the Service stays
                # dirty; the retry's add of one that was made finds it and keeps it).
                if self.on_answers_lost is not None:
                    self.on_answers_lost(lost)
                self._lost.failed(
                    logging.WARNING,
                    "netlink answers lost, those adds reported failed",
                    vs=key,
                    unanswered=lost,
                    sent=len(requests),
                )
            else:
                self._lost.recovered(None)
            for i, code in zip(sent, codes, strict=True):
                if code:
                    subject = str(DestSubject(key, real_servers[i]))
                    out[i] = translate_error(NetlinkError(code), "add_real_server", subject)
        return out

    def set_dest(self, key: ServiceKey, rs: RealServerKey, weight: int) -> None:
        with errors("set_real_server_weight", DestSubject(key, rs)):
            self._send(wire.set_dest(key, rs, weight))

    def delete_dest(self, key: ServiceKey, rs: RealServerKey) -> None:
        with errors("delete_real_server", DestSubject(key, rs)):
            self._send(wire.del_dest(key, rs))

    # --- connection timeouts ----------------------------------------------------------
    def get_timeouts(self) -> IPVSTimeouts:
        with errors("get_timeouts"):
            return timeouts_from_message(get_config(self._ipvs()))

    def set_timeouts(self, tcp: int = 0, tcpfin: int = 0, udp: int = 0) -> None:
        """Set the IPVS connection timeouts in seconds; 0 leaves that one as it is (a raw
        IPVS_CMD_SET_CONFIG message: pyroute2 has no wrapper)."""
        msg = timeouts_message(tcp, tcpfin, udp)
        if msg is None:
            return
        ipvs = self._ipvs()
        with errors("set_timeouts"):
            list(ipvs.nlm_request(msg, msg_type=ipvs.prid, msg_flags=NLM_F_REQUEST | NLM_F_ACK))


def _not_found_is_none(exc: KernelError) -> KernelError | None:
    return None if isinstance(exc, KernelNotFound) else exc

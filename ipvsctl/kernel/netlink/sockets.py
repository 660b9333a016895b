"""pyroute2's netlink sockets for one NetlinkKernel: an IPVS (generic netlink) and an
IPRoute (rtnetlink) socket per calling thread, opened lazily and closed together.

A sync pyroute2 object keeps its event loop and socket per thread, so each thread gets its
own objects on first use. `netns=NAME` opens every socket inside /run/netns/NAME (pyroute2
forks a child that enters the namespace, creates the socket and hands it back); the lab
tests drive throwaway network namespaces that way.
"""

from __future__ import annotations

import errno
import logging
import threading
from collections.abc import Callable
from typing import Any

from pyroute2 import IPVS, IPRoute, NetlinkError
from pyroute2.netlink import NLM_F_REQUEST
from pyroute2.netlink.generic import ipvs as genl_ipvs

from ipvsctl.kernel.netlink.errors import errors, translate_error
from ipvsctl.kernel.port import KernelPermissionDenied, KernelUnavailable

log = logging.getLogger("ipvsctl.kernel")


def get_config(ipvs: IPVS) -> Any:
    """IPVS_CMD_GET_CONFIG's reply (the timeouts): the cheapest IPVS command, and like every
    one it needs CAP_NET_ADMIN."""
    msg = genl_ipvs.ipvsmsg()
    msg["cmd"] = genl_ipvs.IPVS_CMD_GET_CONFIG
    msg["version"] = genl_ipvs.GENL_VERSION
    replies = list(ipvs.nlm_request(msg, msg_type=ipvs.prid, msg_flags=NLM_F_REQUEST))
    return replies[0]


class Sockets:
    """Per-thread pyroute2 sockets. The factories default to pyroute2's classes; devkit's
    netlink model (devkit/fakenetlink.py) passes its own."""

    def __init__(
        self,
        netns: str | None = None,
        *,
        ipvs_factory: Callable[..., Any] = IPVS,
        iproute_factory: Callable[..., Any] = IPRoute,
    ) -> None:
        self.netns = netns
        self._ipvs_factory = ipvs_factory
        self._iproute_factory = iproute_factory
        self._local = threading.local()
        self._opened: list[Any] = []
        self._opened_lock = threading.Lock()

    def kwargs(self) -> dict[str, Any]:
        """What every pyroute2 socket of this kernel is opened with."""
        # flags=0: never create the namespace (pyroute2's default is O_CREAT)
        return {"netns": self.netns, "flags": 0} if self.netns else {}

    def ipvs(self) -> Any:
        sock = getattr(self._local, "ipvs", None)
        if sock is None:
            sock = self._local.ipvs = self._remember(self._open_ipvs())
        return sock

    def iproute(self) -> Any:
        ipr = getattr(self._local, "iproute", None)
        if ipr is None:
            with errors("open", "rtnetlink"):
                ipr = self._local.iproute = self._remember(self._iproute_factory(**self.kwargs()))
        return ipr

    def close(self) -> None:
        with self._opened_lock:
            opened, self._opened = self._opened, []
        for sock in opened:
            try:
                sock.close()
            except Exception:  # closing must not raise
                log.debug("close failed", exc_info=True)
        self._local = threading.local()

    def _remember(self, sock: Any) -> Any:
        with self._opened_lock:
            self._opened.append(sock)
        return sock

    def _open_ipvs(self) -> Any:
        try:
            sock = self._ipvs_factory(**self.kwargs())
        except NetlinkError as exc:
            if exc.code == errno.ENOENT:  # generic netlink has no "IPVS" family
                raise KernelUnavailable(
                    "IPVS is not available in this kernel: load it with `modprobe ip_vs` "
                    "(and the schedulers, e.g. ip_vs_rr) on the host",
                    "open",
                ) from exc
            raise translate_error(exc, "open", "IPVS") from exc
        except OSError as exc:
            raise translate_error(exc, "open", "IPVS") from exc
        try:
            get_config(sock)  # every IPVS command needs CAP_NET_ADMIN: fail now if missing
        except NetlinkError as exc:
            sock.close()
            if exc.code in (errno.EPERM, errno.EACCES):
                raise KernelPermissionDenied(
                    "IPVS needs CAP_NET_ADMIN: run as root or with the NET_ADMIN capability",
                    "open",
                ) from exc
            raise translate_error(exc, "open", "IPVS") from exc
        return sock

"""Prototype of the flush detection, and its cost (research for the table guard):

- the IPVS table: a get of one virtual server the daemon programmed (IPVS has no
  notifications; a get is a hash lookup in the kernel, whatever the table's size), where
  the alternative is a dump of the whole table;
- the dummy interface and its addresses: rtnetlink's link and address notifications
  (RTM_DELLINK / RTM_DELADDR), free while nothing changes;
- the nftables table: the ruleset's generation (NFT_MSG_GETGEN, one small message) and,
  only when it moved, a get of the table (NFT_MSG_GETTABLE).

    .venv/bin/python -m tests.lab.boot --run 'python -m devkit.flushprobe'   (VM: all three)
    .venv/bin/python -m devkit.flushprobe --host                             (host: no IPVS)

Prints JSON lines (and appends them to $IPVSCTL_LAB_OUT/flushprobe.jsonl in the VM).
"""

from __future__ import annotations

import errno
import json
import os
import select
import socket
import struct
import sys
import threading
import time
from typing import Any

NETLINK_NETFILTER = 12
NFNL_SUBSYS_NFTABLES = 10
NFT_MSG_GETTABLE, NFT_MSG_GETGEN, NFT_MSG_NEWGEN = 1, 16, 15
NFTA_TABLE_NAME, NFTA_TABLE_USE, NFTA_TABLE_HANDLE = 1, 3, 4
NFTA_GEN_ID = 1
NFPROTO_UNSPEC, NFPROTO_INET = 0, 1
NLM_F_REQUEST, NLM_F_ACK = 1, 4
NLMSG_ERROR = 2
RTMGRP_LINK, RTMGRP_IPV4_IFADDR, RTMGRP_IPV6_IFADDR = 0x1, 0x10, 0x100
RTM_DELLINK, RTM_DELADDR = 17, 21

_HDR = struct.Struct("=IHHII")
_NFGEN = struct.Struct("=BBH")


def _attrs(data: bytes, i: int) -> dict[int, bytes]:
    out = {}
    while i + 4 <= len(data):
        length, kind = struct.unpack_from("=HH", data, i)
        if length < 4:
            break
        out[kind & 0x3FFF] = data[i + 4 : i + length]
        i += (length + 3) & ~3
    return out


class NftProbe:
    """Generation and table gets on one nfnetlink socket."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        self.sock.bind((0, 0))
        self.seq = 0

    def _ask(self, msg: int, family: int, attrs: bytes = b"") -> bytes:
        self.seq += 1
        body = _NFGEN.pack(family, 0, 0) + attrs
        kind = (NFNL_SUBSYS_NFTABLES << 8) | msg
        self.sock.send(_HDR.pack(16 + len(body), kind, NLM_F_REQUEST, self.seq, 0) + body)
        while True:
            data = self.sock.recv(65536)
            length, kind, _flags, seq, _pid = _HDR.unpack_from(data, 0)
            if seq != self.seq:
                continue
            if kind == NLMSG_ERROR:
                code = -struct.unpack_from("=i", data, 16)[0]
                if code:
                    raise OSError(code, os.strerror(code))
                continue
            return data[:length]

    def generation(self) -> int:
        msg = self._ask(NFT_MSG_GETGEN, NFPROTO_UNSPEC)
        return int.from_bytes(_attrs(msg, 20)[NFTA_GEN_ID], "big")

    def table(self, name: str, family: int = NFPROTO_INET) -> tuple[int, int] | None:
        """(handle, use) of the table, None if it does not exist."""
        name_attr = name.encode() + b"\0"
        nla = struct.pack("=HH", 4 + len(name_attr), NFTA_TABLE_NAME) + name_attr
        nla += b"\0" * ((-len(nla)) % 4)
        try:
            msg = self._ask(NFT_MSG_GETTABLE, family, nla)
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                return None
            raise
        a = _attrs(msg, 20)
        return int.from_bytes(a[NFTA_TABLE_HANDLE], "big"), int.from_bytes(a[NFTA_TABLE_USE], "big")


class LinkEvents:
    """rtnetlink link and address notifications: (kind, ifindex) of each deletion."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)
        self.sock.bind((0, RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR))
        self.sock.setblocking(False)

    def wait(self, timeout: float) -> list[tuple[str, int]]:
        out: list[tuple[str, int]] = []
        if not select.select([self.sock], [], [], timeout)[0]:
            return out
        while True:
            try:
                data = self.sock.recv(65536)
            except BlockingIOError:
                return out
            i = 0
            while i + 16 <= len(data):
                length, kind = struct.unpack_from("=IH", data, i)
                if kind == RTM_DELLINK:
                    out.append(("link", struct.unpack_from("=i", data, i + 20)[0]))
                elif kind == RTM_DELADDR:
                    out.append(("address", struct.unpack_from("=I", data, i + 20)[0]))
                i += (length + 3) & ~3


def report(name: str, **values: Any) -> None:
    row = {
        "probe": name,
        "kernel": os.uname().release,
        "where": os.environ.get("FLUSHPROBE_WHERE", ""),
        **values,
    }
    print(json.dumps(row), flush=True)
    out = os.environ.get("IPVSCTL_LAB_OUT")
    if out:
        with open(os.path.join(out, "flushprobe.jsonl"), "a") as f:
            f.write(json.dumps(row) + "\n")


def per_call(fn: Any, n: int) -> float:
    """Mean seconds of CPU (this thread) per call."""
    t = time.thread_time()
    for _ in range(n):
        fn()
    return (time.thread_time() - t) / n


def idle_cpu(tick: float, seconds: float, step: Any, events: LinkEvents) -> dict[str, float]:
    """CPU of a guard thread that waits for link events `tick` at a time and runs `step`
    after each wait: the idle cost, as a fraction of one core."""
    result: dict[str, float] = {}

    def run() -> None:
        t_cpu, t_wall, ticks = time.thread_time(), time.monotonic(), 0
        while time.monotonic() - t_wall < seconds:
            events.wait(tick)
            step()
            ticks += 1
        cpu, wall = time.thread_time() - t_cpu, time.monotonic() - t_wall
        result.update(
            cpu_s=round(cpu, 4),
            wall_s=round(wall, 2),
            ticks=ticks,
            core_fraction=round(cpu / wall, 6),
        )

    th = threading.Thread(target=run)
    th.start()
    th.join()
    return result


def host() -> None:
    """What runs on the host (no IPVS here): the nftables and rtnetlink parts."""
    nft, events = NftProbe(), LinkEvents()
    os.system("nft add table inet flushprobe")
    try:
        report(
            "nft-calls",
            generation_s=per_call(nft.generation, 5000),
            table_s=per_call(lambda: nft.table("flushprobe"), 5000),
        )

        def step() -> None:
            nft.generation()

        report("idle-no-ipvs", tick_s=0.25, **idle_cpu(0.25, 30, step, events))
    finally:
        os.system("nft delete table inet flushprobe")


def vm(services: int = 10_000) -> None:
    from devkit.labkit import Node, sh
    from ipvsctl.kernel.port import KernelNotFound
    from ipvsctl.model import Protocol, ServiceKey

    node = Node()
    try:
        rules = "".join(
            f"-A -t 10.{96 + i // 65536}.{i // 256 % 256}.{i % 256}:80 -s rr\n"
            for i in range(services)
        )
        t = time.monotonic()
        sh("ipvsadm", "-R", netns=node.name, stdin=rules)
        report("table-built", services=services, seconds=round(time.monotonic() - t, 2))
        from ipvsctl.kernel.netlink import wire
        from ipvsctl.kernel.netns import run_in_netns

        kernel = node.kernel
        key = ServiceKey(Protocol.TCP, "10.96.0.5", 80)

        from pyroute2 import NetlinkError

        def get() -> bool:
            try:
                kernel._calls._send(wire.get_service(key))
                return True
            except (KernelNotFound, NetlinkError):
                return False

        nft, events = run_in_netns(node.name, lambda: (NftProbe(), LinkEvents()))
        sh("nft", "add", "table", "inet", "ipvsctl", netns=node.name)
        assert get()
        t_dump = time.monotonic()
        c_dump = time.thread_time()
        n = len(kernel.list_virtual_servers())
        report(
            "calls",
            services=n,
            ipvs_get_s=per_call(get, 2000),
            nft_generation_s=per_call(nft.generation, 2000),
            nft_table_s=per_call(lambda: nft.table("ipvsctl"), 2000),
            full_dump_cpu_s=round(time.thread_time() - c_dump, 4),
            full_dump_wall_s=round(time.monotonic() - t_dump, 4),
        )

        def step() -> None:
            get()
            nft.generation()

        for tick in (0.25, 0.5):
            report("idle", services=n, tick_s=tick, **idle_cpu(tick, 30, step, events))

        # detection: a guard thread at 0.25 s ticks; the flush as kube-proxy's cleanup
        seen: dict[str, float] = {}
        stop = threading.Event()
        gen0 = nft.generation()

        def guard() -> None:
            while not stop.is_set():
                for kind, _index in events.wait(0.25):
                    seen.setdefault(kind, time.monotonic())
                if not get():
                    seen.setdefault("ipvs", time.monotonic())
                if nft.generation() != gen0 and nft.table("ipvsctl") is None:
                    seen.setdefault("nftables", time.monotonic())

        th = threading.Thread(target=guard)
        th.start()
        time.sleep(1.0)
        t0 = time.monotonic()
        sh("ipvsadm", "-C", netns=node.name)
        t_clear = time.monotonic()
        sh("ip", "link", "del", "kube-ipvs0", netns=node.name)
        t_link = time.monotonic()
        sh("nft", "delete", "table", "inet", "ipvsctl", netns=node.name)
        t_nft = time.monotonic()
        time.sleep(1.0)
        stop.set()
        th.join()
        report(
            "detection",
            services=n,
            tick_s=0.25,
            ipvs_after_clear_s=round(seen.get("ipvs", float("nan")) - t_clear, 3),
            link_after_delete_s=round(seen.get("link", float("nan")) - t_link, 3),
            nft_after_delete_s=round(seen.get("nftables", float("nan")) - t_nft, 3),
            commands_s=round(t_nft - t0, 3),
        )
    finally:
        node.close()


if __name__ == "__main__":
    if "--host" in sys.argv:
        host()
    else:
        vm(int(sys.argv[1]) if len(sys.argv) > 1 else 10_000)

"""A conntrack entry as ipvsctl sees it: the original tuple (which names the entry when it is
deleted) and the reply's source, which says who answered: what kube-proxy's
CleanStaleEntries reads (original destination, reply source address) and what a removed
real server's flush matches (its address and port)."""

from __future__ import annotations

from dataclasses import dataclass

from ipvsctl.model.keys import Protocol, _hostport


@dataclass(frozen=True, slots=True, order=True)
class ConntrackEntry:
    protocol: Protocol
    orig_src: str
    orig_sport: int
    orig_dst: str  # the address the client sent to: a Service address for ours
    orig_dport: int
    reply_src: str  # who answers: the real server after IPVS NAT, the VIP itself before
    reply_sport: int

    @property
    def ipv6(self) -> bool:
        return ":" in self.orig_dst

    def __str__(self) -> str:
        return (
            f"{_hostport(self.orig_src, self.orig_sport)} -> "
            f"{_hostport(self.orig_dst, self.orig_dport)}/{self.protocol.value} "
            f"reply from {self.reply_src}"
        )

"""The handover to another proxy (CONTRACT.md "Beside another proxy"): `POST /v1/handover`
asks it, `GET /v1/handover` says how far it is (`ipvsctl handover [--wait]`). Once asked, the
daemon adds nothing new to the kernel (it still restores what it holds), reads the
connections through its virtual servers in the background, and when none is left removes
everything it owns and stays idle until restarted. The running part is
reconcile/handover.py, the rule plan/handover.py.

Who may ask: only a process on this node (the POST is an action: the HTTP server answers it
to loopback peers, and to a node address only with the daemon's action token from its state
dir: a pod's masqueraded connection can come from a node address, but cannot read the
token); the state answers this node's clients only."""

from __future__ import annotations

from ipvsctl.daemon.feature import Feature, Parts
from ipvsctl.httpd import as_json
from ipvsctl.reconcile.handover import Handover
from ipvsctl.reconcile.paced import Pace, PacedRunner

ROUTE = "/v1/handover"


def feature(p: Parts) -> Feature:
    interval = p.loop.config.drain_check_interval
    handover = Handover(p.loop.engine, p.kernel, p.metrics, p.clock, p.loop.lock, interval=interval)
    # a poll: Handover paces its own reads, and reads nothing until asked
    reader = PacedRunner("handover", handover, p.loop.lock, Pace(every=interval), clock=p.clock)

    def ask(q: dict[str, list[str]]) -> tuple[int, str, bytes]:
        code, state = handover.ask()
        reader.wake.set()  # the first reading now, not at the next poll
        return as_json(code, state.to_json())

    return Feature(
        "handover",
        part=handover,
        readers=(reader,),
        # no lock: the answer is made of plain attributes
        routes={ROUTE: lambda q: as_json(200, handover.state().to_json())},
        local_only=frozenset({ROUTE}),
        actions={ROUTE: ask},
    )

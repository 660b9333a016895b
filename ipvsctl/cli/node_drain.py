"""`ipvsctl node-drain`: this node's drain state for load balancers, from the local daemon's
`/v1/node-quiesced`, and with `--wait` the wait for it to be quiesced (docs/node-drain.md).

It needs no Kubernetes credentials: it only asks the daemon's HTTP port, so a lifecycle hook
(a cloud instance-termination script, a DaemonSet pod's `kubectl exec`) can run it on the
node. While waiting, a daemon that does not answer (restarting) or a node not draining yet
(the taint on its way) is waited for too, until the timeout.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable
from typing import Annotated, Any

import typer

from ipvsctl.cli.daemon_ask import (
    DEFAULT_ENDPOINT,
    Answer,
    Endpoint,
    Timeout,
    ask,
    duration,
    echo_progress,
    endpoint_url,
    show,
    wait_until,
)

__all__ = ["Answer", "describe", "fetch_node_state", "register", "wait_quiesced"]

PATH = "/v1/node-quiesced"


def fetch_node_state(endpoint: str, timeout: float = 3.0) -> Answer:
    return ask(
        endpoint,
        urllib.request.Request(endpoint.rstrip("/") + PATH),
        refusals={
            403: (f"{endpoint} answers only its own node's clients (403)", True),
            404: (f"{endpoint} has no {PATH} (not ipvsctl?)", True),
        },
        valid=lambda doc: isinstance(doc.get("quiesced"), bool),
        what="node drain answer",
        timeout=timeout,
    )


def describe(doc: dict[str, Any]) -> str:
    """One line: `quiesced`, or what it still waits for."""
    established = doc.get("established")
    conns = "not read yet" if established is None else str(established)
    if not doc.get("draining"):
        return f"not draining (health 200); established {conns}"
    reasons = ",".join(map(str, doc.get("reasons") or ())) or "?"
    head = (
        f"draining ({reasons}) for {float(doc.get('unhealthy_for') or 0):.0f}s"
        f" of {float(doc.get('lb_grace') or 0):g}s grace; established {conns}"
    )
    return f"{head}; {'quiesced' if doc.get('quiesced') else 'not quiesced'}"


def wait_quiesced(
    fetch: Callable[[], Answer],
    *,
    timeout: float,
    interval: float,
    echo: Callable[[str], None],
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    if_draining: bool = False,
) -> int:
    """0 once the daemon answers quiesced (with `if_draining`, also as soon as it answers
    that the node is not draining), 1 at the timeout (or at an error that waiting cannot
    mend)."""
    return wait_until(
        fetch,
        lambda doc: bool(doc["quiesced"] or (if_draining and not doc.get("draining"))),
        describe,
        not_yet="not quiesced",
        timeout=timeout,
        interval=interval,
        echo=echo,
        clock=clock,
        sleep=sleep,
    )


def register(app: typer.Typer) -> None:
    @app.command("node-drain")
    def node_drain(
        wait: Annotated[
            bool,
            typer.Option(
                "--wait",
                help="Wait until the node is quiesced (draining for --lb-grace, no "
                "connection established through its NodePorts, load-balancer and external "
                "IPs): exit 0 then, 1 at --timeout.",
            ),
        ] = False,
        timeout: Timeout = "10m",
        endpoint: Endpoint = DEFAULT_ENDPOINT,
        if_draining: Annotated[
            bool,
            typer.Option(
                "--if-draining",
                help="With --wait: exit 0 at once when the node is not draining (a preStop "
                "hook that must not hold up a rollout).",
            ),
        ] = False,
    ) -> None:
        """This node's drain state for load balancers; --wait: until it is safe to go."""
        url = endpoint_url(endpoint)
        seconds = duration("--timeout", timeout)
        if not wait:
            show(fetch_node_state(url), describe)
        raise typer.Exit(
            wait_quiesced(
                lambda: fetch_node_state(url),
                timeout=seconds,
                interval=1.0,
                echo=echo_progress,
                if_draining=if_draining,
            )
        )

"""`ipvsctl handover`: hand this node over to another proxy without a cut (CONTRACT.md
"Beside another proxy"; docs/migrating-from-kube-proxy.md, "Leaving ipvsctl").

It asks the node's daemon (`POST /v1/handover`, which the daemon takes only from this node:
loopback, or a node address showing the daemon's action token, which it reads from the
daemon's state dir; run it on the node, `kubectl exec` into ipvsctl's pod) and prints how
far it is; with
`--wait` it waits until the daemon has handed the node over (no connection left through
its virtual servers, everything it owned removed). A daemon that restarted meanwhile
serves again: the wait asks it again.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable
from typing import Annotated, Any

import typer

from ipvsctl.cli import daemon_ask
from ipvsctl.cli.daemon_ask import (
    DEFAULT_ENDPOINT,
    Answer,
    Endpoint,
    Timeout,
    duration,
    echo_progress,
    endpoint_url,
    show,
    wait_until,
)
from ipvsctl.daemon.options import DEFAULTS
from ipvsctl.persist.action_token import TOKEN_HEADER, read_token

PATH = "/v1/handover"


def call(endpoint: str, *, ask: bool, token: str | None = None, timeout: float = 3.0) -> Answer:
    """The daemon's handover state; with `ask`, after asking for the handover (showing
    `token`, the daemon's action token, when there is one)."""
    url = endpoint.rstrip("/") + PATH
    req = urllib.request.Request(url, data=b"" if ask else None, method="POST" if ask else "GET")
    if ask and token:
        req.add_header(TOKEN_HEADER, token)
    missing = (f"{endpoint} has no {PATH} (not ipvsctl, or an older one?)", True)
    return daemon_ask.ask(
        endpoint,
        req,
        refusals={
            # not ready: its first sync is not done (worth waiting for)
            503: (f"{endpoint}: not ready yet (no first sync to hand over)", False),
            403: (
                f"{endpoint} takes a handover only from its node (loopback, or a node "
                "address with the action token of its --state-dir)",
                True,
            ),
            404: missing,
            405: missing,
        },
        valid=lambda doc: isinstance(doc.get("phase"), str),
        what="handover answer",
        timeout=timeout,
    )


def describe(doc: dict[str, Any]) -> str:
    phase = doc.get("phase")
    if phase == "handed_over":
        return "handed over: ipvsctl removed everything it owned and is idle"
    if phase == "serving":
        return "serving (no handover asked)"
    established, closing = doc.get("established"), doc.get("closing")
    conns = (
        "connections not read yet"
        if established is None
        else f"open connections: {established} established, {closing} closing"
    )
    return (
        f"handing over for {float(doc.get('asked_for') or 0):.0f}s, adding nothing new; "
        f"{conns}; {doc.get('virtual_servers')} virtual servers"
    )


def wait_handed_over(
    fetch: Callable[[bool], Answer],
    *,
    timeout: float,
    interval: float,
    echo: Callable[[str], None],
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """0 once the daemon answers handed over, 1 at the timeout or at an error waiting
    cannot mend. `fetch(ask)`: the state, asking first when `ask`: at the start, and again
    whenever the daemon answers serving (it restarted) or did not answer."""
    asking = True

    def next_answer() -> Answer:
        nonlocal asking
        answer = fetch(asking)
        asking = answer.doc is None or answer.doc.get("phase") == "serving"
        return answer

    return wait_until(
        next_answer,
        lambda doc: doc.get("phase") == "handed_over",
        describe,
        not_yet="not handed over",
        timeout=timeout,
        interval=interval,
        echo=echo,
        clock=clock,
        sleep=sleep,
    )


def register(app: typer.Typer) -> None:
    @app.command("handover")
    def handover(
        wait: Annotated[
            bool,
            typer.Option(
                "--wait",
                help="Wait until the node is handed over (no connection left through "
                "ipvsctl's virtual servers, everything it owned removed): exit 0 then, 1 at "
                "--timeout.",
            ),
        ] = False,
        timeout: Timeout = "10m",
        endpoint: Endpoint = DEFAULT_ENDPOINT,
        state_dir: Annotated[
            str,
            typer.Option(
                "--state-dir",
                metavar="DIR",
                help="The daemon's --state-dir: its action token, shown when the daemon is "
                "asked from a node address rather than loopback.",
            ),
        ] = DEFAULTS.state_dir,
    ) -> None:
        """Hand this node over to another proxy: add nothing new, remove everything once
        the last connection through ipvsctl ended."""
        url = endpoint_url(endpoint)
        seconds = duration("--timeout", timeout)
        token = read_token(state_dir)
        if not wait:
            show(call(url, ask=True, token=token), describe)
        raise typer.Exit(
            wait_handed_over(
                lambda asking: call(url, ask=asking, token=token),
                timeout=seconds,
                interval=1.0,
                echo=echo_progress,
            )
        )

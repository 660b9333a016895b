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

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Annotated, Any

import typer

from ipvsctl.cli.node_drain import DEFAULT_ENDPOINT, PROGRESS_EVERY, Answer, _duration, _endpoint
from ipvsctl.cli.params import ENDPOINT_ENV
from ipvsctl.daemon.options import DEFAULTS
from ipvsctl.httpd import direct_opener
from ipvsctl.persist.action_token import TOKEN_HEADER, read_token

PATH = "/v1/handover"


def call(endpoint: str, *, ask: bool, token: str | None = None, timeout: float = 3.0) -> Answer:
    """The daemon's handover state; with `ask`, after asking for the handover (showing
    `token`, the daemon's action token, when there is one)."""
    url = endpoint.rstrip("/") + PATH
    req = urllib.request.Request(url, data=b"" if ask else None, method="POST" if ask else "GET")
    if ask and token:
        req.add_header(TOKEN_HEADER, token)
    try:
        with direct_opener().open(req, timeout=timeout) as resp:
            doc = json.loads(resp.read(1 << 16))
    except urllib.error.HTTPError as exc:
        if exc.code == 503:  # not ready: its first sync is not done
            return Answer(None, f"{endpoint}: not ready yet (no first sync to hand over)")
        if exc.code == 403:
            return Answer(
                None,
                f"{endpoint} takes a handover only from its node (loopback, or a node address "
                "with the action token of its --state-dir)",
                True,
            )
        if exc.code in (404, 405):
            return Answer(None, f"{endpoint} has no {PATH} (not ipvsctl, or an older one?)", True)
        return Answer(None, f"{endpoint}: HTTP {exc.code}")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return Answer(None, f"daemon not reachable at {endpoint}: {reason}")
    if not isinstance(doc, dict) or not isinstance(doc.get("phase"), str):
        return Answer(None, f"{endpoint}: not a handover answer", True)
    return Answer(doc)


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
    cannot mend. `fetch(ask)`: the state, asking first when `ask`. Asks again whenever the
    daemon answers serving (it restarted). A progress line when the state changes, and
    every PROGRESS_EVERY."""
    deadline = clock() + timeout
    last_line, last_at = "", float("-inf")
    ask = True
    while True:
        answer = fetch(ask)
        doc = answer.doc
        ask = doc is None or doc.get("phase") == "serving"
        line = answer.error or describe(doc or {})
        now = clock()
        if doc is not None and doc.get("phase") == "handed_over":
            echo(line)
            return 0
        if answer.final:
            echo(f"ipvsctl: {line}")
            return 1
        if line != last_line or now - last_at >= PROGRESS_EVERY:
            echo(f"waiting: {line}")
            last_line, last_at = line, now
        if now >= deadline:
            echo(f"ipvsctl: not handed over after {timeout:g}s: {line}")
            return 1
        sleep(max(0.0, min(interval, deadline - now)))


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
        timeout: Annotated[
            str,
            typer.Option(
                "--timeout", metavar="DURATION", help="Longest wait (seconds or 10m, 1h...)."
            ),
        ] = "10m",
        endpoint: Annotated[
            str,
            typer.Option(
                "--endpoint",
                metavar="URL",
                envvar=ENDPOINT_ENV,
                help="The node's daemon (a URL, or HOST:PORT).",
            ),
        ] = DEFAULT_ENDPOINT,
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
        url = _endpoint(endpoint)
        seconds = _duration("--timeout", timeout)
        token = read_token(state_dir)
        if not wait:
            answer = call(url, ask=True, token=token)
            if answer.doc is None:
                typer.echo(f"ipvsctl: {answer.error}", err=True)
                raise typer.Exit(1)
            typer.echo(describe(answer.doc))
            raise typer.Exit(0)
        raise typer.Exit(
            wait_handed_over(
                lambda ask: call(url, ask=ask, token=token),
                timeout=seconds,
                interval=1.0,
                echo=lambda line: typer.echo(line, err=line.startswith("ipvsctl: ")),
            )
        )

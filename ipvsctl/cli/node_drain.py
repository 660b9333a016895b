"""`ipvsctl node-drain`: this node's drain state for load balancers, from the local daemon's
`/v1/node-quiesced`, and with `--wait` the wait for it to be quiesced (docs/node-drain.md).

It needs no Kubernetes credentials: it only asks the daemon's HTTP port, so a lifecycle hook
(a cloud instance-termination script, a DaemonSet pod's `kubectl exec`) can run it on the
node. While waiting, a daemon that does not answer (restarting) or a node not draining yet
(the taint on its way) is waited for too, until the timeout.
"""

from __future__ import annotations

import json
import time
import urllib.error
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

import typer

from ipvsctl.cli.params import ENDPOINT_ENV, daemon_url
from ipvsctl.httpd import direct_opener
from ipvsctl.source.duration import parse_duration

DEFAULT_ENDPOINT = "http://127.0.0.1:9796"
PROGRESS_EVERY = 10.0  # seconds between progress lines when nothing changed


@dataclass(frozen=True, slots=True)
class Answer:
    doc: dict[str, Any] | None  # the daemon's JSON; None: no answer
    error: str | None = None
    final: bool = False  # an error waiting cannot mend (refused as not local, not ipvsctl)


def fetch_node_state(endpoint: str, timeout: float = 3.0) -> Answer:
    url = endpoint.rstrip("/") + "/v1/node-quiesced"
    try:
        with direct_opener().open(url, timeout=timeout) as resp:
            doc = json.loads(resp.read(1 << 16))
    except urllib.error.HTTPError as exc:
        if exc.code == 403:
            return Answer(None, f"{endpoint} answers only its own node's clients (403)", True)
        if exc.code == 404:
            return Answer(None, f"{endpoint} has no /v1/node-quiesced (not ipvsctl?)", True)
        return Answer(None, f"{endpoint}: HTTP {exc.code}")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return Answer(None, f"daemon not reachable at {endpoint}: {reason}")
    if not isinstance(doc, dict) or not isinstance(doc.get("quiesced"), bool):
        return Answer(None, f"{endpoint}: not a node drain answer", True)
    return Answer(doc)


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
    mend). A progress line whenever the state changes, and every PROGRESS_EVERY."""
    deadline = clock() + timeout
    last_line, last_at = "", float("-inf")
    while True:
        answer = fetch()
        line = answer.error or describe(answer.doc or {})
        now = clock()
        if answer.doc is not None and (
            answer.doc["quiesced"] or (if_draining and not answer.doc.get("draining"))
        ):
            echo(line)
            return 0
        if answer.final:
            echo(f"ipvsctl: {line}")
            return 1
        if line != last_line or now - last_at >= PROGRESS_EVERY:
            echo(f"waiting: {line}")
            last_line, last_at = line, now
        if now >= deadline:
            echo(f"ipvsctl: not quiesced after {timeout:g}s: {line}")
            return 1
        sleep(max(0.0, min(interval, deadline - now)))


def _endpoint(value: str) -> str:
    try:
        return daemon_url(value)
    except ValueError as exc:
        typer.echo(f"ipvsctl: --endpoint {value}: {exc}", err=True)
        raise typer.Exit(2) from None


def _duration(flag: str, value: str) -> float:
    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        typer.echo(f"ipvsctl: {flag}: {exc}", err=True)
        raise typer.Exit(2) from None
    return seconds


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
        url = _endpoint(endpoint)
        seconds = _duration("--timeout", timeout)
        if not wait:
            answer = fetch_node_state(url)
            if answer.doc is None:
                typer.echo(f"ipvsctl: {answer.error}", err=True)
                raise typer.Exit(1)
            typer.echo(describe(answer.doc))
            raise typer.Exit(0)
        raise typer.Exit(
            wait_quiesced(
                lambda: fetch_node_state(url),
                timeout=seconds,
                interval=1.0,
                echo=lambda line: typer.echo(line, err=line.startswith("ipvsctl: ")),
                if_draining=if_draining,
            )
        )

"""Asking the node's daemon over its HTTP port, for the node-local commands (`node-drain`,
`handover`): the daemon's JSON or one line saying why not, the wait with its progress
lines, and the flags they share. Each command keeps what is its own: the path, what a
refusal means, how a state reads and when it is done."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, NoReturn

import typer

from ipvsctl.cli.params import ENDPOINT_ENV, daemon_url
from ipvsctl.httpd import direct_opener
from ipvsctl.source.duration import parse_duration

DEFAULT_ENDPOINT = "http://127.0.0.1:9796"
PROGRESS_EVERY = 10.0  # seconds between progress lines when nothing changed

Endpoint = Annotated[
    str,
    typer.Option(
        "--endpoint",
        metavar="URL",
        envvar=ENDPOINT_ENV,
        help="The node's daemon (a URL, or HOST:PORT).",
    ),
]
Timeout = Annotated[
    str,
    typer.Option("--timeout", metavar="DURATION", help="Longest wait (seconds or 10m, 1h...)."),
]


@dataclass(frozen=True, slots=True)
class Answer:
    doc: dict[str, Any] | None  # the daemon's JSON; None: no answer
    error: str | None = None
    final: bool = False  # an error waiting cannot mend (refused as not local, not ipvsctl)


def ask(
    endpoint: str,
    request: urllib.request.Request,
    *,
    refusals: Mapping[int, tuple[str, bool]],
    valid: Callable[[Any], bool],
    what: str,
    timeout: float = 3.0,
) -> Answer:
    """The daemon's answer to `request`. `refusals`: an HTTP status's line and whether it is
    final; other statuses and no answer at all are worth waiting on; a body that is not
    `valid` is not `what` (final)."""
    try:
        with direct_opener().open(request, timeout=timeout) as resp:
            doc = json.loads(resp.read(1 << 16))
    except urllib.error.HTTPError as exc:
        line, final = refusals.get(exc.code, (f"{endpoint}: HTTP {exc.code}", False))
        return Answer(None, line, final)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return Answer(None, f"daemon not reachable at {endpoint}: {reason}")
    if not isinstance(doc, dict) or not valid(doc):
        return Answer(None, f"{endpoint}: not a {what}", True)
    return Answer(doc)


def wait_until(
    fetch: Callable[[], Answer],
    done: Callable[[dict[str, Any]], bool],
    describe: Callable[[dict[str, Any]], str],
    *,
    not_yet: str,
    timeout: float,
    interval: float,
    echo: Callable[[str], None],
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """0 once an answer is `done`, 1 at the timeout (`ipvsctl: <not_yet> after Ns: ...`) or
    at an error waiting cannot mend. A progress line whenever the state changes, and every
    PROGRESS_EVERY."""
    deadline = clock() + timeout
    last_line, last_at = "", float("-inf")
    while True:
        answer = fetch()
        line = answer.error or describe(answer.doc or {})
        now = clock()
        if answer.doc is not None and done(answer.doc):
            echo(line)
            return 0
        if answer.final:
            echo(f"ipvsctl: {line}")
            return 1
        if line != last_line or now - last_at >= PROGRESS_EVERY:
            echo(f"waiting: {line}")
            last_line, last_at = line, now
        if now >= deadline:
            echo(f"ipvsctl: {not_yet} after {timeout:g}s: {line}")
            return 1
        sleep(max(0.0, min(interval, deadline - now)))


def endpoint_url(value: str) -> str:
    """--endpoint's URL, or exit 2 with the reason."""
    try:
        return daemon_url(value)
    except ValueError as exc:
        typer.echo(f"ipvsctl: --endpoint {value}: {exc}", err=True)
        raise typer.Exit(2) from None


def duration(flag: str, value: str) -> float:
    """A duration flag's seconds, or exit 2 with the reason."""
    try:
        return parse_duration(value)
    except ValueError as exc:
        typer.echo(f"ipvsctl: {flag}: {exc}", err=True)
        raise typer.Exit(2) from None


def show(answer: Answer, describe: Callable[[dict[str, Any]], str]) -> NoReturn:
    """One answer printed: its state (exit 0) or why there is none (exit 1)."""
    if answer.doc is None:
        typer.echo(f"ipvsctl: {answer.error}", err=True)
        raise typer.Exit(1)
    typer.echo(describe(answer.doc))
    raise typer.Exit(0)


def echo_progress(line: str) -> None:
    """A wait's line: its failures to stderr, its progress to stdout."""
    typer.echo(line, err=line.startswith("ipvsctl: "))

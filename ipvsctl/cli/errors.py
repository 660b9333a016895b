"""How a command fails: one line, and the exit code (2: bad flags; 1: could not start)."""

from __future__ import annotations

import re

import typer

# The validator's words for a value typer itself checked (a choice, a number, a range), as
# ipvsctl says its own: "Value error, 'x' is not one of ..." is pydantic's voice.
_PLAIN = (
    (re.compile(r"^Value error, "), ""),
    (re.compile(r"^Input should be a valid integer.*$"), "not a whole number"),
    (re.compile(r"^Input should be a valid number.*$"), "not a number"),
    (re.compile(r"^Input should be less than or equal to "), "at most "),
    (re.compile(r"^Input should be greater than or equal to "), "at least "),
    (re.compile(r"^Input should be less than "), "less than "),
    (re.compile(r"^Input should be greater than "), "more than "),
    (re.compile(r"^Input should be "), "must be "),
)


def plain(message: str) -> str:
    """A flag's error in ipvsctl's words: no validator prefix, no closing full stop."""
    for pattern, words in _PLAIN:
        message = pattern.sub(words, message)
    return message.rstrip(".")


def fail(message: str, code: int = 1) -> typer.Exit:
    """One line on stderr; a JSON log line once `run --log-format json` set logging up."""
    from ipvsctl.obs import logging as obs_logging

    if obs_logging.json_configured():
        import logging

        from ipvsctl.obs.logging import fields

        logging.getLogger("ipvsctl").critical(message, extra=fields(exit_code=code))
    else:
        typer.echo(f"ipvsctl: {message}", err=True)
    return typer.Exit(code)

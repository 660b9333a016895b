"""How a command fails: one line, and the exit code (2: bad flags; 1: could not start)."""

from __future__ import annotations

import typer


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

"""Durations as users write them: plain seconds (`30`, `2.5`) or Go/Kubernetes durations
(`30s`, `5m`, `1m30s`, `500ms`, `1h`). Pure.

Go durations are parsed by durationpy (a dependency of the Kubernetes client), after a check
that the text is Go's `time.ParseDuration` grammar: durationpy alone also takes units Go does
not know (`d`, `w`, `y`) and a leading sign.
"""

from __future__ import annotations

import math
import re

import durationpy

from ipvsctl.source.validate import short

# Longer than any drain or timeout anyone means; larger values are typos (or attacks on
# timers that add the value to a clock).
MAX_SECONDS = 7 * 24 * 3600.0

_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)"
_GO_DURATION = re.compile(rf"^(?:{_NUMBER}(?:ns|us|µs|μs|ms|s|m|h))+$", re.ASCII)
_SECONDS = re.compile(rf"^{_NUMBER}$", re.ASCII)


def parse_duration(text: str | float, *, max_seconds: float = MAX_SECONDS) -> float:
    """Seconds from `30`, `2.5`, `30s`, `1m30s`, `500ms`... ValueError (with a message fit
    for one log or error line) for anything else, negative, NaN, infinite or above
    `max_seconds`."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        text = str(text)  # a YAML manifest's unquoted `drain-timeout: 30`
    if not isinstance(text, str):
        raise ValueError(f"{short(text)} is not a duration (e.g. 30, 2.5, 30s, 5m, 1m30s)")
    value = text.strip()
    if _SECONDS.match(value):
        seconds = float(value)
    elif _GO_DURATION.match(value):
        try:
            seconds = durationpy.from_str(value).total_seconds()
        except (ValueError, OverflowError):
            raise ValueError(f"{short(text)} is out of range") from None
    else:
        raise ValueError(f"{short(text)} is not a duration (e.g. 30, 2.5, 30s, 5m, 1m30s)")
    if not math.isfinite(seconds) or seconds < 0 or seconds > max_seconds:
        raise ValueError(f"{short(text)} is out of range (0 to {max_seconds:g} seconds)")
    return seconds

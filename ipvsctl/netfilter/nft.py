"""The adapter to nftables: `nft -f -` with a generated script, one transaction per call.

Errors come back as NftError subclasses with one readable line (nft's own "Error:" line and
the statement it points at); nothing above this module sees a CalledProcessError. A failed
transaction changes nothing (nft applies a script all or nothing). Each failure counts in
`ipvsctl_nft_errors_total{operation}`, and is logged once per failing streak of that
operation (the first failure as an error, the recovery as info).

`netns=NAME` runs nft inside /run/netns/NAME (`ip netns exec`), for the lab.
"""

from __future__ import annotations

import json
import logging
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from ipvsctl.obs.logging import FailureStreaks
from ipvsctl.obs.metrics import Metrics

log = logging.getLogger("ipvsctl.nft")

T = TypeVar("T")
TIMEOUT = 60.0  # seconds; a 100k-element transaction takes a few


class NftError(Exception):
    """A failed nft run; `operation` names what ipvsctl was doing."""

    def __init__(self, message: str, operation: str = "") -> None:
        super().__init__(message)
        self.operation = operation


class NftNotFound(NftError):
    """The table (or map) does not exist."""


class NftUnavailable(NftError):
    """No nft binary, or no nf_tables in the kernel: fatal at start-up."""


class NftPermissionDenied(NftError):
    """No CAP_NET_ADMIN: fatal at start-up."""


def error_line(stderr: str) -> str:
    """nft's stderr in one line: the first "Error:" line, and the statement it is about."""
    lines = [ln.rstrip() for ln in stderr.splitlines() if ln.strip()]
    for i, ln in enumerate(lines):
        if "Error:" in ln:
            message = ln[ln.index("Error:") + len("Error:") :].strip()
            nxt = lines[i + 1].strip() if i + 1 < len(lines) else ""
            if nxt and set(nxt) - set("^~ "):  # the statement, not the caret line
                statement = nxt if len(nxt) <= 160 else nxt[:157] + "..."
                return f"{message} (in: {statement})"
            return message
    return lines[0] if lines else "failed with no message"


def translate(returncode: int, stderr: str, operation: str) -> NftError:
    line = error_line(stderr)
    message = f"nft {operation}: {line}"
    low = line.lower()
    if "no such file or directory" in low:
        return NftNotFound(message, operation)
    if "operation not permitted" in low or "permission denied" in low:
        return NftPermissionDenied(f"{message} (needs CAP_NET_ADMIN)", operation)
    if "protocol not supported" in low or "address family not supported" in low:
        return NftUnavailable(
            f"{message} (no nf_tables in this kernel: modprobe nf_tables nft_nat "
            "nft_fib_inet nft_ct)",
            operation,
        )
    return NftError(message, operation)


class Nft:
    """Runs nft. Thread-safe (one process per call); `runs` counts calls, for tests."""

    def __init__(
        self,
        binary: str = "nft",
        *,
        netns: str | None = None,
        metrics: Metrics | None = None,
        timeout: float = TIMEOUT,
    ) -> None:
        self.binary = binary
        self.netns = netns
        self.metrics = metrics
        self.timeout = timeout
        self.runs = 0
        self._failing = FailureStreaks(log)  # per operation
        self._lock = threading.Lock()

    def _argv(self, *args: str) -> list[str]:
        prefix = ["ip", "netns", "exec", self.netns] if self.netns else []
        return [*prefix, self.binary, *args]

    def _exec(
        self, args: list[str], operation: str, stdin: str | None = None, missing_ok: bool = False
    ) -> str | None:
        """nft's stdout; None when `missing_ok` and the object does not exist."""
        argv = self._argv(*args)
        t0 = time.monotonic()
        try:
            r = subprocess.run(
                argv, input=stdin, capture_output=True, text=True, timeout=self.timeout, check=False
            )
        except FileNotFoundError:
            raise self._failed(
                NftUnavailable(
                    f"nft {operation}: {argv[0]} not found: install nftables (the `nft` command)",
                    operation,
                )
            ) from None
        except subprocess.TimeoutExpired:
            raise self._failed(
                NftError(f"nft {operation}: no answer in {self.timeout:.0f}s", operation)
            ) from None
        except OSError as exc:
            raise self._failed(NftError(f"nft {operation}: {exc}", operation)) from None
        with self._lock:
            self.runs += 1
        if r.returncode != 0:
            err = translate(r.returncode, r.stderr, operation)
            if missing_ok and isinstance(err, NftNotFound):
                return None
            raise self._failed(err)
        if self.metrics is not None:
            self.metrics.nft_seconds.observe(time.monotonic() - t0)
        self._failing.recovered("nft working again", key=operation, operation=operation)
        return r.stdout

    def _failed(self, err: NftError) -> NftError:
        if self.metrics is not None:
            self.metrics.nft_errors.labels(err.operation).inc()
        self._failing.failed(
            logging.ERROR, "nft failed", key=err.operation, operation=err.operation, error=err
        )
        return err

    # --- what ipvsctl asks of nft -----------------------------------------------------------
    def apply(self, script: str, operation: str) -> None:
        """Run a script as one transaction (`nft -f -`): all of it or nothing."""
        self._exec(["-f", "-"], operation, stdin=script)

    def list_table(self, target: str, operation: str = "check") -> str | None:
        """`nft -t list table FAMILY NAME`: the table without set and map elements (so the
        text changes only when chains, rules or set definitions do); None if missing."""
        return self._exec(["-t", "list", "table", *target.split()], operation, missing_ok=True)

    def list_declarations(self, target: str, operation: str = "check") -> str | None:
        """The table's chains (with hooks), sets and maps, without rules or elements: cheap
        whatever the maps hold (a terse table listing still reads every element, ~1 s at
        50,000). None if the table is missing."""
        family = target.split()[0]
        out = self._exec(
            ["-t", "-f", "-"],
            operation,
            stdin=f"list chains {family}\nlist sets {family}\nlist maps {family}\n",
        )
        lines: list[str] = []
        keep = False
        for line in (out or "").splitlines():
            if line.startswith("table "):
                keep = line == f"table {target} {{"
            if keep:
                lines.append(line)
        return "\n".join(lines) + "\n" if lines else None

    def list_map(
        self, target: str, name: str, operation: str = "check"
    ) -> list[tuple[str, str, int, str]] | None:
        """A verdict map's elements as (address, protocol, port, goto target), for maps
        keyed `address . inet_proto . inet_service`; None if the map (or table) is missing."""
        return self._list_json("map", target, name, operation, parse_map_elements)

    def list_set(
        self, target: str, name: str, operation: str = "check"
    ) -> list[tuple[str, ...]] | None:
        """A set's elements, each as its concatenated fields (strings; an address prefix as
        `address/length`); None if the set (or table) is missing."""
        return self._list_json("set", target, name, operation, parse_set_elements)

    def _list_json(
        self,
        kind: str,
        target: str,
        name: str,
        operation: str,
        parse: Callable[[dict[str, Any]], T],
    ) -> T | None:
        return self._json(["-j", "list", kind, *target.split(), name], operation, parse)

    def _json(
        self, args: list[str], operation: str, parse: Callable[[dict[str, Any]], T]
    ) -> T | None:
        """nft's JSON output, parsed; None when the object listed does not exist."""
        out = self._exec(args, operation, missing_ok=True)
        if out is None:
            return None
        try:
            return parse(json.loads(out))
        except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
            raise self._failed(
                NftError(f"nft {operation}: unexpected JSON ({exc})", operation)
            ) from None

    def list_nat_chains(self, operation: str = "check") -> list[tuple[str, str]]:
        """(family, table) of every NAT base chain in the ruleset, whoever made it."""
        return self._json(["-j", "list", "chains"], operation, parse_nat_chains) or []

    def version(self) -> str:
        return (self._exec(["--version"], "version") or "").strip()


def parse_map_elements(doc: dict[str, Any]) -> list[tuple[str, str, int, str]]:
    """`nft -j list map` output -> [(address, protocol, port, goto target)]."""
    out: list[tuple[str, str, int, str]] = []
    for item in doc.get("nftables", []):
        if "map" not in item:
            continue
        for key, value in item["map"].get("elem", []):
            if "elem" in key:  # an element with options (timeout, comment) is wrapped
                key = key["elem"]["val"]
            address, protocol, port = key["concat"]
            verdict = value.get("goto") or value.get("jump") or {}
            out.append((str(address), str(protocol), int(port), str(verdict.get("target", ""))))
    return out


def parse_nat_chains(doc: dict[str, Any]) -> list[tuple[str, str]]:
    """`nft -j list chains` output -> [(family, table)] of its NAT base chains."""
    return [
        (str(c["family"]), str(c["table"]))
        for item in doc.get("nftables", [])
        if isinstance(item, dict) and isinstance(c := item.get("chain"), dict)
        if c.get("type") == "nat" and "hook" in c
    ]


def parse_set_elements(doc: dict[str, Any]) -> list[tuple[str, ...]]:
    """`nft -j list set` output -> [(field, ...)] per element."""
    out: list[tuple[str, ...]] = []
    for item in doc.get("nftables", []):
        if "set" not in item:
            continue
        for el in item["set"].get("elem", []):
            if isinstance(el, dict) and "elem" in el:
                el = el["elem"]["val"]
            fields = el["concat"] if isinstance(el, dict) and "concat" in el else [el]
            out.append(tuple(_set_field(f) for f in fields))
    return out


def _set_field(f: Any) -> str:
    if isinstance(f, dict):
        if "prefix" in f:
            return f"{f['prefix']['addr']}/{f['prefix']['len']}"
        if "range" in f:  # never written by ipvsctl (its ranges are prefixes)
            return "-".join(str(x) for x in f["range"])
        raise ValueError(f"unexpected set field {f!r}")
    return str(f)

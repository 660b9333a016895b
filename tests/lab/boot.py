"""Boot Debian's kernel once under qemu (virtme-ng) and run the real-kernel tests inside.

    .venv/bin/python -m tests.lab.boot [pytest args ...]      (make test-lab)
    .venv/bin/python -m tests.lab.boot [--out DIR] --run "CMD"  (make demo, make bench)

The guest's root is the host's filesystem, read-only, at the same paths: .venv/bin/python
resolves to the same interpreter and the venv's site-packages (and the editable install of
this repo) just work. The guest runs `pytest -m lab tests/lab` as root with IPVSCTL_LAB=1
and writes pytest's exit code into the --rwdir (out/lab/). This process streams the guest's
output and exits with that code: 3 when the guest never wrote one (boot failure, panic,
timeout). Timings land in out/lab/timings.json.

`--run CMD` runs the shell command CMD in the guest instead of pytest (as root, from the repo
root, with the venv's bin first on PATH and IPVSCTL_LAB=1, IPVSCTL_LAB_OUT=DIR set); its exit
code is passed on the same way. `--out DIR` (default out/lab, or $IPVSCTL_LAB_OUT) is the
folder the guest can write to: the only writable place on the host's filesystem.

Environment: IPVSCTL_VM_KVM=1 uses KVM (much faster where it works; it hangs on our CI
machines, hence software emulation by default); IPVSCTL_VM_KERNEL=/boot/vmlinuz-... picks
the kernel (default: the newest /boot/vmlinuz-*-amd64); IPVSCTL_VM_MEMORY (default 2G);
IPVSCTL_LAB_TIMEOUT seconds for the whole run (default 3600: the whole lab took 22 min on
a loaded 2-core host before the cluster subset, tests/lab/test_cluster_lab.py, added its
share).
"""

from __future__ import annotations

import glob
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OUT = Path(os.environ.get("IPVSCTL_LAB_OUT", REPO / "out" / "lab"))
NO_RESULT = 3


def newest_kernel() -> str:
    override = os.environ.get("IPVSCTL_VM_KERNEL")
    if override:
        return override
    kernels = glob.glob("/boot/vmlinuz-*-amd64")
    if not kernels:
        sys.exit("lab: no /boot/vmlinuz-*-amd64: run `make lab-deps` (linux-image-amd64)")

    def version(path: str) -> list[int]:
        return [int(n) for n in re.findall(r"\d+", Path(path).name)]

    return max(kernels, key=version)


def guest_script(
    python: str, pytest_args: list[str], out: Path = OUT, run: str | None = None
) -> str:
    args = " ".join(shlex.quote(a) for a in pytest_args)
    out_q = shlex.quote(str(out))
    if run is None:
        what = "starting pytest"
        # the repo is read-only in the guest: no cache provider; -v and durations show
        # progress and where the time goes in CI logs
        command = (
            f"{shlex.quote(python)} -m pytest -m lab -p no:cacheprovider -v "
            f"--durations=10 tests/lab {args}"
        )
    else:
        what = "running: " + run
        bindir = shlex.quote(str(Path(python).parent))
        command = f"export PATH={bindir}:$PATH\nbash -c {shlex.quote(run)}"
    return f"""#!/bin/bash
# written by tests/lab/boot.py; runs inside the VM
cd {shlex.quote(str(REPO))}
date +%s.%N > {out_q}/guest-start
echo "lab: guest up, kernel $(uname -r), $(nproc) CPUs, "{shlex.quote(what)}
export IPVSCTL_LAB=1 IPVSCTL_LAB_OUT={out_q} PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
{command}
rc=$?
date +%s.%N > {out_q}/guest-end
echo $rc > {out_q}/result
"""


def parse_args(argv: list[str]) -> tuple[Path, str | None, list[str]]:
    """Leading `--out DIR` / `--run CMD` (also `--opt=value`) are boot.py's own; the rest
    goes to pytest, as before."""
    out, run = OUT, None
    rest = list(argv)
    while rest and rest[0].split("=", 1)[0] in ("--out", "--run"):
        opt = rest.pop(0)
        name, eq, value = opt.partition("=")
        if not eq:
            if not rest:
                sys.exit(f"lab: {name} needs a value")
            value = rest.pop(0)
        if name == "--out":
            out = Path(value).resolve()
        else:
            run = value
    if run is not None and rest:
        sys.exit(f"lab: with --run, no pytest arguments: {shlex.join(rest)}")
    return out, run, rest


def main(argv: list[str]) -> int:
    out, run, pytest_args = parse_args(argv)
    out.mkdir(parents=True, exist_ok=True)
    for name in ("result", "guest-start", "guest-end", "timings-guest.json"):
        (out / name).unlink(missing_ok=True)
    # the venv's python, not its resolved target: the guest must run inside the venv
    python = str(REPO / ".venv" / "bin" / "python")
    if not os.path.exists(python):
        python = sys.executable
    bindir = str(Path(python).parent)
    vng = shutil.which("vng", path=bindir) or shutil.which("vng")
    if not vng:
        sys.exit("lab: vng (virtme-ng) not found: run `make venv` (pip install -e '.[lab]')")
    script = out / "guest.sh"
    script.write_text(guest_script(python, pytest_args, out, run))

    kvm = os.environ.get("IPVSCTL_VM_KVM") == "1"
    cmd = [
        vng,
        "--run",
        newest_kernel(),
        "--user",
        "root",
        "--force-9p",
        "--memory",
        os.environ.get("IPVSCTL_VM_MEMORY", "2G"),
        "--cpus",
        str(min(os.cpu_count() or 2, 4)),
        "--rwdir",
        str(out),
        "--exec",
        f"bash {shlex.quote(str(script))}",
    ]
    if not kvm:
        cmd.insert(cmd.index("--force-9p"), "--disable-kvm")
    env = dict(os.environ, PATH=f"{bindir}:{os.environ.get('PATH', '')}")  # vng runs virtme-run
    timeout = float(os.environ.get("IPVSCTL_LAB_TIMEOUT", "3600"))

    print(f"lab: {shlex.join(cmd)}", flush=True)
    started = time.time()
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    timed_out = threading.Event()

    def kill() -> None:
        timed_out.set()
        print(f"\nlab: timeout after {timeout:.0f}s, killing the VM", flush=True)
        os.killpg(proc.pid, signal.SIGKILL)

    watchdog = threading.Timer(timeout, kill)
    watchdog.daemon = True
    watchdog.start()
    try:
        assert proc.stdout is not None
        for raw in proc.stdout:
            sys.stdout.write(raw.decode(errors="replace"))
            sys.stdout.flush()
        vm_rc = proc.wait()
    except KeyboardInterrupt:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    finally:
        watchdog.cancel()
    ended = time.time()

    report_timings(started, ended, out)
    result = out / "result"
    if timed_out.is_set() or not result.exists():
        why = "timed out" if timed_out.is_set() else f"vng exited {vm_rc}"
        print(
            f"lab: FAILED: the guest wrote no result ({why}): boot failure, kernel panic or "
            "a hung test; see the output above",
            flush=True,
        )
        return NO_RESULT
    rc = int(result.read_text().strip() or NO_RESULT)
    print(f"lab: guest {'pytest' if run is None else 'command'} exit code {rc}", flush=True)
    return rc


def report_timings(started: float, ended: float, out: Path = OUT) -> None:
    timings: dict[str, float] = {"total_s": round(ended - started, 1)}
    try:
        guest_start = float((out / "guest-start").read_text())
        timings["boot_s"] = round(guest_start - started, 1)
        guest_end = float((out / "guest-end").read_text())
        timings["guest_pytest_s"] = round(guest_end - guest_start, 1)
        timings["shutdown_s"] = round(ended - guest_end, 1)
        timings.update(json.loads((out / "timings-guest.json").read_text()))
    except (OSError, ValueError):
        pass  # whatever the guest got to write
    (out / "timings.json").write_text(json.dumps(timings, indent=2) + "\n")
    print(f"lab: timings {json.dumps(timings)}", flush=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

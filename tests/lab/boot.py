"""Boot Debian's kernel once under qemu (virtme-ng) and run the real-kernel tests inside.

    .venv/bin/python -m tests.lab.boot [pytest args ...]      (make test-lab)

The guest's root is the host's filesystem, read-only, at the same paths: .venv/bin/python
resolves to the same interpreter and the venv's site-packages (and the editable install of
this repo) just work. The guest runs `pytest -m lab tests/lab` as root with IPVSCTL_LAB=1
and writes pytest's exit code into the --rwdir (out/lab/). This process streams the guest's
output and exits with that code: 3 when the guest never wrote one (boot failure, panic,
timeout). Timings land in out/lab/timings.json.

Environment: IPVSCTL_VM_KVM=1 uses KVM (much faster where it works; it hangs on our CI
machines, hence software emulation by default); IPVSCTL_VM_KERNEL=/boot/vmlinuz-... picks
the kernel (default: the newest /boot/vmlinuz-*-amd64); IPVSCTL_VM_MEMORY (default 2G);
IPVSCTL_LAB_TIMEOUT seconds for the whole run (default 2400).
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


def guest_script(python: str, pytest_args: list[str]) -> str:
    args = " ".join(shlex.quote(a) for a in pytest_args)
    out = shlex.quote(str(OUT))
    return f"""#!/bin/bash
# written by tests/lab/boot.py; runs inside the VM
cd {shlex.quote(str(REPO))}
date +%s.%N > {out}/guest-start
echo "lab: guest up, kernel $(uname -r), $(nproc) CPUs, starting pytest"
export IPVSCTL_LAB=1 IPVSCTL_LAB_OUT={out} PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
# the repo is read-only in the guest: no cache provider; -v and durations show progress
# and where the time goes in CI logs
{shlex.quote(python)} -m pytest -m lab -p no:cacheprovider -v --durations=10 tests/lab {args}
rc=$?
date +%s.%N > {out}/guest-end
echo $rc > {out}/result
"""


def main(argv: list[str]) -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    for name in ("result", "guest-start", "guest-end", "timings-guest.json"):
        (OUT / name).unlink(missing_ok=True)
    # the venv's python, not its resolved target: the guest must run inside the venv
    python = str(REPO / ".venv" / "bin" / "python")
    if not os.path.exists(python):
        python = sys.executable
    bindir = str(Path(python).parent)
    vng = shutil.which("vng", path=bindir) or shutil.which("vng")
    if not vng:
        sys.exit("lab: vng (virtme-ng) not found: run `make venv` (pip install -e '.[lab]')")
    script = OUT / "guest.sh"
    script.write_text(guest_script(python, argv))

    kvm = os.environ.get("IPVSCTL_VM_KVM") == "1"
    cmd = [
        vng, "--run", newest_kernel(), "--user", "root", "--force-9p",
        "--memory", os.environ.get("IPVSCTL_VM_MEMORY", "2G"),
        "--cpus", str(min(os.cpu_count() or 2, 4)),
        "--rwdir", str(OUT),
        "--exec", f"bash {shlex.quote(str(script))}",
    ]
    if not kvm:
        cmd.insert(cmd.index("--force-9p"), "--disable-kvm")
    env = dict(os.environ, PATH=f"{bindir}:{os.environ.get('PATH', '')}")  # vng runs virtme-run
    timeout = float(os.environ.get("IPVSCTL_LAB_TIMEOUT", "2400"))

    print(f"lab: {shlex.join(cmd)}", flush=True)
    started = time.time()
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
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

    report_timings(started, ended)
    result = OUT / "result"
    if timed_out.is_set() or not result.exists():
        why = "timed out" if timed_out.is_set() else f"vng exited {vm_rc}"
        print(f"lab: FAILED: the guest wrote no result ({why}): boot failure, kernel panic or "
              "a hung test; see the output above", flush=True)
        return NO_RESULT
    rc = int(result.read_text().strip() or NO_RESULT)
    print(f"lab: guest pytest exit code {rc}", flush=True)
    return rc


def report_timings(started: float, ended: float) -> None:
    timings: dict[str, float] = {"total_s": round(ended - started, 1)}
    try:
        guest_start = float((OUT / "guest-start").read_text())
        timings["boot_s"] = round(guest_start - started, 1)
        guest_end = float((OUT / "guest-end").read_text())
        timings["guest_pytest_s"] = round(guest_end - guest_start, 1)
        timings["shutdown_s"] = round(ended - guest_end, 1)
        timings.update(json.loads((OUT / "timings-guest.json").read_text()))
    except (OSError, ValueError):
        pass  # whatever the guest got to write
    (OUT / "timings.json").write_text(json.dumps(timings, indent=2) + "\n")
    print(f"lab: timings {json.dumps(timings)}", flush=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

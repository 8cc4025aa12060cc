"""One cell, as run inside a Ray worker: ``testbed run`` in a child process.

A child process (not the runner in the worker itself) keeps cells apart: a crash, a
segfault or a leak in one cell ends that process only, the worker reports its exit code,
and the cell's run directory is exactly what ``testbed run`` writes by hand. The child is
tied to the worker: on Linux it gets SIGKILL when the worker dies (``PR_SET_PDEATHSIG``),
so a worker that Ray kills leaves nothing behind; the run directory is crash-safe and the
next sweep resumes it. A cancelled task (the sweep's Ctrl-C) first asks the child to stop
with SIGTERM, which stops it before its next transmission with an ``interrupted`` summary.
"""

from __future__ import annotations

import ctypes
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

#: Seconds a stopped cell gets to write its summary before it is killed.
STOP_GRACE_S = 60.0
#: How often the worker looks at its child (s).
POLL_S = 0.2
_PR_SET_PDEATHSIG = 1


def _child_setup(parent_pid: int, libc: Any) -> Any:
    """``preexec_fn``: die with the worker; take SIGINT again (Ray's processes block it)."""

    def setup() -> None:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        if libc is not None:
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if os.getppid() != parent_pid:  # the worker died before prctl took effect
                os._exit(1)

    return setup


def run_cell(job: dict[str, Any]) -> dict[str, Any]:
    """Run one cell's ``testbed`` command to its end; never raises for the cell's outcome.

    Parameters
    ----------
    job
        ``args`` (arguments after ``testbed``), ``cwd``, ``log`` (file that gets the
        child's stdout and stderr, appended), ``threads`` (``OMP_NUM_THREADS`` and
        ``MKL_NUM_THREADS`` of the child).

    Returns
    -------
    dict
        ``returncode`` (the child's exit code; negative: killed by that signal),
        ``wall_s`` (s, the child's whole life, start-up included), ``stopped`` (the task
        was cancelled and asked the child to stop).
    """
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(job["threads"])
    env["PYTHONUNBUFFERED"] = "1"
    libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
    log_path = Path(job["log"])
    log_path.parent.mkdir(parents=True, exist_ok=True)
    stopped = False
    t0 = time.monotonic()
    with log_path.open("ab") as log:
        log.write(f"\n$ testbed {shlex.join(job['args'])}\n".encode())
        log.flush()
        proc = subprocess.Popen(
            [sys.executable, "-m", "testbed", *job["args"]],
            cwd=job["cwd"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=_child_setup(os.getpid(), libc),
        )
        try:
            while proc.poll() is None:
                time.sleep(POLL_S)
        except KeyboardInterrupt:  # ray.cancel: stop the cell cleanly, then end
            stopped = True
            _stop(proc)
        finally:
            if proc.poll() is None:  # any other way out of the loop
                proc.kill()
                proc.wait()
    return {"returncode": proc.returncode, "wall_s": time.monotonic() - t0, "stopped": stopped}


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM (stop before the next transmission), then SIGKILL after the grace time or
    a second cancellation; returns when the child has ended."""
    proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(POLL_S)
    except KeyboardInterrupt:
        pass
    if proc.poll() is None:
        proc.kill()
    proc.wait()

"""Child processes that die with their parent (Linux ``PR_SET_PDEATHSIG``).

A launcher, a run's training workers and a private virtual air all start children that must
not outlive them, even when they are killed with ``kill -9`` (no clean-up code runs then).
"""

from __future__ import annotations

import ctypes
import os
import signal

#: ``prctl`` option: the signal the kernel sends this process when its parent thread dies.
PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int | None = None) -> None:
    """Have the kernel SIGKILL this process when its parent dies; with ``parent_pid``, exit
    now if the parent is already gone (it died before the request took effect).

    Use as ``subprocess.Popen(..., preexec_fn=die_with_parent)`` or first thing in a worker.
    Not Linux: nothing happens (the parent's own clean-up still stops its children).
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)

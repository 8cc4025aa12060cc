"""How long this process has existed: what a run's ``startup_s`` (``summary.json``) is read
from, so that start-up counts the interpreter's own start and every import before the
testbed's first line ran."""

from __future__ import annotations

import os
import time

#: Where Linux keeps this process's start time (field 22, clock ticks after boot).
_STAT = "/proc/self/stat"


def process_age_s() -> float | None:
    """Seconds since this process started, to the kernel's clock tick (10 ms on Linux);
    ``None`` where that is not known (no ``/proc``, no ``CLOCK_BOOTTIME``).

    Read from ``/proc/self/stat`` (the start, in ticks after boot) against
    ``CLOCK_BOOTTIME`` (now, after boot), the two clocks the kernel keeps alike.
    """
    boottime = getattr(time, "CLOCK_BOOTTIME", None)
    if boottime is None:
        return None
    try:
        with open(_STAT, encoding="ascii") as f:
            stat = f.read()
        # the command name (field 2) may hold spaces and parentheses: count after the last ")"
        start_ticks = int(stat.rsplit(")", 1)[1].split()[19])
        ticks_per_s = os.sysconf("SC_CLK_TCK")
        age = time.clock_gettime(boottime) - start_ticks / ticks_per_s
    except (OSError, ValueError, IndexError):
        return None
    return age if age >= 0 else None

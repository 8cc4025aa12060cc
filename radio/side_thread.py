"""One worker thread per process for work done beside the calling thread.

Used where numpy (or the OS) does the work without the GIL, so that it runs on another core
while the caller goes on: the waveform emulator's receiver noise
(:mod:`radio.waveform_channel`) and a record-level device's next per-step privacy noise
(:mod:`edge_device.noise_ahead`). One thread, made on first use and again in a forked
child (which does not inherit its parent's threads); its work is queued in order.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

_POOL: tuple[int, ThreadPoolExecutor] | None = None
_LOCK = threading.Lock()


def side_thread() -> ThreadPoolExecutor:
    """This process's worker thread (an executor of one thread)."""
    global _POOL
    with _LOCK:
        if _POOL is None or _POOL[0] != os.getpid():
            _POOL = (os.getpid(), ThreadPoolExecutor(max_workers=1,
                                                     thread_name_prefix="side-thread"))
        return _POOL[1]

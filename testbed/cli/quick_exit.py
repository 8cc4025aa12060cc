"""Ending the ``testbed`` process without the interpreter's teardown, where that is safe.

A finished ``testbed run`` spent about 0.4 s (2 cores, the default job) tearing down the
interpreter after its last line: clearing the modules of torch, numpy and the testbed one by
one and running their destructors, none of which writes anything. The run directory is
already durable by then: every file of it is written atomically or appended and fsynced as
it goes (a ``kill -9`` at that moment loses nothing, which the kill-point tests check).

So a command that has finished its work may :func:`allow` it, and the process entry points
(the console script and ``python -m testbed``, :func:`testbed.cli.main.entry`) then
:func:`finish` with: the ``atexit`` handlers (logging's flush, multiprocessing's reaping of
its children, ...), a flush of stdout and stderr, and ``os._exit``. Nothing else is
skipped, and only when the process is down to its main thread and has no child process
left: otherwise it ends the ordinary way. A command called in-process (``main([...])``, as
the tests do) never ends its caller's process.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import NoReturn

_allowed = False


def allow() -> None:
    """Mark this process' command as done with everything it writes."""
    global _allowed
    _allowed = True


def allowed() -> bool:
    """Whether :func:`allow` was called."""
    return _allowed


def _alone() -> bool:
    """Whether only the main thread runs and no child process of ``multiprocessing`` is
    alive (``active_children`` also reaps the finished ones)."""
    if threading.active_count() > 1:
        return False
    mp = sys.modules.get("multiprocessing")
    return mp is None or not mp.active_children()


def finish(code: int) -> NoReturn:
    """End the process with exit status ``code``: quickly when :func:`allow`\\ ed and alone
    (see the module's docstring), else through ``sys.exit``."""
    if not (_allowed and _alone()):
        sys.exit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: nothing more to say
            pass
    os._exit(code)

"""The cyclic garbage collector paused while a ``testbed run`` process starts.

Importing torch, pydantic and the testbed makes about 180,000 long-lived objects; the
collections that those allocations trigger walk them again and again (3 full collections
and 34 of the middle generation on the way to round 0: 0.2 s of a 1.4 s start here). None
of it is garbage. :func:`pause` stops automatic collection at the process's start;
:func:`resume`, when the first round begins (or the command ends), moves every object made
so far into the permanent generation (:func:`gc.freeze`), which later collections skip,
and starts collecting again. Objects freed by reference counting are freed as always; only
a reference cycle among the frozen start-up objects would outlive its use.

Only the command line pauses (:mod:`testbed.cli.main`, for the commands that run rounds);
a program that imports the testbed keeps its collector as it set it.
"""

from __future__ import annotations

import gc

_paused = False


def pause() -> None:
    """Stop automatic collection until :func:`resume` (nothing when it is already off)."""
    global _paused
    if gc.isenabled():
        gc.disable()
        _paused = True


def resume() -> None:
    """Freeze what exists and collect automatically again, if :func:`pause` stopped it
    (else nothing)."""
    global _paused
    if _paused:
        _paused = False
        gc.freeze()
        gc.enable()

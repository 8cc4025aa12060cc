"""Graceful stop on Ctrl-C / SIGTERM: finish the upload under way, transmit nothing more.

The first SIGINT or SIGTERM only sets :attr:`StopSignals.requested`; the runner checks it
before every transmission and between rounds, so a stop never charges privacy for an upload
that did not go on air and never splits a commit. A second signal outside a critical
section (journal -> transmit -> ledger -> keep, or a round's commit) raises
``KeyboardInterrupt`` at once; inside one it is held until the section ends.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType, TracebackType
from typing import Any


class StopSignals:
    """Context manager installing the handlers (a no-op outside the main thread)."""

    def __init__(self) -> None:
        self.requested = False
        self._depth = 0
        self._forced = False
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if not self.requested:
            self.requested = True
            name = signal.Signals(signum).name
            print(
                f"\n{name}: stopping before the next transmission (again to stop at once)",
                file=sys.stderr,
            )
            return
        if self._depth > 0:
            self._forced = True
            return
        raise KeyboardInterrupt

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def check(self) -> None:
        """Raise ``KeyboardInterrupt`` if a stop was requested (call at safe points)."""
        if self.requested:
            raise KeyboardInterrupt

    @contextmanager
    def critical(self) -> Iterator[None]:
        """A section no signal may split; a forced stop is raised when it ends."""
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0 and self._forced:
                self._forced = False
                raise KeyboardInterrupt


def raise_interrupt(signum: int, frame: FrameType | None) -> None:
    """Signal handler: raise ``KeyboardInterrupt`` (SIGTERM stops like Ctrl-C)."""
    raise KeyboardInterrupt


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Treat SIGTERM like Ctrl-C inside the block (main thread only; elsewhere a no-op).

    For commands that stop by unwinding on ``KeyboardInterrupt`` (``testbed sweep``,
    ``testbed reproduce``): ``subprocess.run`` then kills its child, and ``finally`` blocks
    run. The previous handler is put back on exit.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)

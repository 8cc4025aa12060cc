"""The ledger's file: its exclusive ``flock``, the cutting of a torn last line and the
writer a line names (:mod:`testbed.core.privacy.ledger`)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from testbed.core.privacy.ledger_parse import LedgerError

#: How long an append or an open waits for another process's append (s).
LOCK_WAIT_S = 60.0
#: The ``writer`` member of a raw line.
_WRITER = re.compile(rb'"writer":"([0-9A-Za-z]+)"')


class TornLineWarning(UserWarning):
    """The ledger's last line was torn by a crash and has been ignored."""


@contextlib.contextmanager
def flocked(handle: IO[bytes], path: Path) -> Iterator[None]:
    """Hold the ledger file's exclusive ``flock`` (writers and
    :meth:`~testbed.core.privacy.ledger.Ledger.open` only take it for the few milliseconds of
    a read or an append; waits up to :data:`LOCK_WAIT_S`)."""
    fd = handle.fileno()
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise LedgerError(
                    f"{path}: held by another writer for more than {LOCK_WAIT_S:.0f} s"
                ) from None
            time.sleep(0.01)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


def cut_torn(p: Path, handle: IO[bytes], torn: bytes) -> None:
    """Warn about a torn last line, copy it to ``<p>.torn`` and cut it off the file."""
    warnings.warn(
        f"{p}: last line is torn ({len(torn)} bytes without a newline, e.g. from "
        f"a crash during append); ignored, copied to {p}.torn",
        TornLineWarning,
        stacklevel=4,
    )
    with open(f"{p}.torn", "ab") as aside:
        aside.write(torn + b"\n")
        aside.flush()
        os.fsync(aside.fileno())
    handle.truncate(handle.seek(0, os.SEEK_END) - len(torn))
    handle.flush()
    os.fsync(handle.fileno())


def writer_of(raw: bytes) -> str:
    """The ``writer`` id a raw line names (``"unknown"`` when it names none)."""
    match = _WRITER.search(raw)
    return match.group(1).decode("ascii") if match else "unknown"

"""Durable, append-only privacy ledger: ``ledger.jsonl``, one upload event per line.

Each :meth:`Ledger.append` writes one complete line, flushes and ``fsync``s before returning,
so an event is durable once ``append`` returns. A crash during ``append`` can leave a *torn*
last line (no trailing newline): on :meth:`Ledger.open` it is detected, reported with a
:class:`TornLineWarning`, copied aside to ``<ledger>.torn`` for inspection and cut off, so
the next append starts on a fresh line. Complete lines are never rewritten; a complete line
that does not parse is corruption, not a crash artefact, and raises :class:`LedgerError`.

Crash semantics the runner must respect: append the event *before* the device transmits
(write-ahead). Then a torn line can only belong to an upload that never went on air.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from types import TracebackType
from typing import IO

from aggregator.privacy.accountant import PrivacyAccountant
from aggregator.privacy.events import EventError, UploadEvent
from testbed.rundir import fsync_dir


class LedgerError(RuntimeError):
    """The ledger file is corrupt (a complete line does not parse) or unusable."""


class TornLineWarning(UserWarning):
    """The ledger's last line was torn by a crash and has been ignored."""


def _parse(lines: list[bytes], path: Path) -> list[UploadEvent]:
    events = []
    for number, raw in enumerate(lines, start=1):
        try:
            events.append(UploadEvent.from_json(raw.decode("utf-8")))
        except (EventError, UnicodeDecodeError) as exc:
            raise LedgerError(f"{path}: line {number} is not a valid event: {exc}") from exc
    return events


class Ledger:
    """An open ledger file. Use :meth:`open`; close it (or use ``with``) when done."""

    def __init__(self, path: Path, handle: IO[bytes], count: int) -> None:
        self._path = path
        self._handle: IO[bytes] | None = handle
        self._count = count

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> Ledger:
        """Open (creating if absent) the ledger at ``path`` for appending.

        Validates every complete line; a torn last line is warned about, saved to
        ``<path>.torn`` and cut off.

        Raises
        ------
        LedgerError
            If a complete line is not a valid event.
        """
        p = Path(path)
        if p.is_dir():
            raise LedgerError(f"{p}: is a directory, expected a ledger file")
        created = not p.exists()
        handle = open(p, "a+b")  # noqa: SIM115 - kept open for the ledger's lifetime
        try:
            handle.seek(0)
            data = handle.read()
            complete, _, torn = data.rpartition(b"\n")
            lines = [line for line in complete.split(b"\n") if line] if complete else []
            events = _parse(lines, p)
            if torn:
                warnings.warn(
                    f"{p}: last line is torn ({len(torn)} bytes without a newline, e.g. from "
                    f"a crash during append); ignored, copied to {p}.torn",
                    TornLineWarning,
                    stacklevel=2,
                )
                with open(f"{p}.torn", "ab") as aside:
                    aside.write(torn + b"\n")
                    aside.flush()
                    os.fsync(aside.fileno())
                handle.truncate(len(data) - len(torn))
                handle.flush()
                os.fsync(handle.fileno())
            if created:
                fsync_dir(p.parent if str(p.parent) else Path("."))
        except BaseException:
            handle.close()
            raise
        handle.seek(0, os.SEEK_END)
        return cls(p, handle, len(events))

    @property
    def path(self) -> Path:
        """The ledger file."""
        return self._path

    def __len__(self) -> int:
        return self._count

    def append(self, event: UploadEvent) -> None:
        """Write ``event`` as one line; durable (flushed and fsynced) when this returns."""
        if self._handle is None:
            raise LedgerError(f"{self._path}: ledger is closed")
        if not isinstance(event, UploadEvent):
            raise TypeError(f"append: expected an UploadEvent, got {type(event).__name__}")
        line = (event.to_json() + "\n").encode("utf-8")
        self._handle.write(line)
        self._handle.flush()
        os.fsync(self._handle.fileno())
        self._count += 1

    def events(self) -> list[UploadEvent]:
        """Every event in the file, in order (a torn last line is skipped with a warning)."""
        data = self._path.read_bytes()
        complete, _, torn = data.rpartition(b"\n")
        if torn:
            warnings.warn(f"{self._path}: ignoring a torn last line", TornLineWarning, stacklevel=2)
        lines = [line for line in complete.split(b"\n") if line] if complete else []
        return _parse(lines, self._path)

    def close(self) -> None:
        """Close the file. Idempotent."""
        if self._handle is not None:
            self._handle.close()
            self._handle = None

    def __enter__(self) -> Ledger:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def rebuild_accountant(
    ledger: Ledger | str | os.PathLike[str],
    *,
    mode: str,
    delta: float,
    conversion: str = "standard",
) -> PrivacyAccountant:
    """A fresh accountant holding every event of the ledger (for resume and reports)."""
    accountant = PrivacyAccountant(mode=mode, delta=delta, conversion=conversion)
    if isinstance(ledger, Ledger):
        events = ledger.events()
    else:
        with Ledger.open(ledger) as opened:
            events = opened.events()
    for event in events:
        accountant.add(event)
    return accountant

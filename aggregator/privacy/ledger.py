"""Durable, append-only privacy ledger: ``ledger.jsonl``, one upload event per line.

Each :meth:`Ledger.append` writes one complete line, flushes and ``fsync``s before returning,
so an event is durable once ``append`` returns. A crash during ``append`` can leave a *torn*
last line (no trailing newline): on :meth:`Ledger.open` it is detected, reported with a
:class:`TornLineWarning`, copied aside to ``<ledger>.torn`` for inspection and cut off, so
the next append starts on a fresh line. Complete lines are never rewritten; a complete line
that does not parse is corruption, not a crash artefact, and raises :class:`LedgerError`.

Each line is one event's JSON (its ``type`` tag selects the event class, see
:data:`EVENT_TYPES`) plus an optional ``nonce``: the unique id of the transmission, which
the runner's write-ahead intent carries too, so recovery after a crash can tell exactly
which intended transmissions have a record. An optional first line of type
``ledger-header/v1`` pins what the ledger was opened for (target, delta, accounting, unit);
reopening with another header is refused, naming the key.

Lines are read by :class:`~aggregator.privacy.ledger_parse.LineParser`: lines that differ
from an earlier one only in round, device and nonce are read through that line's template
(a million lines in seconds), every other line by the full JSON parse, which alone reports
corruption. :meth:`Ledger.open` keeps what it read for :meth:`Ledger.take_loaded`, so a
resume reads the file once.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from types import TracebackType
from typing import IO, Any, ClassVar, Protocol

from aggregator.privacy.accountant import PrivacyAccountant
from aggregator.privacy.events import UploadEvent
from aggregator.privacy.ledger_parse import LedgerEntry, LedgerError, LineParser
from aggregator.privacy.record_events import LaplaceRecordEvent, RecordEvent
from testbed.rundir import fsync_dir

__all__ = [
    "EVENT_TYPES",
    "HEADER_TYPE",
    "Ledger",
    "LedgerEntry",
    "LedgerError",
    "LedgerEvent",
    "TornLineWarning",
    "intents_path",
    "rebuild_accountant",
    "register_event_type",
]

#: Type tag of the optional first line.
HEADER_TYPE = "ledger-header/v1"


class LedgerEvent(Protocol):
    """What the ledger needs of an event: a device, a round and a JSON form."""

    TYPE: ClassVar[str]

    @property
    def device(self) -> int: ...

    @property
    def round(self) -> int: ...

    def to_dict(self) -> dict[str, Any]: ...


#: Event classes the ledger can hold, by their JSON ``type`` tag.
EVENT_TYPES: dict[str, Any] = {
    UploadEvent.TYPE: UploadEvent,
    RecordEvent.TYPE: RecordEvent,
    LaplaceRecordEvent.TYPE: LaplaceRecordEvent,
}


def intents_path(ledger_path: Path) -> Path:
    """The write-ahead journal next to a ledger: ``<ledger stem>.intents.jsonl``."""
    return ledger_path.with_name(ledger_path.stem + ".intents.jsonl")


def register_event_type(cls: Any) -> Any:
    """Let the ledger read events of ``cls`` (its ``TYPE`` tag must be new). Returns ``cls``."""
    known = EVENT_TYPES.get(cls.TYPE)
    if known is not None and known is not cls:
        raise ValueError(f"ledger: event type {cls.TYPE!r} is already taken by {known.__name__}")
    EVENT_TYPES[cls.TYPE] = cls
    return cls


class TornLineWarning(UserWarning):
    """The ledger's last line was torn by a crash and has been ignored."""


def _parse(data: bytes, path: Path) -> tuple[dict[str, Any] | None, list[LedgerEntry]]:
    parser = LineParser(path, EVENT_TYPES, HEADER_TYPE)
    entries = parser.parse(data)
    return parser.header, entries


class Ledger:
    """An open ledger file. Use :meth:`open`; close it (or use ``with``) when done."""

    def __init__(
        self, path: Path, handle: IO[bytes], count: int, header: dict[str, Any] | None,
        loaded: list[LedgerEntry] | None = None,
    ) -> None:
        self._path = path
        self._handle: IO[bytes] | None = handle
        self._count = count
        self._header = header
        self._loaded = loaded

    @classmethod
    def open(
        cls, path: str | os.PathLike[str], *, header: dict[str, Any] | None = None
    ) -> Ledger:
        """Open (creating if absent) the ledger at ``path`` for appending.

        Validates every complete line; a torn last line is warned about, saved to
        ``<path>.torn`` and cut off. The entries read are kept until :meth:`take_loaded`
        or :meth:`close`.

        Parameters
        ----------
        header
            What this ledger is for (JSON values). A new or empty ledger gets it as its
            first line; an existing ledger must carry the same header.

        Raises
        ------
        LedgerError
            If a complete line is not a valid event, or the header differs.
        """
        p = Path(path)
        if p.is_dir():
            raise LedgerError(f"{p}: is a directory, expected a ledger file")
        created = not p.exists()
        handle = open(p, "a+b")  # noqa: SIM115 - kept open for the ledger's lifetime
        try:
            handle.seek(0)
            data = handle.read()
            torn = data[data.rfind(b"\n") + 1:]
            found, entries = _parse(data, p)
            del data
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
                handle.truncate(handle.seek(0, os.SEEK_END) - len(torn))
                handle.flush()
                os.fsync(handle.fileno())
            handle.seek(0, os.SEEK_END)
            if header is not None:
                wanted = json.loads(json.dumps(header))
                if found is None and entries:
                    raise LedgerError(
                        f"{p}: holds {len(entries)} events but no header; it was not written "
                        f"for this run (expected {wanted})"
                    )
                if found is None:
                    line = json.dumps({"type": HEADER_TYPE, **wanted}, sort_keys=True)
                    handle.write((line + "\n").encode("utf-8"))
                    handle.flush()
                    os.fsync(handle.fileno())
                    found = wanted
                else:
                    for key in sorted(set(wanted) | set(found)):
                        if found.get(key) != wanted.get(key):
                            raise LedgerError(
                                f"{p}: was written with {key}={found.get(key)!r}, but this run "
                                f"has {key}={wanted.get(key)!r}; refusing to mix them"
                            )
            if created:
                fsync_dir(p.parent if str(p.parent) else Path("."))
        except BaseException:
            handle.close()
            raise
        return cls(p, handle, len(entries), found, entries)

    @property
    def path(self) -> Path:
        """The ledger file."""
        return self._path

    @property
    def header(self) -> dict[str, Any] | None:
        """The header line's values (``None`` for a ledger without one)."""
        return None if self._header is None else dict(self._header)

    def __len__(self) -> int:
        return self._count

    def append(self, event: LedgerEvent, nonce: str | None = None) -> None:
        """Write ``event`` (with its transmission ``nonce``) as one line; durable (flushed
        and fsynced) when this returns."""
        if self._handle is None:
            raise LedgerError(f"{self._path}: ledger is closed")
        if EVENT_TYPES.get(getattr(event, "TYPE", None)) is not type(event):  # type: ignore[arg-type]
            raise TypeError(f"append: not a registered event type: {type(event).__name__}")
        data = event.to_dict()
        if nonce is not None:
            data["nonce"] = str(nonce)
        line = (json.dumps(data, sort_keys=True, separators=(",", ":")) + "\n").encode("utf-8")
        self._handle.write(line)
        self._handle.flush()
        os.fsync(self._handle.fileno())
        self._count += 1

    def take_loaded(self) -> list[LedgerEntry]:
        """The entries read (and checked) by :meth:`open`, handed over once: the second
        call, or one on a ledger not made by :meth:`open`, raises :class:`LedgerError`.

        Saves reading a long ledger a second time on resume; entries appended since
        :meth:`open` are not in it (they are the caller's own).
        """
        if self._loaded is None:
            raise LedgerError(f"{self._path}: the entries read at open were already taken")
        loaded, self._loaded = self._loaded, None
        return loaded

    def entries(self) -> list[LedgerEntry]:
        """Every entry in the file, in order (a torn last line is skipped with a warning)."""
        data = self._path.read_bytes()
        if data[data.rfind(b"\n") + 1:]:
            warnings.warn(f"{self._path}: ignoring a torn last line", TornLineWarning, stacklevel=2)
        return _parse(data, self._path)[1]

    def events(self) -> list[Any]:
        """Every event in the file, in order."""
        return [entry.event for entry in self.entries()]

    def close(self) -> None:
        """Close the file. Idempotent."""
        self._loaded = None
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
            events = [entry.event for entry in opened.take_loaded()]
    for event in events:
        accountant.add(event)
    return accountant

"""Durable, append-only, hash-chained privacy ledger: ``ledger.jsonl``, one upload per line.

Each :meth:`Ledger.append` writes one complete line, flushes and ``fsync``s before returning,
so an event is durable once ``append`` returns. A crash during ``append`` can leave a *torn*
last line (no trailing newline): on :meth:`Ledger.open` it is detected, reported with a
:class:`TornLineWarning`, copied aside to ``<ledger>.torn`` for inspection and cut off, so
the next append starts on a fresh line. Complete lines are never rewritten; a complete line
that does not parse is corruption, not a crash artefact, and raises :class:`LedgerError`.

Format (``ledger-header/v2``). The first line is the header: ``{"type":
"ledger-header/v2", "writer": ..., <pinned values>}`` (what the ledger was opened for:
target, delta, accounting, unit and, from the runner, the resolved configuration; reopening
with another header is refused, naming the key, dotted for nested values). Every other line
is one event's JSON (its ``type`` tag selects the event class, see :data:`EVENT_TYPES`) plus
``nonce`` (the unique id of the transmission, which the runner's write-ahead intent carries
too), ``prev`` (the previous line's seal), ``writer`` (a random id drawn by each
:meth:`Ledger.open`) and, as the last member, ``sha256``: the seal, the hex sha256 of the
line's bytes up to ``,"sha256":"``. Keys are sorted but for the seal; no spaces.

Guarantees. On every open the whole chain is checked: an edited line fails its seal, a
deleted, inserted or reordered line breaks the chain at the next line; the error names the
line and what is wrong. Before every append (under an ``flock`` of the file, held for the
append only) and before a transmission is authorized (:meth:`check_tail`), a writer checks
that the file still ends with the line it last read or wrote: a line written by another
process, or a deleted, replaced, truncated or rewritten file, raises :class:`LedgerError`,
so a second writer stops before its next transmission. What it does *not* protect against:
whoever rewrites the whole chain consistently (recomputing every seal) or cuts lines off the
end (the chain cannot tell; the run's metrics are checked against the ledger on resume); it
is tamper-evidence against accidental or naive edits and concurrent writers, not a
signature.

Old ledgers: a ``ledger-header/v1`` ledger, or one whose first line has no seal, has no
chain. It is read as before (reports, :func:`rebuild_accountant`), but appending to it, or
opening it with a header (resuming its run), is refused with a message saying why.

Lines are read by :class:`~testbed.core.privacy.ledger_parse.LineParser`: lines that differ
from an earlier one only in round, device, nonce and prev are read through that line's
template (a million lines in seconds), every other line by the full JSON parse, which alone
reports corruption. :meth:`Ledger.open` keeps what it read for :meth:`Ledger.take_loaded`,
so a resume reads the file once.
"""

from __future__ import annotations

import json
import os
import secrets
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from testbed.core.privacy.accountants.accountant import PrivacyAccountant
from testbed.core.privacy.event_types import EVENT_CLASSES, PrivacyEvent, by_type_tag
from testbed.core.privacy.events import UploadEvent
from testbed.core.privacy.ledger_file import TornLineWarning, cut_torn, flocked, writer_of
from testbed.core.privacy.ledger_parse import (
    CHAIN_FIELDS,
    GENESIS,
    LEGACY_HEADER_TYPES,
    LedgerEntry,
    LedgerError,
    LineParser,
    seal,
)
from testbed.core.privacy.ledger_verified import (
    NOTE_EVERY,
    PrefixHash,
    Verified,
    read_verified,
    write_verified,
)
from testbed.core.runs.durable import fsync_dir

__all__ = [
    "EVENT_TYPES",
    "HEADER_TYPE",
    "LEGACY_HEADER_TYPES",
    "Ledger",
    "LedgerEntry",
    "LedgerError",
    "TornLineWarning",
    "intents_path",
    "rebuild_accountant",
]

#: Type tag of the header line (the first line) of a chained ledger.
HEADER_TYPE = "ledger-header/v2"


#: Event classes the ledger can hold, by their JSON ``type`` tag (those of
#: :data:`~testbed.core.privacy.event_types.EVENT_CLASSES`).
EVENT_TYPES: dict[str, type[PrivacyEvent]] = by_type_tag(EVENT_CLASSES)


def intents_path(ledger_path: Path) -> Path:
    """The write-ahead journal next to a ledger: ``<ledger stem>.intents.jsonl``."""
    return ledger_path.with_name(ledger_path.stem + ".intents.jsonl")


def _mismatch(found: dict[str, Any], wanted: dict[str, Any],
              prefix: str = "") -> tuple[str, Any, Any] | None:
    """The first key (dotted, in sorted order) whose value differs, with both values."""
    for key in sorted(set(found) | set(wanted)):
        old, new = found.get(key), wanted.get(key)
        if isinstance(old, dict) and isinstance(new, dict):
            inner = _mismatch(old, new, f"{prefix}{key}.")
            if inner is not None:
                return inner
        elif old != new:
            return f"{prefix}{key}", old, new
    return None


@dataclass
class _Tail:
    """What a writer last read or wrote: where the file ended and the chain's state."""

    size: int
    lines: int
    last_line: bytes | None
    tail: bytes
    chained: bool | None


class Ledger:
    """An open ledger file. Use :meth:`open`; close it (or use ``with``) when done."""

    def __init__(
        self, path: Path, handle: IO[bytes], count: int, header: dict[str, Any] | None,
        loaded: list[LedgerEntry] | None = None, *, state: _Tail | None = None,
        header_type: str | None = None,
    ) -> None:
        self._path = path
        self._handle: IO[bytes] | None = handle
        self._count = count
        self._header = header
        self._header_type = header_type
        self._loaded = loaded
        if state is None:
            size = os.fstat(handle.fileno()).st_size
            state = _Tail(size, 0, None, GENESIS.encode("ascii"), None)
        self._state = state
        #: This process's id in the lines it writes (new at every open).
        self.writer = secrets.token_hex(8)
        #: sha256 of the file's first ``state.size`` bytes, all checked or written here
        #: (None: not kept); noted beside the ledger (:mod:`.ledger_verified`)
        self._checked: Any = None
        self._unnoted = 0  # appends since the last note

    @classmethod
    def open(
        cls, path: str | os.PathLike[str], *, header: dict[str, Any] | None = None
    ) -> Ledger:
        """Open (creating if absent) the ledger at ``path`` for appending.

        Validates every complete line and the hash chain; a torn last line is warned about,
        saved to ``<path>.torn`` and cut off. The entries read are kept until
        :meth:`take_loaded` or :meth:`close`.

        Parameters
        ----------
        header
            What this ledger is for (JSON values; nested objects are compared key by key).
            A new or empty ledger gets it as its first line; an existing ledger must carry
            the same header.

        Raises
        ------
        LedgerError
            If a complete line is not a valid event or breaks the chain, the header differs,
            or a header is asked of a ledger from before the chain (``ledger-header/v1``).
        """
        p = Path(path)
        if p.is_dir():
            raise LedgerError(f"{p}: is a directory, expected a ledger file")
        created = not p.exists()
        handle = open(p, "a+b")  # noqa: SIM115 - kept open for the ledger's lifetime
        try:
            with flocked(handle, p):
                ledger = cls._read(p, handle, header)
            if created:
                fsync_dir(p.parent if str(p.parent) else Path("."))
        except BaseException:
            handle.close()
            raise
        return ledger

    @classmethod
    def _read(cls, p: Path, handle: IO[bytes], header: dict[str, Any] | None) -> Ledger:
        """:meth:`open` under the file's lock."""
        handle.seek(0)
        data = handle.read()
        torn = data[data.rfind(b"\n") + 1:]
        size = len(data) - len(torn)
        # The seals its writer already checked are checked by one hash (.ledger_verified)
        hashing = PrefixHash(data, size, read_verified(p))
        known = hashing.skip_lines
        parser = LineParser(p, EVENT_TYPES, HEADER_TYPE)
        try:
            entries: list[LedgerEntry] | None = parser.parse(data, seals_known=known)
        except LedgerError:
            if not known:
                raise
            entries = None  # read again below, every seal computed: the error is that read's
        prefix_ok, whole = hashing.result()
        if known and (entries is None or not prefix_ok):
            entries = None
            parser = LineParser(p, EVENT_TYPES, HEADER_TYPE)
            entries = parser.parse(data)
        assert entries is not None
        del data
        if torn:
            cut_torn(p, handle, torn)
        state = _Tail(size, parser.lines, parser.last_line, parser.tail, parser.chained)
        ledger = cls(p, handle, len(entries), parser.header, entries, state=state,
                     header_type=parser.header_type)
        if parser.chained or size == 0:  # not an old, unchained ledger
            ledger._checked = whole
            ledger._note()
        if header is not None:
            ledger._pin(header)
        return ledger

    def _pin(self, header: dict[str, Any]) -> None:
        """Write ``header`` to an empty ledger, or check it against the one found."""
        p, found, n = self._path, self._header, self._count
        wanted = json.loads(json.dumps(header))
        if self._header_type in LEGACY_HEADER_TYPES or (found is None and n and
                                                         self._state.chained is False):
            raise LedgerError(
                f"{p}: was written before ledgers carried a hash chain "
                f"({self._header_type or 'no header'}); it stays readable (reports, "
                "rebuild_accountant) but cannot be continued: finish the run with the testbed "
                "version that started it, or start a new run")
        if found is None and n:
            raise LedgerError(
                f"{p}: holds {n} events but no header; it was not written for this run "
                f"(expected {wanted})"
            )
        if found is None:
            if any(key in wanted for key in ("type", *CHAIN_FIELDS)):
                raise ValueError(f"header: the keys 'type' and {CHAIN_FIELDS} are reserved")
            self._write({"type": HEADER_TYPE, **wanted})
            self._header, self._header_type = wanted, HEADER_TYPE
            return
        diff = _mismatch(found, wanted)
        if diff is not None:
            key, old, new = diff
            raise LedgerError(
                f"{p}: was written with {key}={old!r}, but this run has {key}={new!r}; "
                "refusing to mix them"
            )

    @property
    def path(self) -> Path:
        """The ledger file."""
        return self._path

    @property
    def header(self) -> dict[str, Any] | None:
        """The header line's values (``None`` for a ledger without one)."""
        return None if self._header is None else dict(self._header)

    @property
    def header_type(self) -> str | None:
        """The header line's type tag (``None`` for a ledger without one)."""
        return self._header_type

    def __len__(self) -> int:
        return self._count

    def append(self, event: PrivacyEvent, nonce: str | None = None, *, adopt: bool = False
               ) -> None:
        """Write ``event`` (with its transmission ``nonce``) as one chained line; durable
        (flushed and fsynced) when this returns.

        First checks, under the file's lock, that the file still ends with the line this
        ledger last read or wrote (see :meth:`check_tail`).

        Parameters
        ----------
        adopt
            For the record of an upload that already went on air: when another writer has
            appended since, read its lines (checking them), append this record after them
            unless one of them already carries ``nonce``, and *then* raise
            :class:`LedgerError`. Without it nothing is written and the error is raised.
        """
        if self._handle is None:
            raise LedgerError(f"{self._path}: ledger is closed")
        if EVENT_TYPES.get(getattr(event, "TYPE", "")) is not type(event):
            raise TypeError(f"append: not a registered event type: {type(event).__name__}")
        self._refuse_legacy()
        data = event.to_dict()
        if nonce is not None:
            data["nonce"] = str(nonce)
        with flocked(self._handle, self._path):
            problem = self._foreign()
            if problem is not None:
                message, adoptable = problem
                if not (adopt and adoptable):
                    raise LedgerError(message)
                theirs = self._adopt()
                if nonce is None or all(entry.nonce != nonce for entry in theirs):
                    self._write(data)
                    self._count += 1
                raise LedgerError(f"{message}; this upload is recorded after its lines")
            self._write(data)
            self._count += 1

    def check_tail(self) -> None:
        """Raise :class:`LedgerError` unless the file still ends with the line this ledger
        last read or wrote: another writer appended (or the file was deleted, replaced,
        truncated or rewritten). Called before a transmission is authorized."""
        if self._handle is None:
            raise LedgerError(f"{self._path}: ledger is closed")
        with flocked(self._handle, self._path):
            problem = self._foreign()
        if problem is not None:
            raise LedgerError(problem[0])

    def _refuse_legacy(self) -> None:
        if self._state.chained is False:
            raise LedgerError(
                f"{self._path}: was written before ledgers carried a hash chain "
                f"({self._header_type or 'no header'}); it can be read, not continued")

    def _write(self, data: dict[str, Any]) -> None:
        """Append ``data`` as one sealed line chained to the tail (under the lock)."""
        assert self._handle is not None
        state = self._state
        if data.get("type") != HEADER_TYPE:
            data["prev"] = state.tail.decode("ascii")
        data["writer"] = self.writer
        text = json.dumps(data, sort_keys=True, separators=(",", ":"))
        line = seal(text[:-1].encode("utf-8"))
        self._handle.write(line)
        self._handle.flush()
        os.fsync(self._handle.fileno())
        state.size += len(line)
        state.lines += 1
        state.last_line = line
        state.tail = line[-67:-3]
        state.chained = True
        if self._checked is not None:
            self._checked.update(line)
            self._unnoted += 1
            if self._unnoted >= NOTE_EVERY:
                self._note()

    def _note(self) -> None:
        """Note beside the ledger what this writer checked or wrote (.ledger_verified)."""
        state = self._state
        if self._checked is not None and state.size > 0 and state.lines > 0:
            write_verified(self._path, Verified(state.size, state.lines,
                                                self._checked.hexdigest()))
        self._unnoted = 0

    def _foreign(self) -> tuple[str, bool] | None:
        """What changed in the file since this ledger last read or wrote it (a message and
        whether the change is another writer's appended lines), or ``None``."""
        assert self._handle is not None
        p, state = self._path, self._state
        fd = self._handle.fileno()
        mine = os.fstat(fd)
        stop = "another process is using this run; stopping before the next transmission"
        try:
            there = os.stat(p)
        except FileNotFoundError:
            return (f"{p}: was deleted while this process (writer {self.writer}) had it "
                    f"open; {stop}"), False
        if (there.st_dev, there.st_ino) != (mine.st_dev, mine.st_ino):
            return (f"{p}: was replaced by another file while this process had it open; "
                    f"{stop}"), False
        if mine.st_size < state.size:
            return (f"{p}: was truncated from {state.size} to {mine.st_size} bytes by another "
                    f"process; {stop}"), False
        last = state.last_line
        if last is not None and os.pread(fd, len(last), state.size - len(last)) != last:
            return f"{p}: line {state.lines} was rewritten by another process; {stop}", False
        if mine.st_size > state.size:
            head = os.pread(fd, min(4096, mine.st_size - state.size), state.size)
            return (f"{p}: line {state.lines + 1} was written by another writer "
                    f"({writer_of(head)}), not by this process (writer {self.writer}): "
                    f"{stop}"), True
        return None

    def _adopt(self) -> list[LedgerEntry]:
        """Read (and check) the lines another writer appended; the tail moves past them."""
        assert self._handle is not None
        state = self._state
        self._handle.seek(state.size)
        data = self._handle.read()
        data = data[:data.rfind(b"\n") + 1]
        parser = LineParser(self._path, EVENT_TYPES, HEADER_TYPE)
        parser.resume_after(chained=True, lines=state.lines, last_line=state.last_line,
                            tail=state.tail)
        theirs = parser.parse(data)
        if self._checked is not None:
            self._checked.update(data)  # checked by the parse
        state.size += len(data)
        state.lines, state.last_line, state.tail = parser.lines, parser.last_line, parser.tail
        self._count += len(theirs)
        return theirs

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
        return LineParser(self._path, EVENT_TYPES, HEADER_TYPE).parse(data)

    def events(self) -> list[PrivacyEvent]:
        """Every event in the file, in order."""
        return [entry.event for entry in self.entries()]

    def close(self) -> None:
        """Close the file. Idempotent."""
        self._loaded = None
        if self._handle is not None:
            if self._unnoted:
                self._note()
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
        if not isinstance(event, UploadEvent):  # a record-level ledger
            raise TypeError(f"add: expected an UploadEvent, got {type(event).__name__}")
        accountant.add(event)
    return accountant

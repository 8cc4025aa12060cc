"""What a ledger's writer last knew to be checked: ``<ledger>.verified``, so that a resume
need not compute every line's seal again.

Every line of a ledger carries its seal, the sha256 of its bytes (:mod:`.ledger`); reading
a long ledger computes 10^6 of them (about a fifth of a replay). Yet most of a resumed
ledger is bytes its writer already checked or wrote. The writer therefore notes, beside
the ledger, ``{"bytes": L, "lines": n, "sha256": H}``: the first ``L`` bytes (``n``
complete, non-empty lines) were checked or written by it, and their sha256 is ``H``.

On open, when such a note is there and covers no more than the ledger's complete lines:

* a thread computes the sha256 of the first ``L`` bytes as they are now (one call; hashlib
  releases the interpreter's lock for it, so it runs beside the parse), and counts their
  lines (they must be ``n``, none empty);
* the parse skips the seal of the lines it reads in runs of one shape among the first
  ``n`` (:meth:`~testbed.core.privacy.ledger_shape.Shapes.read_run`); every other check,
  and every later line, is as always;
* if the hash or the count differs, or the parse fails, the ledger is read again with every
  seal computed: the result, or the error naming the first bad line, is then exactly that
  of a read without the note.

Why skipping those seals accepts only what computing them would: equal sha256 means the
first ``L`` bytes are the bytes whose every line was checked or sealed when the note was
made (finding other bytes with the same sha256 is as hard as forging a line's own seal), so
each of their lines carries its correct seal. The note is a cache: deleting it, or a stale
or damaged one, costs time, never a check. It adds nothing an editor of the ledger could
not already do (the chain is not a signature: :mod:`.ledger`'s "Guarantees").

The note is written (to a temporary name, then renamed; no fsync: losing it costs only
time) when a ledger has been opened and checked, every :data:`NOTE_EVERY` appends, and at
close.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

#: The writer notes what it checked or wrote every this many appends (and at close).
NOTE_EVERY = 1024
#: Bytes scanned for newlines at a time.
_SCAN = 1 << 23


@dataclass(frozen=True)
class Verified:
    """A note: the first ``bytes`` bytes, ``lines`` complete non-empty lines, hash to
    ``sha256`` (hex) and were checked."""

    bytes: int
    lines: int
    sha256: str


def verified_path(ledger_path: Path) -> Path:
    """Where the note of ``ledger_path`` is kept: ``<ledger>.verified``."""
    return ledger_path.with_name(ledger_path.name + ".verified")


def read_verified(ledger_path: Path) -> Verified | None:
    """The note of ``ledger_path``; ``None`` when there is none or it is not a valid note."""
    try:
        raw = json.loads(verified_path(ledger_path).read_bytes())
        note = Verified(raw["bytes"], raw["lines"], raw["sha256"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not (type(note.bytes) is int and type(note.lines) is int and note.bytes > 0
            and note.lines > 0 and isinstance(note.sha256, str) and len(note.sha256) == 64):
        return None
    return note


def write_verified(ledger_path: Path, note: Verified) -> None:
    """Write the note of ``ledger_path`` (atomically; a folder that cannot be written leaves
    no note, which only costs a later open time)."""
    target = verified_path(ledger_path)
    text = json.dumps({"bytes": note.bytes, "lines": note.lines, "sha256": note.sha256})
    with contextlib.suppress(OSError):
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.",
                                   suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="ascii") as f:
                f.write(text)
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise


class PrefixHash:
    """The sha256 of a ledger's complete lines, computed in a thread while they are parsed,
    and whether they start with the bytes a note describes.

    Parameters
    ----------
    data
        The ledger's bytes as read.
    complete
        How many of them are complete lines (the torn last line left out).
    note
        The ledger's note (:func:`read_verified`), or ``None``; used only when it covers
        at most ``complete`` bytes.
    """

    def __init__(self, data: bytes, complete: int, note: Verified | None) -> None:
        self.note = note if note is not None and note.bytes <= complete else None
        self._data, self._complete = data, complete
        self._hash = hashlib.sha256()
        self._prefix_ok = self._done = False
        self._thread = threading.Thread(target=self._run, daemon=True, name="ledger-hash")
        self._thread.start()

    @property
    def skip_lines(self) -> int:
        """Lines whose seals the parse may leave to this check (0: none)."""
        return self.note.lines if self.note is not None else 0

    def _run(self) -> None:
        view = memoryview(self._data)
        try:
            note = self.note
            at = 0
            if note is not None:
                self._hash.update(view[:note.bytes])
                self._prefix_ok = (self._hash.hexdigest() == note.sha256
                                   and _lines_end_at(self._data, note.bytes) == note.lines)
                at = note.bytes
            self._hash.update(view[at:self._complete])
            self._done = True
        finally:
            view.release()

    def result(self) -> tuple[bool, hashlib._Hash | None]:
        """``(whether the note's bytes are there as noted, the hash of every complete
        line)``, once the thread is done. Without a note the first is ``False``; if the
        thread failed, ``(False, None)``: no note is kept from it."""
        self._thread.join()
        if not self._done:
            return False, None
        return self._prefix_ok, self._hash


def _lines_end_at(data: bytes, end: int) -> int:
    """How many lines ``data[:end]`` holds when they are all complete and non-empty
    (``data[end - 1]`` is a newline), else -1. In numpy, which releases the interpreter's
    lock for most of it (the bytes' own ``count`` and ``find`` would hold it)."""
    if end <= 0 or data[end - 1:end] != b"\n":
        return -1
    codes = np.frombuffer(data, dtype=np.uint8, count=end)
    lines, before = 0, -1  # the last newline seen (-1: the start)
    for c0 in range(0, end, _SCAN):
        at = np.flatnonzero(codes[c0:c0 + _SCAN] == 10)  # b"\n"
        if at.size == 0:
            continue
        at += c0
        if at[0] == before + 1 or (at.size > 1 and bool(np.any(np.diff(at) == 1))):
            return -1  # an empty line
        lines += int(at.size)
        before = int(at[-1])
    return lines

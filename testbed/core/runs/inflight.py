"""Kept uploads of the round under way (``RUN/inflight/``), written as a group commit.

A resumed round reuses the uploads the aggregator had received and recorded before the
crash instead of asking for them again (:meth:`testbed.core.runs.rundir.RunDir.load_inflight`).
They are kept in *segments*, ``inflight/r<round>-s<k>.kept``: one per round and process
(a resumed process starts the next ``k``), each a sequence of records appended with one
``write(2)`` each and **no fsync each**. A *group commit* (:meth:`KeptLog.sync`) makes
every record written so far durable with one ``fsync`` of the segment (and, the first time,
of the directory entries that lead to it); the round loop calls it once per batch of
uploads (:data:`SYNC_UPLOADS`, :data:`SYNC_BYTES`) and once after the round's last upload.

Record layout (little-endian)::

    header   "KEPT", kind (1 byte), 3 zero bytes, round, key, info_len, n_values (int64 each)
    info     info_len bytes: the upload's metrics entry, strict JSON (an object)
    values   n_values float64: the decoded differential (n_values = -1: none, a lost upload)
    seal     sha256 of the header, info and values (32 bytes)

An upload record (kind 1) has ``key`` = the device. A *sync mark* (kind 2), appended right
after each group fsync, has ``key`` = the number of bytes of the segment that the fsync made
durable, no info and ``n_values`` = -1.

Invariant (what a resume may rely on):

1. **The ledger first.** An upload is kept only after its ledger record is durable
   (:meth:`testbed.core.privacy.book.PrivacyBook.commit` fsyncs the ledger line before the
   round loop keeps the upload), so no kept record, durable or not, ever exists for an
   upload whose charge is not durable: a resume that reuses a kept upload without charging
   it again never uses an uncharged one. Deferring the kept copy's fsync changes nothing
   here; only the ledger's fsync orders the two, and it is per upload as before. (The
   other way round never held and is not needed: a ledger record durable without its kept
   copy is the state of a crash at ``after_commit``, see 2.)
2. **Complete or absent.** A record is reused only when its seal checks, so a record torn
   by a crash (a kill during its ``write``, or a power cut that lost part of what was not
   yet fsynced) is never read as an upload. Such a record and every record after it in its
   segment are dropped: their devices are charged but not kept, exactly the state of a
   crash between the ledger record and the keep (fault point ``after_commit``), which the
   resume already handles: such an upload is lost for the round, charged once and never
   asked for again (:mod:`aggregator.resumed_round`).
3. **Nothing written is lost to a kill.** Records go to the file with ``write(2)`` on an
   unbuffered descriptor, so once :meth:`KeptLog.append` returns the record is in the
   kernel and survives ``kill -9`` of this process (fault points ``after_inflight`` and
   ``before_inflight_sync``); only a power cut or a kernel crash before the group fsync
   can lose it, and then (2) applies.
4. **Durable means durable.** Once :meth:`KeptLog.sync` returns, the records survive a
   power cut (a clean stop, :meth:`testbed.core.runs.rundir.RunDir.close`, syncs too). A record
   that fails its seal inside the part a later, intact sync mark says was fsynced is
   corruption, not a crash artefact: reading refuses it, naming the file (as an unreadable
   kept upload always was). Where no such mark follows, it is read as a torn tail (2):
   dropping a kept upload never leaves an upload uncounted; at worst its update is lost
   for the round.

Uploads kept by earlier versions, one ``inflight/r<round>-d<device>.npz`` each (written with
a fsync each), are still read.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
from pathlib import Path
from typing import Any

import numpy as np

from testbed.core.runs.durable import fsync_dir

#: Sync the segment after this many uploads were written since the last sync ...
SYNC_UPLOADS = 256
#: ... or this many bytes (a large model's uploads are ~10 MB each), whichever comes first.
SYNC_BYTES = 64 * 2**20

MAGIC = b"KEPT"
KIND_UPLOAD = 1
KIND_MARK = 2
_HEADER = struct.Struct("<4sB3xqqqq")
_SEAL_LEN = 32

#: Names of kept uploads in ``inflight/``: a segment ``r<round>-s<k>.kept``, or one upload
#: ``r<round>-d<device>.npz`` of an earlier version.
SEGMENT_NAME = re.compile(r"r(0|[1-9][0-9]*)-s(0|[1-9][0-9]*)\.kept")
NPZ_NAME = re.compile(r"r(0|[1-9][0-9]*)-d(0|[1-9][0-9]*)\.npz")

Kept = tuple[np.ndarray | None, dict[str, Any]]

#: What removing an unreadable kept file does (the advice of every :class:`KeptError` that
#: names one): its uploads stay charged in the ledger and are lost for the round, never
#: asked for again (:mod:`aggregator.resumed_round`).
REMOVE_ADVICE = ("remove the file to resume: the uploads it kept stay charged in the ledger "
                 "and are lost for the round (never sent or charged again)")


class KeptError(RuntimeError):
    """A kept upload cannot be read (one line, naming the file)."""


def record_parts(kind: int, round_index: int, key: int, info: bytes,
                 values: np.ndarray | None) -> list[bytes | memoryview]:
    """The pieces of one sealed record, in order (see the module docstring): the values are
    not copied; ``values``: float64 ``(n,)`` or None."""
    if values is None:
        body: bytes | memoryview = b""
        n_values = -1
    else:
        array = np.ascontiguousarray(values, dtype="<f8")
        body, n_values = array.data.cast("B"), array.size
    head = _HEADER.pack(MAGIC, kind, round_index, key, len(info), n_values)
    digest = hashlib.sha256(head)
    digest.update(info)
    digest.update(body)
    return [head, info, body, digest.digest()]


def encode_record(kind: int, round_index: int, key: int, info: bytes,
                  values: np.ndarray | None) -> bytes:
    """One sealed record as bytes (:func:`record_parts` joined)."""
    return b"".join(record_parts(kind, round_index, key, info, values))


class KeptLog:
    """The segment this process appends round ``round_index``'s kept uploads to.

    Parameters
    ----------
    directory
        ``RUN/inflight`` (created if absent).
    round_index
        The round whose uploads it keeps.
    """

    def __init__(self, directory: Path, round_index: int) -> None:
        self.round = round_index
        self.created_directory = not directory.is_dir()
        directory.mkdir(exist_ok=True)
        taken = [k for t, k, _ in segments(directory) if t == round_index]
        self.path = directory / f"r{round_index}-s{max(taken, default=-1) + 1}.kept"
        self._fd: int | None = os.open(
            self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC, 0o644)
        self.size = 0
        self.synced = 0
        self.pending_uploads = 0
        self.pending_bytes = 0
        self._entry_synced = False

    def append(self, device: int, values: np.ndarray | None, info_json: str) -> None:
        """Write one upload's record (in the kernel when this returns; not fsynced)."""
        self._write(record_parts(KIND_UPLOAD, self.round, device, info_json.encode(), values))
        self.pending_uploads += 1

    def due(self) -> bool:
        """Whether the uploads written since the last sync make a batch."""
        return self.pending_uploads >= SYNC_UPLOADS or self.pending_bytes >= SYNC_BYTES

    def sync(self) -> None:
        """Group commit: one fsync makes every record written so far durable (the first one
        also fsyncs the directory entries of the segment and of ``inflight/``); then a sync
        mark records how much is durable. Nothing to do when no upload was written since."""
        from testbed.core.runs.faults import fault_point

        if self._fd is None or self.pending_uploads == 0:
            return
        fault_point("before_inflight_sync")
        os.fsync(self._fd)
        if not self._entry_synced:
            fsync_dir(self.path.parent)
            if self.created_directory:
                fsync_dir(self.path.parent.parent)
            self._entry_synced = True
        self.synced = self.size
        self.pending_uploads = 0
        self._write(record_parts(KIND_MARK, self.round, self.synced, b"", None))
        self.pending_bytes = 0

    def close(self) -> None:
        """Close the segment (what was written stays; call :meth:`sync` first to make it
        durable). Idempotent."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _write(self, parts: list[bytes | memoryview]) -> None:
        """Append one record (one ``writev`` unless the kernel takes less at a time)."""
        if self._fd is None:
            raise OSError(f"{self.path}: closed")
        total = sum(len(part) for part in parts)
        done = os.writev(self._fd, parts)
        if done < total:
            rest = memoryview(b"".join(parts))[done:]
            while rest:
                rest = rest[os.write(self._fd, rest):]
        self.size += total
        self.pending_bytes += total


def segments(directory: Path) -> list[tuple[int, int, Path]]:
    """``(round, k, file)`` of every segment in ``directory``, sorted."""
    return _named(directory, SEGMENT_NAME)


def npz_files(directory: Path) -> list[tuple[int, int, Path]]:
    """``(round, device, file)`` of every upload an earlier version kept in a file of its
    own, sorted."""
    return _named(directory, NPZ_NAME)


def _named(directory: Path, pattern: re.Pattern[str]) -> list[tuple[int, int, Path]]:
    """``(first number, second number, file)`` of the files in ``directory`` whose names
    match ``pattern``; other names (a temporary file left by a crash during a write, a
    stray file) are ignored."""
    if not directory.is_dir():
        return []
    found = []
    for f in directory.iterdir():
        match = pattern.fullmatch(f.name)
        if match is not None:
            found.append((int(match.group(1)), int(match.group(2)), f))
    return sorted(found)


def read_npz(f: Path) -> Kept:
    """One upload an earlier version kept in a file of its own: ``(decoded or None, info)``;
    refuses an unreadable or odd file (:class:`KeptError`)."""
    try:
        with np.load(f, allow_pickle=False) as z:
            info = json.loads(bytes(z["info"]).decode())
            vec = z["decoded"].copy() if "decoded" in z.files else None
    except Exception as exc:  # noqa: BLE001 - any unreadable file is the same error
        reason = str(exc).splitlines()[0] if str(exc) else ""
        raise KeptError(
            f"{f}: unreadable in-flight upload ({type(exc).__name__}: {reason}); {REMOVE_ADVICE}"
        ) from None
    if not isinstance(info, dict):
        raise KeptError(f"{f}: in-flight upload whose info is not a JSON object")
    if vec is not None and (vec.ndim != 1 or vec.dtype.kind != "f"):
        raise KeptError(
            f"{f}: in-flight upload whose decoded differential is not a 1-D float array "
            f"(shape {vec.shape}, dtype {vec.dtype})"
        )
    return vec, info


def read_segment(f: Path, round_index: int) -> dict[int, Kept]:
    """The complete upload records of segment ``f`` (of round ``round_index``), by device;
    a torn tail is dropped (see the module docstring, invariant 2).

    Raises
    ------
    KeptError
        The file cannot be read, a record in its fsynced part is corrupt, bytes that are
        neither a record nor a torn one (a record's start, or zeros) follow the last
        record, or a sealed record is not a kept upload of this round.
    """
    try:
        data = f.read_bytes()
    except OSError as exc:
        raise KeptError(f"{f}: unreadable kept uploads ({exc.strerror or exc})") from None
    out: dict[int, Kept] = {}
    pos = 0
    while pos < len(data):
        record = _sealed_record(data, pos)
        if record is None:
            if _durable_after(data, pos, round_index) > pos:
                raise KeptError(
                    f"{f}: kept upload at byte {pos} is corrupt although it was fsynced; "
                    f"{REMOVE_ADVICE}")
            if not (MAGIC.startswith(data[pos:pos + len(MAGIC)])
                    or not data[pos:].strip(b"\0")):
                raise KeptError(
                    f"{f}: byte {pos} starts neither a kept upload nor one torn by a crash "
                    f"(a record starts with {MAGIC!r}); {REMOVE_ADVICE}")
            break  # torn by a crash before the group fsync: dropped, see invariant 2
        kind, rnd, key, info, values, end = record
        if rnd != round_index or kind not in (KIND_UPLOAD, KIND_MARK):
            raise KeptError(f"{f}: record at byte {pos} is not a kept upload of round "
                            f"{round_index} (kind {kind}, round {rnd})")
        if kind == KIND_MARK and not 0 <= key <= pos:
            raise KeptError(f"{f}: sync mark at byte {pos} claims {key} durable bytes")
        if kind == KIND_UPLOAD:
            if key < 0:
                raise KeptError(f"{f}: record at byte {pos} names device {key}")
            out[key] = (values, _info(f, pos, info))
        pos = end
    return out


def _durable_after(data: bytes, pos: int, round_index: int) -> int:
    """The most bytes any sync mark after ``pos`` says were fsynced (0: none found). Only
    read past a record that fails its seal, to tell corruption of fsynced records from a
    crash's torn tail: the marks are found by their magic and their seals."""
    best = 0
    at = data.find(MAGIC, pos + 1)
    while at != -1:
        record = _sealed_record(data, at)
        if record is not None and record[0] == KIND_MARK and record[1] == round_index:
            best = max(best, record[2])
        at = data.find(MAGIC, at + 1 if record is None else record[5])
    return best


def _sealed_record(data: bytes, pos: int
                   ) -> tuple[int, int, int, bytes, np.ndarray | None, int] | None:
    """``(kind, round, key, info, values, end)`` of the record at ``pos`` if it is complete
    and its seal checks, else ``None``."""
    if len(data) - pos < _HEADER.size + _SEAL_LEN:
        return None
    magic, kind, rnd, key, info_len, n_values = _HEADER.unpack_from(data, pos)
    if magic != MAGIC or info_len < 0 or n_values < -1:
        return None
    start = pos + _HEADER.size
    end = start + info_len + 8 * max(n_values, 0)
    if end + _SEAL_LEN > len(data):
        return None
    view = memoryview(data)
    if hashlib.sha256(view[pos:end]).digest() != data[end:end + _SEAL_LEN]:
        return None
    info = data[start:start + info_len]
    values = (None if n_values < 0 else
              np.frombuffer(data, dtype="<f8", count=n_values, offset=start + info_len)
              .astype(np.float64))
    return kind, rnd, key, info, values, end + _SEAL_LEN


def _info(f: Path, pos: int, raw: bytes) -> dict[str, Any]:
    try:
        info = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        info = None
    if not isinstance(info, dict):
        raise KeptError(f"{f}: kept upload at byte {pos} whose info is not a JSON object")
    return info

"""The run directory: resolved config, metrics, checkpoint, summary; crash-safe writes.

Layout::

    RUN/config.yaml        resolved experiment config (every key)
    RUN/hw_config.yaml     resolved hardware config
    RUN/meta.json          seeds, versions, start time, link
    RUN/run_secret         256-bit mask secret (mode 0600), shared with the devices
    RUN/metrics.jsonl      one JSON line per completed round, appended and fsynced
    RUN/ledger.jsonl       privacy ledger (DP schemes), appended and fsynced
    RUN/checkpoint.npz     global model and metrics line of the last completed round
                           (atomic replace)
    RUN/inflight/          uploads received in the round under way, sealed records in one
                           segment per round and process, made durable by a group commit
                           (testbed.core.runs.inflight), so a resumed round reuses them instead of
                           re-transmitting
    RUN/summary.json       written at the end (or on interruption), atomic replace
    RUN/.lock              who holds the directory's lock (pid, host, since); the lock
                           itself is an flock on the directory RUN, held by the one process
                           using it, which deleting .lock cannot take away

Files are only appended or atomically replaced, so a crash or Ctrl-C at any point leaves
every file either in its previous or its new complete state (a torn last line of a JSONL
file, or torn last records of an ``inflight/`` segment, are dropped on reading). A round is
committed by writing the checkpoint (which carries the round's metrics line) and then
appending the metrics line; a crash between the two is rolled forward on resume from the
checkpoint.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import platform
import shutil
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from testbed.core.runs.durable import fsync_dir
from testbed.core.runs.inflight import (
    Kept,
    KeptError,
    KeptLog,
    npz_files,
    read_npz,
    read_segment,
    segments,
)


class RunDirError(RuntimeError):
    """The run directory cannot be used as asked (exists, missing, inconsistent)."""


def atomic_write_bytes(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` via a temporary file, fsync and rename."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def json_safe(obj: Any) -> Any:
    """``obj`` with non-finite floats as the strings ``"inf"``, ``"-inf"``, ``"nan"``.

    Python's json writes bare ``Infinity``/``NaN``, which is not JSON; an infinite epsilon
    (nothing credited) or the SNR of a noiseless channel must stay readable elsewhere.
    """
    if isinstance(obj, float) and not math.isfinite(obj):
        return "nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [json_safe(v) for v in obj]
    return obj


def dumps(obj: Any, **kwargs: Any) -> str:
    """Strict JSON text of ``obj`` (see :func:`json_safe`): ``obj`` written as it is when
    every float in it is finite (most are; walking every value first costs as much as
    writing them), else through :func:`json_safe` (the same text either way)."""
    try:
        return json.dumps(obj, allow_nan=False, **kwargs)
    except ValueError:  # a non-finite float (or a circular reference, refused again below)
        return json.dumps(json_safe(obj), allow_nan=False, **kwargs)


def atomic_write_json(path: Path, obj: Any) -> None:
    """Atomically write ``obj`` as indented, strict JSON."""
    atomic_write_bytes(path, (dumps(obj, indent=2) + "\n").encode())


def append_jsonl(path: Path, record: dict[str, Any]) -> None:
    """Append one JSON line and fsync it."""
    line = dumps(record, separators=(",", ":")) + "\n"
    with path.open("a", encoding="utf-8") as fh:
        fh.write(line)
        fh.flush()
        os.fsync(fh.fileno())


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """All complete lines of a JSONL file, each a JSON object; a torn (unparsable) last
    line is ignored.

    Raises
    ------
    RunDirError
        One line naming the file and the line, when an earlier line is not UTF-8, not
        JSON or not a JSON object (or the last line is a complete value of another shape).
    """
    if not path.exists():
        return []
    try:
        lines = path.read_bytes().splitlines()
    except OSError as exc:
        raise RunDirError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    out = []
    for i, raw in enumerate(lines):
        if not raw.strip():
            continue
        try:
            value = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            if i == len(lines) - 1:
                break  # torn by a crash during the append
            what = "not UTF-8" if isinstance(exc, UnicodeDecodeError) else "not JSON"
            raise RunDirError(
                f"{path}: line {i + 1} is corrupt ({what}; not the last line)"
            ) from None
        if not isinstance(value, dict):
            raise RunDirError(
                f"{path}: line {i + 1} is corrupt (a JSON {type(value).__name__}, expected "
                "an object)"
            )
        out.append(value)
    return out


def _lock_holder(path: Path) -> str:
    """The text a lock's holder left in ``path/.lock`` (information only)."""
    try:
        text = (path / ".lock").read_bytes()[:200].decode(errors="replace").strip()
    except OSError:
        text = ""
    return text or "unknown process"


def lock_directory(path: Path) -> int:
    """Take the exclusive lock of directory ``path``; returns the lock's descriptor.

    The lock is an ``flock`` on the directory itself (opened ``O_RDONLY | O_DIRECTORY``),
    so, unlike a lock file, it cannot be removed from under its holder: deleting
    ``path/.lock`` changes nothing. After locking, the directory at ``path`` must still be
    the one locked (not renamed away and replaced meanwhile). The kernel releases the lock
    when the holder exits or dies, so a lock left by a killed process is never mistaken for
    a live one. ``path/.lock`` only holds the holder's description (pid, host, start time),
    shown to a process that is refused.

    Raises
    ------
    RunDirError
        The directory is locked by another process, cannot be opened, or was replaced.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        raise RunDirError(f"'{path}': cannot open the directory to lock it: {exc}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise RunDirError(
            f"run directory '{path}' is in use by another process ({_lock_holder(path)}); "
            "wait for it to end or stop it first"
        ) from None
    try:
        there = os.stat(path)
    except OSError:
        there = None
    mine = os.fstat(fd)
    if there is None or (there.st_dev, there.st_ino) != (mine.st_dev, mine.st_ino):
        os.close(fd)
        raise RunDirError(f"run directory '{path}' was moved or replaced while it was locked")
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    text = f"pid {os.getpid()} on {platform.node()} since {stamp}\n".encode()
    try:
        holder = os.open(path / ".lock", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(holder, text)
        finally:
            os.close(holder)
    except OSError:
        pass  # information only: the lock is the directory's flock
    return fd


class RunDir:
    """Files of one run. Use :meth:`create` for a new run, :meth:`open` to resume.

    Both take the directory's exclusive lock, held until :meth:`close` (or process exit).
    """

    def __init__(self, path: Path, lock_fd: int | None = None) -> None:
        self.path = path
        self._lock_fd = lock_fd
        self._kept: KeptLog | None = None

    def close(self) -> None:
        """Make the kept uploads durable (:meth:`sync_kept`) and release the directory's
        lock. Idempotent. A failed fsync of the kept uploads is a warning here (the run's
        outcome stands; they are then as if the crash came before their group commit)."""
        try:
            if self._kept is not None:
                self._kept.sync()
        except OSError as exc:
            warnings.warn(f"{self.inflight_path}: the uploads kept in the round under way "
                          f"could not be made durable ({exc}); after a power cut a resume "
                          "may ask for them again", RuntimeWarning, stacklevel=2)
        finally:
            self._close_kept()
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None

    @property
    def inflight_path(self) -> Path:
        return self.path / "inflight"

    @property
    def metrics_path(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def ledger_path(self) -> Path:
        return self.path / "ledger.jsonl"

    @property
    def checkpoint_path(self) -> Path:
        return self.path / "checkpoint.npz"

    @property
    def summary_path(self) -> Path:
        return self.path / "summary.json"

    @property
    def recordings_path(self) -> Path:
        return self.path / "iq"

    @classmethod
    def create(cls, path: Path) -> RunDir:
        """Make a new, empty run directory and lock it; refuse one that holds anything."""
        if path.exists() and not path.is_dir():
            raise RunDirError(f"--out '{path}' exists and is not a directory")
        if path.exists() and any(p.name != ".lock" for p in path.iterdir()):
            raise RunDirError(
                f"run directory '{path}' already exists and is not empty; choose another "
                f"--out, or continue it with `testbed run --resume {path}`"
            )
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise RunDirError(f"--out '{path}': cannot create the directory: {exc}") from None
        fd = lock_directory(path)
        if any(p.name != ".lock" for p in path.iterdir()):  # another process got there first
            os.close(fd)
            raise RunDirError(f"run directory '{path}' was filled by another process")
        return cls(path, fd)

    @classmethod
    def open(cls, path: Path) -> RunDir:
        """Open an existing run for resuming, and lock it."""
        if path.exists() and not path.is_dir():
            raise RunDirError(f"--resume '{path}': is a file, not a run directory")
        if not path.is_dir():
            raise RunDirError(f"--resume '{path}': no such run directory")
        if not (path / "config.yaml").is_file():
            raise RunDirError(f"--resume '{path}': not a run directory (no config.yaml)")
        return cls(path, lock_directory(path))

    def remove(self) -> None:
        """Delete the whole directory (a run that never started) and release the lock."""
        self.close()
        shutil.rmtree(self.path, ignore_errors=True)

    def write_text(self, name: str, text: str, mode: int = 0o644) -> None:
        """Atomically write a text file in the run directory."""
        atomic_write_bytes(self.path / name, text.encode(), mode=mode)

    def append_metrics(self, record: dict[str, Any]) -> None:
        append_jsonl(self.metrics_path, record)

    def metrics(self) -> list[dict[str, Any]]:
        return read_jsonl(self.metrics_path)

    def save_checkpoint(self, round_index: int, weights: np.ndarray, extra: dict[str, Any]) -> None:
        """Atomically store the global model after round ``round_index`` (0-based)."""
        import io

        buf = io.BytesIO()
        np.savez(
            buf,
            round_index=np.int64(round_index),
            weights=np.asarray(weights, dtype=np.float32),
            extra=np.frombuffer(json.dumps(extra).encode(), dtype=np.uint8),
        )
        atomic_write_bytes(self.checkpoint_path, buf.getvalue())

    def load_checkpoint(self) -> tuple[int, np.ndarray, dict[str, Any]] | None:
        """``(last completed round, weights, extra)`` or ``None`` if no round completed.

        Raises
        ------
        RunDirError
            If the file exists but cannot be read (naming it).
        """
        if not self.checkpoint_path.exists():
            return None
        try:
            with np.load(self.checkpoint_path) as z:
                extra = json.loads(bytes(z["extra"]).decode())
                return int(z["round_index"]), z["weights"].copy(), extra
        except Exception as exc:  # noqa: BLE001 - any unreadable file is the same error
            raise RunDirError(
                f"{self.checkpoint_path}: unreadable checkpoint ({type(exc).__name__}: {exc})"
            ) from None

    def keep_upload(
        self, round_index: int, device: int, decoded: np.ndarray | None, info: dict[str, Any]
    ) -> None:
        """Keep device ``device``'s received upload of the round under way, for a resumed
        round to reuse; durable at the next group commit (:meth:`sync_kept`, made here when
        a batch is full, see :data:`testbed.core.runs.inflight.SYNC_UPLOADS`).

        Call it only after the upload's ledger record is durable (invariant 1 of
        :mod:`testbed.core.runs.inflight`). ``decoded`` is the decoded differential (``float64``,
        shape ``(d,)``), ``None`` for an upload the receiver lost; ``info`` is its metrics
        entry.
        """
        log = self._kept
        if log is None or log.round != round_index:
            self._close_kept(sync=True)
            log = self._kept = KeptLog(self.inflight_path, round_index)
        log.append(device, decoded, dumps(info))
        if log.due():
            log.sync()

    def sync_kept(self) -> None:
        """Group commit: make every upload kept so far durable (one fsync)."""
        if self._kept is not None:
            self._kept.sync()

    def save_inflight(
        self, round_index: int, device: int, decoded: np.ndarray | None, info: dict[str, Any]
    ) -> None:
        """:meth:`keep_upload` and :meth:`sync_kept`: durable when this returns."""
        self.keep_upload(round_index, device, decoded, info)
        self.sync_kept()

    def _close_kept(self, *, sync: bool = False) -> None:
        log, self._kept = self._kept, None
        if log is not None:
            try:
                if sync:
                    log.sync()
            finally:
                log.close()

    def load_inflight(self, round_index: int) -> dict[int, Kept]:
        """Uploads of round ``round_index`` kept by :meth:`keep_upload`, by device (records
        torn by a crash before their group commit are not among them).

        Raises
        ------
        RunDirError
            One line naming the file, when a kept upload cannot be read or has the wrong
            shape (``info`` not a JSON object, ``decoded`` not a 1-D float array), or a
            segment is corrupt where it was fsynced.
        """
        out: dict[int, Kept] = {}
        try:
            for t, device, f in npz_files(self.inflight_path):
                if t == round_index:
                    out[device] = read_npz(f)
            for t, _, f in segments(self.inflight_path):
                if t == round_index:
                    out |= read_segment(f, round_index)
        except KeptError as exc:
            raise RunDirError(str(exc)) from None
        return out

    def clear_inflight_before(self, round_index: int) -> None:
        """Drop kept uploads of rounds before ``round_index`` (their round is committed)."""
        if self._kept is not None and self._kept.round < round_index:
            self._close_kept()
        if not self.inflight_path.is_dir():
            return
        old = [f for t, _, f in (*npz_files(self.inflight_path), *segments(self.inflight_path))
               if t < round_index]
        for f in old:
            f.unlink()
        if not any(self.inflight_path.iterdir()):
            self.inflight_path.rmdir()  # nothing in flight: no folder
        fsync_dir(self.path)

    def commit_round(
        self, round_index: int, weights: np.ndarray, extra: dict[str, Any], line: dict[str, Any]
    ) -> None:
        """Commit a completed round: checkpoint (carrying ``line``), metrics line, then drop
        the round's in-flight uploads. A crash after the checkpoint is rolled forward by
        :meth:`roll_forward`."""
        self.save_checkpoint(round_index, weights, {**extra, "metrics_line": line})
        from testbed.core.runs.faults import fault_point

        fault_point("after_checkpoint")
        self.append_metrics(line)
        self.clear_inflight_before(round_index + 1)

    def truncate_metrics_after(self, last_round: int) -> None:
        """Drop metric lines of rounds after ``last_round`` (left by a crash mid-round)."""
        keep = [m for m in self.metrics() if m.get("round", -1) <= last_round]
        body = "".join(dumps(m, separators=(",", ":")) + "\n" for m in keep)
        atomic_write_bytes(self.metrics_path, body.encode())

    def write_summary(self, summary: dict[str, Any]) -> None:
        atomic_write_json(self.summary_path, summary)


def default_run_path(name: str, root: Path = Path("runs")) -> Path:
    """``runs/<name>-<UTC timestamp>`` (unique per second, suffixed if taken)."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    path = root / f"{name}-{stamp}"
    k = 1
    while path.exists():
        k += 1
        path = root / f"{name}-{stamp}-{k}"
    return path

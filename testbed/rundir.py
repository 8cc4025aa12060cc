"""The run directory: resolved config, metrics, checkpoint, summary; crash-safe writes.

Layout::

    RUN/config.yaml        resolved experiment config (every key)
    RUN/hw_config.yaml     resolved hardware config
    RUN/meta.json          seeds, versions, start time, link
    RUN/run_secret         256-bit mask secret (mode 0600), shared with the devices
    RUN/metrics.jsonl      one JSON line per completed round, appended and fsynced
    RUN/ledger.jsonl       privacy ledger (DP schemes), appended and fsynced
    RUN/checkpoint.npz     global model after the last completed round (atomic replace)
    RUN/summary.json       written at the end (or on interruption), atomic replace

Files are only appended or atomically replaced, so a crash or Ctrl-C at any point leaves
every file either in its previous or its new complete state (a torn last line of a JSONL
file is dropped on reading).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np


class RunDirError(RuntimeError):
    """The run directory cannot be used as asked (exists, missing, inconsistent)."""


def fsync_dir(path: Path) -> None:
    """Flush a directory entry (after a create or rename) to disk.

    Best effort: some file systems refuse fsync on a directory; the write itself has
    already completed, so that is not turned into an error.
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


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
    """Strict JSON text of ``obj`` (see :func:`json_safe`)."""
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
    """All complete lines of a JSONL file; a torn (unparsable) last line is ignored."""
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    out = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                break
            raise RunDirError(f"{path}: line {i + 1} is corrupt (not the last line)") from None
    return out


class RunDir:
    """Files of one run. Use :meth:`create` for a new run, :meth:`open` to resume."""

    def __init__(self, path: Path) -> None:
        self.path = path

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
        """Make a new, empty run directory; refuse one that already holds a run."""
        if path.exists() and any(path.iterdir()):
            raise RunDirError(
                f"run directory '{path}' already exists and is not empty; choose another "
                f"--out, or continue it with `testbed run --resume {path}`"
            )
        path.mkdir(parents=True, exist_ok=True)
        return cls(path)

    @classmethod
    def open(cls, path: Path) -> RunDir:
        """Open an existing run for resuming."""
        if not (path / "config.yaml").is_file():
            raise RunDirError(f"'{path}' is not a run directory (no config.yaml)")
        return cls(path)

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
        """``(last completed round, weights, extra)`` or ``None`` if no round completed."""
        if not self.checkpoint_path.exists():
            return None
        with np.load(self.checkpoint_path) as z:
            extra = json.loads(bytes(z["extra"]).decode())
            return int(z["round_index"]), z["weights"].copy(), extra

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

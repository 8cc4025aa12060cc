"""Resume checks: the checkpoint, the metrics and the privacy ledger must tell one story.

A resumed run continues only when the files agree; when one is missing, unreadable or
disagrees with the others, it refuses and names the file, never restarting from round 0
next to an old ledger or resetting a device's privacy record. The one repair it makes is
the roll-forward of a round whose checkpoint was written but whose metrics line was not
(or was torn): the checkpoint carries that line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from testbed.rundir import RunDir, RunDirError, append_jsonl, atomic_write_bytes, dumps


@dataclass(frozen=True)
class ResumePoint:
    """Where a resumed run continues.

    Attributes
    ----------
    next_round
        First round to run (0-based).
    weights
        Global model after round ``next_round - 1`` (``None`` when no round completed).
    """

    next_round: int
    weights: np.ndarray | None


def _metrics_rounds(rundir: RunDir) -> tuple[list[dict[str, Any]], bool]:
    """Complete metrics lines and whether a torn last line was present."""
    path = rundir.metrics_path
    if not path.exists():
        return [], False
    text = path.read_bytes()
    torn = bool(text) and not text.endswith(b"\n")
    return rundir.metrics(), torn


def resume_point(rundir: RunDir, *, private: bool) -> ResumePoint:
    """Check and reconcile the run's files; return where to continue.

    Parameters
    ----------
    rundir
        The (locked) run directory.
    private
        Whether the run keeps a privacy ledger (any DP scheme).

    Raises
    ------
    RunDirError
        Naming the file, when a file is missing, unreadable or disagrees with the others.
    """
    ckpt = rundir.load_checkpoint()
    metrics, torn = _metrics_rounds(rundir)
    rounds = [int(m.get("round", -1)) for m in metrics]
    ledger = rundir.ledger_path
    if ckpt is None:
        if metrics:
            raise RunDirError(
                f"{rundir.checkpoint_path} is missing but {rundir.metrics_path} records "
                f"{len(metrics)} completed rounds; refusing to restart from round 0"
            )
        if private and not ledger.exists() and _has_intents(rundir):
            raise RunDirError(f"{ledger} is missing but uploads were journalled; refusing")
        if private and ledger.exists():
            late = _ledger_rounds(rundir)
            if late and max(late) > 0:
                raise RunDirError(
                    f"{rundir.checkpoint_path} is missing but {ledger} records uploads up to "
                    f"round {max(late)}; refusing to restart from round 0"
                )
        return ResumePoint(0, None)
    last, weights, extra = ckpt
    if rounds != list(range(len(rounds))):
        raise RunDirError(
            f"{rundir.metrics_path}: rounds {rounds[:3]}...{rounds[-3:]} are not 0, 1, 2, ..."
        )
    if len(rounds) == last + 1 and not torn:
        pass
    elif len(rounds) == last and "metrics_line" in extra:
        # Crash between the checkpoint and the metrics append (or a torn append): roll forward.
        _rewrite_metrics(rundir, metrics)
        append_jsonl(rundir.metrics_path, extra["metrics_line"])
    elif len(rounds) == last + 1 and torn:
        _rewrite_metrics(rundir, metrics)  # a torn line after a complete round: drop it
    else:
        what = "missing" if not rundir.metrics_path.exists() else f"has {len(rounds)} rounds"
        raise RunDirError(
            f"{rundir.metrics_path} {what}, but {rundir.checkpoint_path} is at round {last} "
            f"({last + 1} completed); the files disagree, refusing to resume"
        )
    if private:
        if not ledger.exists():
            raise RunDirError(
                f"{ledger} is missing but {last + 1} rounds were completed; refusing to resume "
                "without the privacy record"
            )
        _check_ledger_covers_metrics(rundir, last)
    rundir.clear_inflight_before(last + 1)
    return ResumePoint(last + 1, weights)


def _rewrite_metrics(rundir: RunDir, metrics: list[dict[str, Any]]) -> None:
    body = "".join(dumps(m, separators=(",", ":")) + "\n" for m in metrics)
    atomic_write_bytes(rundir.metrics_path, body.encode())


def _has_intents(rundir: RunDir) -> bool:
    from aggregator.privacy.ledger import intents_path

    path = intents_path(rundir.ledger_path)
    return path.exists() and path.stat().st_size > 0


def _ledger_entries(rundir: RunDir) -> list[Any]:
    from aggregator.privacy.ledger import Ledger, LedgerError

    try:
        with Ledger.open(rundir.ledger_path) as ledger:
            return ledger.entries()
    except LedgerError as exc:
        raise RunDirError(str(exc)) from None


def _ledger_rounds(rundir: RunDir) -> list[int]:
    return [entry.event.round for entry in _ledger_entries(rundir)]


def _check_ledger_covers_metrics(rundir: RunDir, last: int) -> None:
    """Every upload the metrics say went on air has a ledger record; none is from the future."""
    recorded: dict[tuple[int, int], int] = {}
    for entry in _ledger_entries(rundir):
        key = (entry.event.device, entry.event.round)
        recorded[key] = recorded.get(key, 0) + 1
        if entry.event.round > last + 1:
            raise RunDirError(
                f"{rundir.ledger_path} records round {entry.event.round}, but the run only "
                f"completed round {last}; the files disagree, refusing to resume"
            )
    for m in rundir.metrics():
        for dev in m.get("devices", []):
            if dev.get("transmitted") and (dev["device"], m["round"]) not in recorded:
                raise RunDirError(
                    f"{rundir.ledger_path} has no record of device {dev['device']}'s upload in "
                    f"round {m['round']} (metrics.jsonl says it went on air); refusing to resume"
                )


def directory_is_pristine(path: Path) -> bool:
    """Whether nothing privacy-relevant was written (no ledger event, no journalled intent)."""
    from aggregator.privacy.ledger import HEADER_TYPE

    rundir = RunDir(path)
    if _has_intents(rundir):
        return False
    ledger = rundir.ledger_path
    if not ledger.exists():
        return True
    return all(
        not line.strip() or f'"{HEADER_TYPE}"'.encode() in line
        for line in ledger.read_bytes().splitlines()
    )

"""A sweep's cells in TensorBoard's HParams view.

Each cell's run directory already has its own event files (its rounds,
:mod:`testbed.core.runs.tensorboard_log`); the sweep adds, once its table is written, a
file ``OUT/runs/<cell>/tensorboard/*.hparams`` per cell that has a run directory: the
cell's grid values as hyperparameters and its final figures from ``results.csv``
(``hparams/accuracy``, ``hparams/epsilon_max``, ``hparams/energy_j``), and the
experiment (which hyperparameters and metrics the view lists) in ``OUT/tensorboard``.
Rewritten by every invocation of the sweep (a cell run later gets its figures).
``testbed watch OUT`` shows them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from testbed.core.runs.tensorboard_log import (
    MISSING_NOTE,
    TB_DIR,
    switched_off,
    tensorboard_available,
)

#: Suffix of the HParams event files (a re-run replaces those it wrote before).
SUFFIX = ".hparams"
#: Metric tags, with the ``results.csv`` column each is read from and what the view shows.
METRICS: tuple[tuple[str, str, str], ...] = (
    ("hparams/accuracy", "final_accuracy", "final test accuracy"),
    ("hparams/epsilon_max", "epsilon_max", "largest device epsilon (enforced)"),
    ("hparams/energy_j", "energy_j", "energy, all devices (J)"),
)


def _hparam_value(value: Any) -> bool | float | str:
    """A grid value as HParams takes it (numbers, booleans and strings; others as text)."""
    if isinstance(value, bool | str):
        return value
    if isinstance(value, int | float):
        return float(value)
    return str(value)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or value is None or value == "":
        return None
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _fresh_writer(folder: Path) -> Any:
    """An event writer in ``folder`` after removing the HParams files written before."""
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob(f"events.out.tfevents.*{SUFFIX}"):
        old.unlink()
    return EventFileWriter(str(folder), filename_suffix=SUFFIX)


def write_sweep_hparams(
    rows: Sequence[dict[str, Any]], grid_keys: Sequence[str], out_dir: Path,
    note: Callable[[str], None],
) -> int:
    """Write the HParams files of a sweep's ``rows`` (``results.csv``'s, grid order) under
    ``out_dir``; returns the cells written. Never raises: without the ``tensorboard``
    package (or with ``TESTBED_TENSORBOARD=0``) nothing is written (the first said in one
    line through ``note``), and a failure is said in one line."""
    if switched_off():
        return 0
    if not tensorboard_available():
        note(MISSING_NOTE)
        return 0
    try:
        return _write(rows, grid_keys, Path(out_dir))
    except Exception as exc:  # noqa: BLE001 - the sweep's results stand without it
        note(f"tensorboard: no HParams written ({type(exc).__name__}: {exc})")
        return 0


def _write(rows: Sequence[dict[str, Any]], grid_keys: Sequence[str], out: Path) -> int:
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.plugins.hparams import summary_v2 as hp

    def event(writer: Any, summary: Any, step: int = 0) -> None:
        import time

        writer.add_event(event_pb2.Event(wall_time=time.time(), step=step, summary=summary))

    written = 0
    for row in rows:
        run_dir = Path(str(row.get("run_dir", "")))
        if not row.get("run_dir") or not run_dir.is_dir():
            continue
        writer = _fresh_writer(run_dir / TB_DIR)
        try:
            values = {k: _hparam_value(row.get(k)) for k in grid_keys}
            event(writer, hp.hparams_pb(values, trial_id=run_dir.name))
            step = int(_number(row.get("rounds_completed")) or 0)
            figures = [summary_pb2.Summary.Value(tag=tag, simple_value=x)
                       for tag, column, _ in METRICS
                       if (x := _number(row.get(column))) is not None]
            event(writer, summary_pb2.Summary(value=figures), max(0, step - 1))
        finally:
            writer.close()
        written += 1
    writer = _fresh_writer(out / TB_DIR)
    try:
        config = hp.hparams_config_pb(
            hparams=[hp.HParam(k) for k in grid_keys],
            metrics=[hp.Metric(tag, display_name=name) for tag, _, name in METRICS],
        )
        event(writer, config)
    finally:
        writer.close()
    return written

"""The sweep's results: one table row per cell from its ``summary.json``, CSV and a plot.

Every number in a row is read from the cell's own ``summary.json`` (per-device figures are
reduced over devices: the largest epsilon, the summed energy), so the table can always be
rebuilt from the run directories.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from testbed.core.runs.rundir import atomic_write_bytes
from testbed.sweep.cells import plain_text

#: Columns after the grid keys, in order. Privacy columns are empty for ``fedavg``.
RESULT_COLUMNS = (
    "status",             # summary status (aggregator.outcome.OUTCOMES), or not_run
    "reason",             # the summary's reason
    "action",             # what this sweep did: ran, resumed, skipped, not_run
    "note",               # why a cell has no summary (the end of its log), else empty
    "rounds_completed",
    "rounds_planned",
    "final_accuracy",     # test accuracy at the last evaluation (fraction)
    "best_accuracy",
    "final_train_loss",
    "privacy_unit",       # record, device, or none (fedavg)
    "accountant",         # the accounting that enforced the budget (pld, rdp, strict, paper)
    "epsilon_target",
    "epsilon_max",        # largest device epsilon, enforced accounting, in privacy_unit
    "epsilon_record_max",  # record unit (empty for a device-unit run)
    "epsilon_device_max",  # device unit (for a record-unit run: its device-level figure)
    "epsilon_no_channel_max",  # record unit, no channel noise credited (eavesdropper)
    "delta",
    "delta_total_max",    # delta plus the failure probability of credited channel bounds
    "trusted_channel_noise",  # fraction of channel noise credited (largest over devices)
    "trust",              # against whom the guarantee holds, in words
    "energy_comm_j",      # radio energy, all devices and rounds (J)
    "energy_comp_j",      # computing energy, all devices and rounds (J)
    "energy_j",           # the sum of the two (J)
    "energy_comp_source",
    "lost_uploads",
    "wall_time_s",        # the run's own wall time (its last segment when resumed), s
    "cell_wall_s",        # this sweep's child process for the cell, start-up included, s
    "run_dir",
)


def _num(x: Any) -> float | None:
    """A summary number (``"inf"``/``"nan"`` strings included) as a float, else ``None``."""
    if isinstance(x, bool) or x is None:
        return None
    if isinstance(x, int | float):
        return float(x)
    if isinstance(x, str):
        try:
            return float(x)
        except ValueError:
            return None
    return None


def _max(values: Sequence[Any]) -> float | None:
    nums = [v for v in (_num(x) for x in values) if v is not None and not math.isnan(v)]
    return max(nums) if nums else None


def result_row(
    values: Sequence[tuple[str, Any]],
    run_dir: Path,
    summary: dict[str, Any] | None,
    *,
    action: str,
    note: str = "",
    cell_wall_s: float | None = None,
) -> dict[str, Any]:
    """One table row: the cell's grid values, then :data:`RESULT_COLUMNS`.

    Parameters
    ----------
    values
        ``(grid key, value)`` pairs of the cell.
    run_dir
        The cell's run directory.
    summary
        Its ``summary.json`` (``None`` when there is none: a run that never started, or
        one refused before its first round, whose directory the runner removed).
    action
        ``ran``, ``resumed``, ``skipped`` or ``not_run``.
    note
        Why there is no summary, when there is none.
    cell_wall_s
        Wall time of the cell's child process (s), when this sweep ran it.
    """
    row: dict[str, Any] = dict(values)
    row.update(dict.fromkeys(RESULT_COLUMNS))
    row.update(action=action, note=note, run_dir=str(run_dir))
    row["cell_wall_s"] = None if cell_wall_s is None else round(cell_wall_s, 3)
    if summary is None:
        row["status"] = "not_run" if action == "not_run" else "failed"
        return row
    privacy = summary.get("privacy") or {}
    devices = privacy.get("devices") or []
    unit = privacy.get("unit")
    eps = [d.get("epsilon") for d in devices]
    comm = sum(_num(x) or 0.0 for x in summary.get("energy_comm_j_per_device", []))
    comp = sum(_num(x) or 0.0 for x in summary.get("energy_comp_j_per_device", []))
    row.update(
        status=summary.get("status"),
        reason=summary.get("reason"),
        rounds_completed=summary.get("rounds_completed"),
        rounds_planned=summary.get("rounds_planned"),
        final_accuracy=summary.get("final_accuracy"),
        best_accuracy=summary.get("best_accuracy"),
        final_train_loss=summary.get("final_train_loss"),
        privacy_unit=unit or "none",
        energy_comm_j=comm,
        energy_comp_j=comp,
        energy_j=comm + comp,
        energy_comp_source=summary.get("energy_comp_source"),
        lost_uploads=summary.get("lost_uploads"),
        wall_time_s=summary.get("wall_time_s"),
    )
    if unit is not None:
        row.update(
            accountant=privacy.get("enforced_accounting"),
            epsilon_target=privacy.get("epsilon_target"),
            epsilon_max=_max(eps),
            epsilon_record_max=_max(eps) if unit == "record" else None,
            epsilon_device_max=(
                _max(eps) if unit == "device"
                else _max([d.get("epsilon_device_level") for d in devices])
            ),
            epsilon_no_channel_max=_max([d.get("epsilon_no_channel") for d in devices]),
            delta=privacy.get("delta"),
            delta_total_max=_max([d.get("delta_total") for d in devices]),
            trusted_channel_noise=_max([d.get("trusted_channel_noise") for d in devices]),
            trust=privacy.get("trust"),
        )
    return row


def _cell_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, list | dict | bool):
        return plain_text(value)
    return str(value)


def write_csv(rows: Sequence[dict[str, Any]], grid_keys: Sequence[str], path: Path) -> None:
    """Write the table (one row per cell: grid keys, then :data:`RESULT_COLUMNS`), atomically.

    Empty fields are values that do not apply (no privacy for ``fedavg``) or are unknown.
    """
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=[*grid_keys, *RESULT_COLUMNS], lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: _cell_text(row.get(k)) for k in writer.fieldnames})
    atomic_write_bytes(path, buf.getvalue().encode())


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def plot_results(
    rows: Sequence[dict[str, Any]], grid_keys: Sequence[str], path: Path, title: str
) -> None:
    """PNG: final test accuracy (training loss when no cell evaluated) against the first
    numeric grid key other than ``seed``, one line per combination of the other keys.

    ``seed`` is averaged over (markers at the mean, bars from min to max) unless it is the
    only numeric key; with no numeric key the first grid key is the (categorical) x axis.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    metric = "final_accuracy"
    if not any(_num(r.get(metric)) is not None for r in rows):
        metric = "final_train_loss"
    numeric = [k for k in grid_keys if all(_is_number(r[k]) for r in rows)]
    x_key = next((k for k in numeric if k != "seed"), numeric[0] if numeric else grid_keys[0])
    averaged = "seed" in grid_keys and x_key != "seed"
    line_keys = [k for k in grid_keys if k != x_key and not (averaged and k == "seed")]
    categories = [] if x_key in numeric else list(dict.fromkeys(plain_text(r[x_key]) for r in rows))

    def x_of(r: dict[str, Any]) -> float:
        if x_key in numeric:
            return float(r[x_key])
        return float(categories.index(plain_text(r[x_key])))

    lines: dict[tuple[str, ...], dict[float, list[float]]] = {}
    for r in rows:
        y = _num(r.get(metric))
        group = lines.setdefault(tuple(plain_text(r[k]) for k in line_keys), {})
        if y is not None and math.isfinite(y):
            group.setdefault(x_of(r), []).append(y)
    fig = Figure(figsize=(7.5, 4.8), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    plotted = 0
    for key, points in lines.items():
        if not points:
            continue
        xs = sorted(points)
        mean = [sum(points[x]) / len(points[x]) for x in xs]
        lo = [m - min(points[x]) for m, x in zip(mean, xs, strict=True)]
        hi = [max(points[x]) - m for m, x in zip(mean, xs, strict=True)]
        label = ", ".join(f"{k}={v}" for k, v in zip(line_keys, key, strict=True)) or "all cells"
        ax.errorbar(xs, mean, yerr=[lo, hi] if averaged else None, marker="o", capsize=3,
                    linestyle="none" if categories else "-", label=label)
        plotted += 1
    if categories:
        ax.set_xticks(range(len(categories)), categories, rotation=20)
    ax.set_xlabel(x_key)
    ax.set_ylabel("final test accuracy" if metric == "final_accuracy" else "final training loss")
    note = " (mean over seeds, bars: min to max)" if averaged else ""
    ax.set_title(f"{title}: {len(rows)} cells{note}", fontsize=10)
    if plotted:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no cell has a result yet", ha="center", va="center",
                transform=ax.transAxes)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    atomic_write_bytes(path, buf.getvalue())

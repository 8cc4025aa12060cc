"""Table I's runs, through ``testbed sweep``: one sweep per (data set, scheme).

Each sweep's grid is ``privacy.epsilon`` over the printed epsilons, so the two epsilons of a
scheme run side by side as Ray tasks; ee-dp-fl follows a plan made for each epsilon, so it
gets one sweep per epsilon. A finished cell is skipped when the command is run again (the
sweep's own rule), so an interrupted reproduction continues where it stopped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed.api import plan_overrides
from testbed.core.config.loader import parse_override
from testbed.reproduce.cases import (
    BASE_CONFIG,
    Case,
    Settings,
    dataset_overrides,
)
from testbed.reproduce.plans import make_plan
from testbed.sweep.driver import SweepResult, run_sweep
from testbed.sweep.spec import parse_sweep


@dataclass
class RunCell:
    """One finished (or failed) run of Table I.

    Attributes
    ----------
    dataset, scheme, epsilon
        What the run is.
    row
        The sweep's results row (every number read from the run's ``summary.json``).
    run_dir
        The run directory the row names.
    plan
        ee-dp-fl: the planner's JSON (``None`` otherwise).
    """

    dataset: str
    scheme: str
    epsilon: float
    row: dict[str, Any]
    run_dir: Path
    plan: dict[str, Any] | None = None


def _checked(res: SweepResult) -> SweepResult:
    """Stop the whole reproduction when a sweep was interrupted (Ctrl-C, SIGTERM): its
    cells are resumed, and the finished ones skipped, when the command is run again."""
    if res.interrupted:
        raise KeyboardInterrupt
    return res


def _eps_name(eps: float) -> str:
    return f"eps{eps:g}"


def _plan_set(path: Path) -> dict[str, Any]:
    """``run --plan`` overrides as a mapping (the plan file's path included)."""
    out: dict[str, Any] = {}
    for item in plan_overrides(path):
        keys, value = parse_override(item, "--plan")
        out[".".join(keys)] = value
    return out


def run_table1(
    out: Path,
    datasets: dict[str, str | None],
    cases: list[Case],
    epsilons: tuple[float, ...],
    s: Settings,
    calibrations: dict[str, Path],
    *,
    address: str | None = None,
    log: Callable[[str], None] | None = None,
) -> tuple[list[RunCell], list[str]]:
    """Run (or skip, when finished) every (data set, scheme, epsilon) of Table I.

    Parameters
    ----------
    out
        The reproduction's output folder; sweeps go to ``out/runs/<data set>/<scheme>``.
    datasets
        Data set -> directory (``None``: the shipped location).
    cases
        The schemes with their overrides.
    epsilons
        Target epsilons.
    s
        Run-size settings.
    calibrations
        Data set -> ``testbed calibrate`` output; ee-dp-fl is skipped (and said so) on a
        data set without one.
    address
        A Ray cluster, or ``None`` for local Ray.
    log
        Progress lines.

    Returns
    -------
    tuple[list[RunCell], list[str]]
        The runs, and notes on anything left out.
    """
    cells: list[RunCell] = []
    notes: list[str] = []
    for ds, directory in datasets.items():
        base = {**dataset_overrides(ds, directory), **s.fixed}
        for case in cases:
            sweep_out = out / "runs" / ds / case.scheme
            if not case.needs_plan:
                spec = parse_sweep(
                    {"name": f"{ds}-{case.scheme}", "base": str(BASE_CONFIG),
                     "set": {**base, **case.overrides},
                     "grid": {"privacy.epsilon": list(epsilons)}},
                    BASE_CONFIG.parent,
                )
                res = _checked(run_sweep(spec, sweep_out, address=address, log=log))
                for row in res.rows:
                    cells.append(RunCell(ds, case.scheme, float(row["privacy.epsilon"]), row,
                                         Path(row["run_dir"])))
                continue
            cal = calibrations.get(ds)
            if cal is None:
                notes.append(
                    f"ee-dp-fl on {ds}: left out, no calibration for this data set (give "
                    f"--calibration {ds}=FILE from `testbed calibrate`)"
                )
                continue
            for eps in epsilons:
                name = f"{ds}-{_eps_name(eps)}"
                plan_path, plan_json = make_plan(
                    out / "plans", name, {**base, "privacy.epsilon": eps}, cal, s.k_max
                )
                fixed = {**base, "privacy.epsilon": eps}
                fixed.update(_plan_set(plan_path))  # the plan's K, scheme, compression win
                if s.quick:  # follow the full plan, stop at the quick target
                    fixed["stop_at_loss"] = s.target_loss
                    fixed["loss_targets"] = [s.target_loss]
                spec = parse_sweep(
                    {"name": f"{ds}-ee-dp-fl-{_eps_name(eps)}", "base": str(BASE_CONFIG),
                     "set": {k: v for k, v in fixed.items() if k != "seed"},
                     "grid": {"seed": [int(fixed.get("seed", 0))]}},
                    BASE_CONFIG.parent,
                )
                res = _checked(
                    run_sweep(spec, sweep_out / _eps_name(eps), address=address, log=log)
                )
                row = res.rows[0]
                cells.append(RunCell(ds, case.scheme, eps, row, Path(row["run_dir"]),
                                     plan=plan_json))
    return cells, notes

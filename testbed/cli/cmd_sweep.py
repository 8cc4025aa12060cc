"""``testbed sweep``: run a grid of experiments as Ray tasks, one run directory per cell."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from testbed.cli.overrides import PathOption


def register(sub: Any) -> None:
    """Add the ``sweep`` subcommand."""
    p = sub.add_parser(
        "sweep",
        help="run a grid of experiments (scheme x epsilon x SNR x seed ...) on Ray",
        description=(
            "Run every combination of a sweep file's grid as an ordinary `testbed run` into "
            "OUT/runs/<cell>/, as Ray tasks (a local Ray instance unless --address). Every "
            "cell's config is validated before anything runs. Finished cells are skipped and "
            "interrupted ones resumed when the same command is run again. Writes "
            "OUT/results.csv (one row per cell) and OUT/results.png. Ctrl-C stops the running "
            "cells before their next transmission (again: at once). Exit code: 0 every cell "
            "has a result (completed, budget_exhausted, diverged), 1 some cell failed, 2 bad "
            "input, 130 interrupted. Format: docs/sweep.md."
        ),
    )
    p.add_argument("sweep", type=Path, help="sweep YAML (base, set, hw_set, grid, cpus_per_cell)")
    p.add_argument("--out", action=PathOption, help="output folder (default: sweeps/<name>)")
    p.add_argument(
        "--address",
        metavar="ADDR",
        help="a running Ray cluster (host:6379 or ray://host:10001); every node must see "
        "OUT and the configs at the same paths (default: a local Ray instance)",
    )
    p.add_argument(
        "--cpus", type=int, metavar="N",
        help="CPUs of the local Ray instance (default: all this process may use)",
    )
    p.add_argument(
        "--retry-failed", action="store_true",
        help="resume cells whose summary says failed or link_failed (otherwise skipped)",
    )
    p.add_argument(
        "--dry-run", action="store_true",
        help="validate every cell and print what would run; write and start nothing",
    )
    p.add_argument("--json", action="store_true", help="print the results table as JSON")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from testbed.core.runs.rundir import dumps
    from testbed.sweep import run_sweep

    try:
        result = run_sweep(
            args.sweep,
            args.out,
            address=args.address,
            num_cpus=args.cpus,
            retry_failed=args.retry_failed,
            dry_run=args.dry_run,
        )
    except KeyboardInterrupt:  # outside the cells (those are stopped inside run_sweep)
        print("\ninterrupted; run directories are kept as they are", file=sys.stderr)
        return 130
    if args.json:
        print(dumps({"out_dir": str(result.out_dir), "interrupted": result.interrupted,
                     "rows": result.rows}, indent=2))
    elif not args.dry_run:
        width = max(len(str(r["status"])) for r in result.rows)
        for row in result.rows:
            acc = row["final_accuracy"]
            eps = row["epsilon_max"]
            print(f"{str(row['status']):{width}}  acc {'n/a' if acc is None else f'{acc:.4f}'}"
                  f"  eps {'n/a' if eps is None else f'{eps:.3g}'}  {row['run_dir']}")
    return result.exit_code

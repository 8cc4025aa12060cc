"""``testbed report RUN_DIR``: write a run's ``report.md`` and figures."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def register(sub: Any) -> None:
    """Add the ``report`` subcommand."""
    p = sub.add_parser(
        "report",
        help="write a run directory's report.md and figures",
        description=(
            "Read a run directory (complete, interrupted or killed) and write RUN_DIR/report.md "
            "with its settings, outcome, per-device epsilon and energy tables and loss "
            "targets, and figures under RUN_DIR/report/ (accuracy and loss, epsilon per "
            "device, energy, SNR). The run's own files are only read. Exit code: 0 written, "
            "1 the report could not be written, 2 not a run directory."
        ),
    )
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="a `testbed run` directory")
    p.set_defaults(func=_report)


def _report(args: argparse.Namespace) -> int:
    from testbed.report import NotARunDirectory, write_report

    try:
        path = write_report(args.run_dir)
    except NotARunDirectory as exc:
        print(f"testbed report: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"testbed report: error: cannot write the report in '{args.run_dir}': {exc}",
              file=sys.stderr)
        return 1
    print(path)
    return 0

"""``testbed reproduce``: one command per result of 003 (see :mod:`testbed.reproduce.main`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from testbed.cli.overrides import PathOption, UniqueOverrides
from testbed.core.config.errors import ConfigError
from testbed.core.config.loader import parse_override


def register(sub: Any) -> None:
    """Add the ``reproduce`` subcommand."""
    from testbed.reproduce.cases import DATASET_MODELS, TABLE1_SCHEMES
    from testbed.reproduce.main import TARGETS

    p = sub.add_parser(
        "reproduce",
        help="regenerate 003's Table I, Fig. 2(a)-(c) and Fig. 3 (printed vs measured)",
        description=(
            "Run what each result needs (Table I's runs through `testbed sweep` on Ray, plans "
            "through `testbed plan`, the epsilon-SNR curves through `testbed privacy-curve`) "
            "and write CSV, PNG and report.md with the printed and the measured values side "
            "by side. Finished runs are reused when run again. --quick: short runs (minutes) "
            "that exercise everything but reproduce nothing."
        ),
    )
    p.add_argument("targets", nargs="+", choices=TARGETS, metavar="TARGET",
                   help=f"one or more of {', '.join(TARGETS)}")
    p.add_argument("--quick", action="store_true", help="short runs (not a reproduction)")
    p.add_argument("--out", action=PathOption, help="output folder (default reproduce-quick or "
                   "reproduce-full)")
    p.add_argument("--address", help="an existing Ray cluster (default: local Ray)")
    p.add_argument("--data", action="append", default=[], metavar="NAME=DIR",
                   help=f"also run a data set from DIR; NAME one of {sorted(DATASET_MODELS)}")
    p.add_argument("--calibration", action="append", default=[], metavar="NAME=FILE",
                   help="`testbed calibrate` output for a data set (ee-dp-fl's plans)")
    p.add_argument("--schemes", nargs="+", choices=TABLE1_SCHEMES, metavar="SCHEME",
                   help=f"only these schemes (default all of {', '.join(TABLE1_SCHEMES)})")
    p.add_argument("--epsilons", nargs="+", type=float, metavar="EPS",
                   help="target epsilons (default 1.8 5, as printed)")
    p.add_argument("--set", dest="overrides", action=UniqueOverrides, default=[],
                   metavar="KEY=VALUE",
                   help="override a config key in every run (stated in the report)")
    p.set_defaults(func=_reproduce)


def _reproduce(args: argparse.Namespace) -> int:
    from testbed.core.runs.interrupts import sigterm_as_interrupt
    from testbed.reproduce.cases import parse_datasets
    from testbed.reproduce.main import Request, parse_mapping, reproduce

    datasets = parse_datasets(args.data)
    cals = parse_mapping(args.calibration, "--calibration")
    unknown = sorted(set(cals) - set(datasets))
    if unknown:
        raise ConfigError(f"--calibration: data set(s) {unknown} not run; give --data first")
    eps = tuple(args.epsilons) if args.epsilons else None
    if eps is not None:
        bad = [e for e in eps if not 0 < e < 1e6]
        if bad:
            raise ConfigError(f"--epsilons: got {bad[0]}; allowed: numbers in (0, 1e6)")
    extra: dict[str, Any] = {}
    for item in args.overrides:
        keys, value = parse_override(item, "--set")
        extra[".".join(keys)] = value
    out = args.out or Path("reproduce-quick" if args.quick else "reproduce-full")
    req = Request(targets=list(args.targets), quick=args.quick, out=out, address=args.address,
                  datasets=datasets, calibrations=cals)
    if args.schemes:
        req.schemes = tuple(args.schemes)
    if eps is not None:
        req.epsilons = eps
    req.extra = extra
    try:
        with sigterm_as_interrupt():  # a planner or curve child is killed, not orphaned
            reproduce(req)
    except KeyboardInterrupt:
        print(f"\ntestbed reproduce: interrupted; the finished runs are kept in {out}: run the "
              "same command again to continue", file=sys.stderr)
        return 130
    return 0

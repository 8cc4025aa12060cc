"""``testbed run``: run an experiment (the default one without a CONFIG)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from testbed.cli.overrides import (
    UniqueOverrides,
    add_fallback_option,
    add_run_dir_options,
    add_summary_options,
)
from testbed.core.config.errors import ConfigError


def register(sub: Any) -> None:
    """Add the ``run`` subcommand."""
    p = sub.add_parser(
        "run",
        help="run a federated-learning experiment",
        description=(
            "Run an experiment config (the default simulated-channel job when no CONFIG is "
            "given) into a run directory with config.yaml, metrics.jsonl, ledger.jsonl and "
            "summary.json. Ctrl-C (or SIGTERM) stops before the next transmission and leaves a "
            "consistent directory that --resume continues. Exit code: 0 completed, 1 failed, "
            "2 bad input, 3 budget exhausted (0 with privacy.stop_on_budget after a round), "
            "4 diverged, 5 link failed, 130 interrupted."
        ),
    )
    p.add_argument("config", nargs="?", help="experiment YAML (default: the shipped default)")
    p.add_argument(
        "--set",
        dest="overrides",
        action=UniqueOverrides,
        default=[],
        metavar="KEY=VALUE",
        help="override a config key, dotted for sections (privacy.epsilon=1.8); repeatable",
    )
    p.add_argument(
        "--hw-set",
        dest="hw_overrides",
        action=UniqueOverrides,
        default=[],
        metavar="KEY=VALUE",
        help="override a hardware-config key, dotted (waveform.speed_kmh=20); repeatable",
    )
    p.add_argument("--hw", metavar="HW_CONFIG",
                   help="hardware config: a name in hw_configs/ or a YAML path (sets hw_config)")
    add_fallback_option(p, "runs the link's transmitter and receiver as virtual USRPs with "
                        "the hardware config's parameters")
    p.add_argument(
        "--plan",
        type=Path,
        metavar="PLAN.yaml",
        help="follow a `testbed plan --out` file: sets plan, and scheme, rounds, privacy unit "
        "and compression from it (before --set); the config must agree with the rest",
    )
    add_run_dir_options(p, resume_help=(
        "continue an interrupted run (a lab run directory is refused: `testbed launch "
        "--resume` or `testbed aggregator --resume` continues it)"))
    add_summary_options(p, progress_lines="plain per-round lines")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from aggregator.outcome import outcome_line
    from testbed import api
    from testbed.cli import quick_exit
    from testbed.core.radio_fallback import FallbackRefused
    from testbed.core.runs.faults import pause_point
    from testbed.core.runs.rundir import RunDirError, default_run_path, dumps

    # a bar when stderr is a terminal, else plain lines (aggregator.run_rounds)
    progress = not args.no_progress
    out: Path | None = None
    try:
        if args.resume is not None:
            if (args.config or args.overrides or args.out or args.hw_overrides or args.plan
                    or args.hw or args.fallback):
                raise ConfigError(
                    "--resume takes the run's own config (and radios): drop CONFIG/--set/"
                    "--hw/--hw-set/--out/--plan/--fallback"
                )
            out = args.resume
            result = api.resume(out, progress=progress, report=not args.no_report)
        else:
            # validated before any work
            if args.hw and any(o.startswith("hw_config=") for o in args.overrides):
                raise ConfigError("--hw and --set hw_config=... both name the hardware "
                                  "config; give one")
            sets = [*args.overrides, *([f"hw_config={args.hw}"] if args.hw else [])]
            experiment = api.load_config(args.config, sets,
                                         hw_overrides=args.hw_overrides, plan=args.plan)
            out = args.out or default_run_path(experiment.config.name)
            pause_point("run_setup")
            result = api.run(experiment, out, progress=progress, report=not args.no_report,
                             fallback=args.fallback)
    except KeyboardInterrupt:
        # Only reached while setting up (the runner itself turns a stop into an outcome).
        print("\ninterrupted before the first round; nothing went on air", file=sys.stderr)
        return 130
    except FallbackRefused as exc:
        print(f"testbed run: link failed: {exc}; nothing went on air", file=sys.stderr)
        return 5
    except (FileNotFoundError, ValueError, RunDirError) as exc:
        if isinstance(exc, ConfigError):
            raise
        print(f"testbed run: error: {exc}", file=sys.stderr)
        return 2
    summary = result.summary
    if args.json:
        print(dumps({**summary, "run_dir": str(out)}))
    print(outcome_line(summary, out), file=sys.stderr if args.json else sys.stdout)
    if result.report_note is not None:
        print(result.report_note, file=sys.stderr)
    if summary["status"] == "interrupted" and not summary.get("run_dir_removed"):
        print(f"continue with:  testbed run --resume {out}", file=sys.stderr)
    elif summary["status"] == "failed" and not summary.get("run_dir_removed"):
        print(f"traceback in {out}/error.log", file=sys.stderr)
    quick_exit.allow()  # the run directory is durable: no teardown needed
    return int(summary["exit_code"])

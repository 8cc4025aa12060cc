"""``testbed run``: run an experiment (the default one without a CONFIG)."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import Any

from testbed.config.loader import ConfigError, load_experiment, load_hardware


def register(sub: Any) -> None:
    """Add the ``run`` subcommand."""
    p = sub.add_parser(
        "run",
        help="run a federated-learning experiment",
        description=(
            "Run an experiment config (the default simulated-channel job when no CONFIG is "
            "given) into a run directory with config.yaml, metrics.jsonl, ledger.jsonl and "
            "summary.json. Ctrl-C stops after the current upload and leaves a consistent "
            "directory that --resume continues."
        ),
    )
    p.add_argument("config", nargs="?", help="experiment YAML (default: the shipped default)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key, dotted for sections (privacy.epsilon=1.8); repeatable",
    )
    p.add_argument("--out", type=Path, help="run directory (default: runs/<name>-<time>)")
    p.add_argument("--resume", type=Path, metavar="RUN_DIR", help="continue an interrupted run")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=_run)


def _sigterm_to_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _run(args: argparse.Namespace) -> int:
    from testbed.rundir import default_run_path, dumps
    from testbed.runner import resume_experiment, run_experiment

    signal.signal(signal.SIGTERM, _sigterm_to_interrupt)
    progress = not args.no_progress and sys.stderr.isatty()
    out: Path | None = None
    try:
        if args.resume is not None:
            if args.config or args.overrides or args.out:
                raise ConfigError("--resume takes the run's own config: drop CONFIG/--set/--out")
            out = args.resume
            summary = resume_experiment(out, progress=progress)
        else:
            cfg = load_experiment(args.config, args.overrides)
            load_hardware(cfg.hw_config)  # validate before any work
            out = args.out or default_run_path(cfg.name)
            summary = run_experiment(cfg, out, progress=progress)
    except KeyboardInterrupt:
        print(
            f"\ninterrupted; the run directory is consistent. Continue with:\n"
            f"  testbed run --resume {out}",
            file=sys.stderr,
        )
        return 130
    except (FileNotFoundError, ValueError) as exc:
        if isinstance(exc, ConfigError):
            raise
        print(f"testbed run: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(dumps({**summary, "run_dir": str(out)}))
    else:
        acc = summary.get("final_accuracy")
        print(
            f"run {summary['status']}: {summary['rounds_completed']} rounds, "
            f"final test accuracy {acc if acc is None else f'{acc:.4f}'}, "
            f"{summary['wall_time_s']:.1f} s -> {out}"
        )
    return 0

"""``testbed run``: run an experiment (the default one without a CONFIG)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from testbed.cli.overrides import UniqueOverrides
from testbed.core.config.loader import ConfigError, load_experiment, load_hardware


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
    p.add_argument(
        "--plan",
        type=Path,
        metavar="PLAN.yaml",
        help="follow a `testbed plan --out` file: sets plan, and scheme, rounds, privacy unit "
        "and compression from it (before --set); the config must agree with the rest",
    )
    p.add_argument("--out", type=Path, help="run directory (default: runs/<name>-<time>)")
    p.add_argument("--resume", type=Path, metavar="RUN_DIR", help="continue an interrupted run")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--no-report", action="store_true",
                   help="do not write report.md and its figures at the end (testbed report)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from aggregator.outcome import outcome_line
    from testbed.core.faults import pause_point
    from testbed.core.rundir import RunDirError, default_run_path, dumps
    from testbed.runner import resume_experiment, run_experiment

    progress = not args.no_progress and sys.stderr.isatty()
    out: Path | None = None
    try:
        if args.resume is not None:
            if args.config or args.overrides or args.out or args.hw_overrides or args.plan:
                raise ConfigError(
                    "--resume takes the run's own config: drop CONFIG/--set/--hw-set/--out/--plan"
                )
            out = args.resume
            summary = resume_experiment(out, progress=progress)
        else:
            overrides = [*plan_overrides(args.plan), *args.overrides] if args.plan else (
                args.overrides
            )
            cfg = load_experiment(args.config, overrides)
            hw = load_hardware(cfg.hw_config, args.hw_overrides)  # validate before any work
            out = args.out or default_run_path(cfg.name)
            pause_point("run_setup")
            summary = run_experiment(cfg, out, progress=progress, hw=hw)
    except KeyboardInterrupt:
        # Only reached while setting up (the runner itself turns a stop into an outcome).
        print("\ninterrupted before the first round; nothing went on air", file=sys.stderr)
        return 130
    except (FileNotFoundError, ValueError, RunDirError) as exc:
        if isinstance(exc, ConfigError):
            raise
        print(f"testbed run: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(dumps({**summary, "run_dir": str(out)}))
    print(outcome_line(summary, out), file=sys.stderr if args.json else sys.stdout)
    if not args.no_report:
        from testbed.report import report_after_run

        line = report_after_run(out, summary)
        if line is not None:
            print(line, file=sys.stderr)
    if summary["status"] == "interrupted" and not summary.get("run_dir_removed"):
        print(f"continue with:  testbed run --resume {out}", file=sys.stderr)
    elif summary["status"] == "failed" and not summary.get("run_dir_removed"):
        print(f"traceback in {out}/error.log", file=sys.stderr)
    return int(summary["exit_code"])


def plan_overrides(path: Path) -> list[str]:
    """Config overrides that make a run follow the plan at ``path``.

    ``plan``, ``scheme``, ``rounds`` (K), ``privacy.unit``, the compression that gives the
    plan's ``l`` and ``Q``, and ``loss_targets`` = the plan's target loss (so the summary
    reports the round and energy at which the run reached it); everything else the plan
    assumed is checked by the run (:func:`testbed.core.schemes.load_checked_plan`).
    """
    from aggregator.peers.plan_config import peer_plan_overrides
    from testbed.core.plan_file import load_plan

    peer = peer_plan_overrides(path)
    if peer is not None:  # a peer system's plan (testbed plan --scheme dp-pasgd)
        return peer
    plan = load_plan(path)
    out = [f"plan={path}", f"scheme={plan.scheme}", f"rounds={plan.K}",
           f"privacy.unit={plan.unit}"]
    if plan.unit == "device":
        out.append(f"local_steps={plan.H}")
    out.append(f"compression.sparsify={'true' if plan.l < plan.d else 'false'}")
    if plan.l < plan.d:
        out.append(f"compression.theta_s={plan.l / plan.d!r}")
    out.append(f"compression.quantize={'true' if plan.Q is not None else 'false'}")
    if plan.target_loss is not None:
        out.append(f"loss_targets=[{plan.target_loss!r}]")
    if plan.Q is not None:
        out.append(f"compression.levels={plan.Q}")
    return out

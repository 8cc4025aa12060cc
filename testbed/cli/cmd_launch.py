"""``testbed launch``: the aggregator and N edges on this machine over loopback."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from testbed.cli.overrides import PathOption, add_fallback_option


def _devices(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        msg = f"--devices: got {text!r}; allowed: an integer >= 1"
        raise argparse.ArgumentTypeError(msg) from None
    if not 1 <= value <= 256:
        raise argparse.ArgumentTypeError(f"--devices: got {value}; allowed: 1..256")
    return value


def register(sub: Any) -> None:
    """Add the ``launch`` subcommand."""
    from testbed.cli.cmd_aggregator import positive_seconds, train_allowance

    p = sub.add_parser(
        "launch",
        help="run a lab run on this machine: an aggregator and N edge processes (loopback)",
        description=(
            "Write fresh CurveZMQ keys, start `testbed aggregator` on a free loopback port and "
            "N `testbed edge` processes, wait for the run to end (the aggregator's progress "
            "lines and its devices' joins relayed to stderr; at the end the run's outcome "
            "line and its report). Ctrl-C stops them all; `--resume OUT` continues. "
            "A process that ends before the run does stops the others within 5 s; its last "
            "error line and log are printed. "
            "--out DIR holds aggregator/ (the run directory), edge-I/ (each device's ledger), "
            "keys/ and logs/. Exit code by outcome, as `testbed run`: 0 completed, 1 failed, "
            "2 bad input, 3 budget exhausted, 4 diverged, 5 link failed (an edge that finds "
            "no USRP included), 130 interrupted."
        ),
    )
    p.add_argument("config", nargs="?", help="experiment YAML (default: the shipped default)")
    p.add_argument("--devices", type=_devices,
                   help="how many edges (required, except with --resume)")
    p.add_argument("--out", action=PathOption,
                   help="output directory (default: runs/launch-<time>)")
    p.add_argument("--resume", action=PathOption, metavar="OUT",
                   help="continue the launch in OUT (an interrupted one): a fresh virtual air "
                   "for virtual radios, `testbed aggregator --resume OUT/aggregator`, and the "
                   "edges with their same keys and state directories; the timing options "
                   "are this command's")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--hw", metavar="HW_CONFIG",
                   help="hardware config for every process (the aggregator, each edge; with "
                   "virtual radios also the virtual air): written resolved to OUT/hw.yaml")
    p.add_argument("--hw-set", dest="hw_overrides", action="append", default=[],
                   metavar="KEY=VALUE")
    add_fallback_option(p, "runs every process on virtual USRPs with the hardware config's "
                        "parameters, through one virtual air")
    p.add_argument("--round-timeout", type=positive_seconds("--round-timeout"), default=60.0)
    p.add_argument("--join-timeout", type=positive_seconds("--join-timeout"), default=120.0)
    p.add_argument("--train-allowance", type=train_allowance, default=None, metavar="SECONDS",
                   help="usrp link: deadline (s) for an edge to train and prepare its burst; "
                        "slots are set once every edge is ready (default: the hardware "
                        "config's calibrated deadline, else 10)")
    p.add_argument("--phase-timeout", type=positive_seconds("--phase-timeout"), default=None,
                   metavar="SECONDS",
                   help="zcdp-secagg: seconds each secure-aggregation phase after the keys "
                   "waits (default: the aggregator's)")
    p.add_argument("--no-progress", action="store_true",
                   help="do not relay the aggregator's per-round progress lines and its "
                   "devices' joins and departures to stderr (they stay in logs/aggregator.log "
                   "unless this is given)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from testbed.core.config.errors import ConfigError
    from testbed.core.config.loader import load_experiment, load_hardware
    from testbed.core.radio_fallback import FallbackRefused
    from testbed.core.runs.rundir import RunDirError, default_run_path
    from testbed.lab.launch import launch, resume_launch

    timing = {"round_timeout_s": args.round_timeout, "join_timeout_s": args.join_timeout,
              "train_allowance_s": args.train_allowance,
              "phase_timeout_s": args.phase_timeout, "progress": not args.no_progress}
    if args.resume is not None:
        if (args.config or args.devices is not None or args.overrides or args.hw
                or args.hw_overrides or args.fallback or args.out):
            raise ConfigError("--resume takes the launch's own config, devices and radios: "
                              "drop CONFIG/--devices/--set/--hw/--hw-set/--fallback/--out")
        out = args.resume
        try:
            code = resume_launch(out, **timing)
        except (RunDirError, TimeoutError) as exc:
            print(f"testbed launch: error: {exc}", file=sys.stderr)
            return 2
    else:
        if args.devices is None:
            raise ConfigError("--devices: required (how many edges to start), except with "
                              "--resume OUT")
        # Validate here, before any process starts (the error names the key).
        cfg = load_experiment(args.config, [*args.overrides, f"devices={args.devices}",
                                            *([f"hw_config={args.hw}"] if args.hw else [])])
        load_hardware(cfg.hw_config, args.hw_overrides)
        out = args.out or default_run_path("launch")
        try:
            code = launch(args.config, args.devices, out, overrides=args.overrides,
                          hw_overrides=args.hw_overrides, hw_config=args.hw,
                          fallback=args.fallback, **timing)
        except FallbackRefused as exc:
            print(f"testbed launch: link failed: {exc}; nothing went on air", file=sys.stderr)
            return 5
        except (FileExistsError, TimeoutError, RuntimeError) as exc:
            print(f"testbed launch: error: {exc}", file=sys.stderr)
            return 2
    print(f"launch: exit {code}; run directory {out / 'aggregator'}, logs in {out / 'logs'}")
    return code

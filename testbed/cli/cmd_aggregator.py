"""``testbed aggregator``: the aggregator process of a lab run (see ``docs/lab.md``)."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from testbed.cli.overrides import add_fallback_option, add_run_dir_options, add_summary_options
from testbed.core.config.aircomp_checks import check_lab_aircomp
from testbed.core.config.errors import ConfigError
from testbed.core.config.loader import load_experiment, load_hardware


def positive_seconds(flag: str) -> Any:
    """argparse type: a finite number of seconds > 0 (the error names ``flag``)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            msg = f"{flag}: got {text!r}; allowed: seconds > 0"
            raise argparse.ArgumentTypeError(msg) from None
        if not (0 < value < 1e6):
            raise argparse.ArgumentTypeError(
                f"{flag}: got {text!r}; allowed: 0 < seconds < 1e6"
            )
        return value

    return parse


def train_allowance(text: str) -> float:
    """argparse type of ``--train-allowance``: seconds in (0, MAX_TRAIN_ALLOWANCE_S]."""
    from aggregator.lab.usrp_split import MAX_TRAIN_ALLOWANCE_S

    try:
        value = float(text)
    except ValueError:
        msg = f"--train-allowance: got {text!r}; allowed: seconds > 0"
        raise argparse.ArgumentTypeError(msg) from None
    if not 0 < value <= MAX_TRAIN_ALLOWANCE_S:
        raise argparse.ArgumentTypeError(
            f"--train-allowance: got {text!r}; allowed: 0 < seconds <= "
            f"{MAX_TRAIN_ALLOWANCE_S:g} (an edge refuses a burst due more than 30 s ahead)"
        )
    return value


def setup_logging() -> None:
    """One line per event on stderr."""
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s"
    )


def register(sub: Any) -> None:
    """Add the ``aggregator`` subcommand."""
    p = sub.add_parser(
        "aggregator",
        help="run a lab run's aggregator (edges join over CurveZMQ)",
        description=(
            "Bind the authenticated control plane, wait for every device's `testbed edge` to "
            "join, then run the rounds into a run directory (the same files as `testbed run`). "
            "Only devices whose public keys are in KEYS/allowed get through. Exit codes as "
            "`testbed run`."
        ),
    )
    p.add_argument("config", nargs="?", help="experiment YAML (not with --resume)")
    p.add_argument("--bind", required=True, metavar="tcp://ADDR:PORT",
                   help="control endpoint (port * picks a free one)")
    p.add_argument("--keys", type=Path, required=True, metavar="DIR",
                   help="aggregator.key, aggregator.key_secret and allowed/ (testbed keys)")
    add_run_dir_options(p, resume_help=(
        "continue an interrupted lab run (a finished one: tell the edges that join that it "
        "has ended, until all were told or --join-timeout)"))
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--hw-set", dest="hw_overrides", action="append", default=[],
                   metavar="KEY=VALUE")
    add_fallback_option(p, "runs on virtual USRPs with the hardware config's parameters and "
                        "starts their virtual air on virtual_air's addresses, for edges "
                        "started with --fallback emulate")
    p.add_argument("--round-timeout", type=positive_seconds("--round-timeout"), default=60.0,
                   help="seconds a round waits for uploads before closing without a device")
    p.add_argument("--join-timeout", type=positive_seconds("--join-timeout"), default=600.0,
                   help="seconds to wait for every device to join")
    p.add_argument("--train-allowance", type=train_allowance, default=None, metavar="SECONDS",
                   help="usrp link: deadline (s) for an edge to train and prepare its burst "
                        "after the round request; the slots are set once every edge is "
                        "ready, a device not ready by then sits the round out, uncharged "
                        "(default: the hardware config's calibrated deadline, else 10)")
    p.add_argument("--phase-timeout", type=positive_seconds("--phase-timeout"), default=None,
                   metavar="SECONDS",
                   help="zcdp-secagg: seconds each secure-aggregation phase after the keys "
                   "waits for the devices' answers (default 30; the keys phase, which "
                   "includes the training, waits --round-timeout)")
    p.add_argument("--rejoin-wait", type=positive_seconds("--rejoin-wait"), default=None,
                   help="seconds a round waits for a device that dropped out to rejoin, once "
                   "per absence (default 0: the round goes on without it)")
    p.add_argument("--endpoint-file", type=Path, help="write the bound endpoint here")
    add_summary_options(p, progress_lines="per-round log lines")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from aggregator.lab.secagg_server import DEFAULT_PHASE_TIMEOUT_S
    from aggregator.lab.server import serve
    from aggregator.outcome import outcome_line
    from testbed.core.config.link import link_name
    from testbed.core.radio_fallback import (
        FallbackRefused,
        check_fallback_applies,
        fallback_mode,
        radios_of,
        resolve_radios,
    )
    from testbed.core.runs.rundir import RunDirError, default_run_path, dumps
    from testbed.core.transport.curve_keys import KeyFileError, KeyFileMissingError
    from testbed.core.transport.endpoints import check_endpoint

    setup_logging()
    # a bar when stderr is a terminal, else plain lines (aggregator.run_rounds)
    progress = not args.no_progress
    phase_timeout = args.phase_timeout or DEFAULT_PHASE_TIMEOUT_S
    try:
        check_endpoint(args.bind, "--bind", bind=True)
        if args.resume is not None:
            if args.config or args.overrides or args.out or args.hw_overrides or args.fallback:
                raise ConfigError(
                    "--resume takes the run's own config (and radios): drop CONFIG/--set/"
                    "--hw-set/--out/--fallback"
                )
            out = args.resume
            summary = serve(bind=args.bind, keys_dir=args.keys, resume_dir=out,
                            round_timeout_s=args.round_timeout,
                            join_timeout_s=args.join_timeout,
                            rejoin_wait_s=args.rejoin_wait or 0.0,
                            train_allowance_s=args.train_allowance,
                            phase_timeout_s=phase_timeout,
                            endpoint_file=args.endpoint_file, progress=progress)
        else:
            cfg = load_experiment(args.config, args.overrides)
            loaded = load_hardware(cfg.hw_config, args.hw_overrides)
            check_lab_aircomp(cfg, loaded)
            check_fallback_applies(args.fallback, link_name(cfg, loaded))
            hw = resolve_radios(loaded, fallback_mode(loaded, args.fallback),
                                radios_of(loaded, "aggregator")
                                if link_name(cfg, loaded) == "usrp" else [],
                                snr_db=cfg.snr_db_per_device(),
                                rician_k_db=cfg.rician_k_db)
            out = args.out or default_run_path(cfg.name)
            summary = serve(bind=args.bind, keys_dir=args.keys, cfg=cfg, hw=hw, out_dir=out,
                            # fell back here: no one else runs the air (launch does its own)
                            own_air=hw is not loaded,
                            round_timeout_s=args.round_timeout,
                            join_timeout_s=args.join_timeout,
                            rejoin_wait_s=args.rejoin_wait or 0.0,
                            train_allowance_s=args.train_allowance,
                            phase_timeout_s=phase_timeout,
                            endpoint_file=args.endpoint_file, progress=progress)
    except KeyboardInterrupt:
        print("\ninterrupted before the first round; nothing went on air", file=sys.stderr)
        return 130
    except FallbackRefused as exc:
        print(f"testbed aggregator: link failed: {exc}; nothing went on air", file=sys.stderr)
        return 5
    except (KeyFileMissingError, KeyFileError, RunDirError, TimeoutError, OSError,
            ValueError) as exc:
        if isinstance(exc, ConfigError):
            raise
        print(f"testbed aggregator: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(dumps({**summary, "run_dir": str(out)}))
    print(outcome_line(summary, out), file=sys.stderr if args.json else sys.stdout)
    if not args.no_report:
        from testbed.report import report_after_run

        line = report_after_run(out, summary)
        if line is not None:
            print(line, file=sys.stderr)
    if summary["status"] == "interrupted":
        print(f"continue with:  testbed aggregator --bind {args.bind} --keys {args.keys} "
              f"--resume {out}", file=sys.stderr)
    return int(summary["exit_code"])

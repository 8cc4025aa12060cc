"""``testbed edge``: one device of a lab run (one process per Jetson; see ``docs/lab.md``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from testbed.cli.overrides import PathOption, add_fallback_option
from testbed.core.config.loader import load_hardware


def _device_id(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        msg = f"--device-id: got {text!r}; allowed: an integer >= 0"
        raise argparse.ArgumentTypeError(msg) from None
    if not 0 <= value <= 1_000_000:
        raise argparse.ArgumentTypeError(f"--device-id: got {value}; allowed: 0..1000000")
    return value


def _epsilon(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        msg = f"--max-epsilon: got {text!r}; allowed: a number > 0"
        raise argparse.ArgumentTypeError(msg) from None
    if not (0 < value < 1e6):
        raise argparse.ArgumentTypeError(f"--max-epsilon: got {text!r}; allowed: 0 < eps < 1e6")
    return value


def register(sub: Any) -> None:
    """Add the ``edge`` subcommand."""
    from testbed.cli.cmd_aggregator import positive_seconds

    p = sub.add_parser(
        "edge",
        help="run one edge device of a lab run",
        description=(
            "Join the aggregator at --connect with this device's CurveZMQ key, take the run's "
            "config, train on this host's shard, add this device's own privacy noise and "
            "upload in its slot (on the usrp link: a timed burst on this device's own USRP, "
            "--hw). The device keeps its own ledger in --state-dir and refuses "
            "any upload past its own target (--max-epsilon, default the run's). Exit 0 when "
            "the aggregator ends the run (or had ended it when this edge joined); 5 when its "
            "USRP is not found (link failed); 2 on bad input, a transmitter that died, or no "
            "answer at all."
        ),
    )
    p.add_argument("--connect", metavar="tcp://HOST:PORT",
                   help="the aggregator (required, except with --calibrate)")
    p.add_argument("--device-id", type=_device_id, required=True)
    p.add_argument("--keys", type=Path, metavar="DIR",
                   help="device-I.key, device-I.key_secret and aggregator.key (required, "
                   "except with --calibrate)")
    p.add_argument("--calibrate", metavar="CONFIG", default=None,
                   help="join nothing: time this device's training and encoding of one "
                   "round of the job CONFIG on this host (--calibrate-rounds times, --set "
                   "overrides, --data-dir as for a run) and print the --train-time flag "
                   "for testbed radio calibrate (docs/lab.md, 'Calibration')")
    p.add_argument("--calibrate-rounds", type=int, default=3, metavar="N",
                   help="rounds --calibrate times (default 3; the first includes building "
                   "the trainer, as a run's first round does)")
    p.add_argument("--set", dest="overrides", action="append", default=[],
                   metavar="KEY=VALUE", help="with --calibrate: override a key of CONFIG")
    p.add_argument("--json", action="store_true", help="with --calibrate: one JSON object")
    p.add_argument("--state-dir", action=PathOption, metavar="DIR",
                   help="this device's ledger (default: edge-state/device-I)")
    p.add_argument("--hw", metavar="HW_CONFIG", help="this host's hardware config")
    add_fallback_option(p, "transmits on a virtual USRP with the hardware config's "
                        "parameters into the air of an aggregator started with --fallback "
                        "emulate")
    p.add_argument("--data-dir", type=Path, metavar="DIR",
                   help="this device's own training data, and nothing else: every training "
                   "row in DIR is its shard (IDX train-images/train-labels files for mnist "
                   "and fashion-mnist, CIFAR-10 data_batch_* files); the run's partition is "
                   "not used. Default: the run's data set on this host and its seeded shard")
    p.add_argument("--max-epsilon", type=_epsilon, help="this device's own epsilon target")
    p.add_argument("--keep-updates", action="store_true",
                   help="keep this device's model and noisy differential of every round it "
                   "trained in under STATE_DIR/updates/ (audits, tests; never sent)")
    p.add_argument("--rejoin-after", type=positive_seconds("--rejoin-after"), default=10.0,
                   help="seconds of silence after which the edge says hello again")
    p.add_argument("--join-timeout", type=positive_seconds("--join-timeout"), default=600.0,
                   help="seconds without an answer from the aggregator after which the edge "
                   "gives up (exit 0 when its state directory holds a run: its open uploads "
                   "are recorded; exit 2 when it never got in)")
    p.set_defaults(func=_run)


def torch_missing_message(exc: ModuleNotFoundError) -> str | None:
    """The one-line error of an edge whose interpreter has no PyTorch, or ``None`` when
    ``exc`` is about another module.

    Parameters
    ----------
    exc
        What importing the edge's code raised.

    Returns
    -------
    str or None
        What is missing, and how an edge is installed around a PyTorch (docs/lab.md, "An
        edge on a Jetson").
    """
    if (exc.name or "").split(".")[0] != "torch":
        return None
    return (f"PyTorch is not installed in {sys.executable} (an edge trains with it); install "
            "it first (on a Jetson: NVIDIA's PyTorch wheel for your JetPack, see docs/lab.md "
            "'An edge on a Jetson'; on a PC: pip install 'torch>=2.3'), then the testbed "
            f"around it: make edge PY={sys.executable} (scripts/install_edge.py)")


def _calibrate(args: argparse.Namespace) -> int:
    """``--calibrate CONFIG``: time this device's round on this host (no aggregator)."""
    from edge_device.lab.train_timing import time_training
    from testbed.cli.output import emit
    from testbed.core.config.errors import ConfigError
    from testbed.core.config.loader import load_experiment

    cfg = load_experiment(args.calibrate, args.overrides)
    try:
        timing = time_training(cfg, args.device_id, rounds=args.calibrate_rounds,
                               data_dir=args.data_dir)
    except ValueError as exc:  # a ConfigError is one too, and says what to set
        raise ConfigError(str(exc)) from None
    emit({"device": timing.device, "seconds": timing.seconds, "worst_s": timing.worst_s,
          "compute": timing.compute, "samples": timing.samples,
          "train_time_flag": f"--train-time {timing.device}={timing.worst_s:.2f}"},
         args.json, [timing.line()])
    return 0


def _run(args: argparse.Namespace) -> int:
    try:  # the edge trains: without torch, say so before anything else happens
        from edge_device.lab.agent import EdgeAgent
    except ModuleNotFoundError as exc:
        message = torch_missing_message(exc)
        if message is None:
            raise
        print(f"testbed edge: error: {message}", file=sys.stderr)
        return 2
    if args.calibrate is not None:
        return _calibrate(args)
    missing = [flag for flag, value in (("--connect", args.connect), ("--keys", args.keys))
               if value is None]
    if missing:
        print(f"testbed edge: error: the following arguments are required: "
              f"{', '.join(missing)} (or --calibrate CONFIG)", file=sys.stderr)
        return 2
    from edge_device.lab.errors import EdgeError
    from testbed.cli.cmd_aggregator import setup_logging
    from testbed.core.lab_checks import check_state_dir
    from testbed.core.radio_fallback import check_fallback_applies
    from testbed.core.runs.faults import host_clock
    from testbed.core.transport.curve_client import KeyRefusedError
    from testbed.core.transport.curve_keys import KeyFileError, KeyFileMissingError
    from testbed.core.transport.endpoints import check_endpoint

    setup_logging()
    hw = None
    try:
        if args.hw is None:
            check_fallback_applies(args.fallback, None)
        else:
            from edge_device.radio_check import check_edge_radio
            from radio.edge_radio import RadioUnavailable
            from testbed.core.radio_fallback import (
                FallbackRefused,
                fallback_mode,
                radios_of,
                resolve_radios,
            )

            hw = load_hardware(args.hw)
            check_fallback_applies(args.fallback, hw.link)
            try:
                hw = resolve_radios(
                    hw, fallback_mode(hw, args.fallback),
                    radios_of(hw, "edge", device=args.device_id) if hw.link == "usrp" else [])
                check_edge_radio(hw, args.device_id)
            except (RadioUnavailable, FallbackRefused) as exc:
                # link failed (README "Outcomes"), as `testbed run` without its USRPs
                print(f"testbed edge: link failed: {exc}", file=sys.stderr)
                return 5
        state = args.state_dir or Path("edge-state") / f"device-{args.device_id}"
        check_endpoint(args.connect, "--connect", bind=False)
        check_state_dir(state)
        agent = EdgeAgent(args.connect, args.device_id, args.keys, state, data_dir=args.data_dir,
                          hw=hw, max_epsilon=args.max_epsilon, rejoin_after_s=args.rejoin_after,
                          keep_updates=args.keep_updates, join_timeout_s=args.join_timeout,
                          clock=host_clock())
        return agent.run()
    except KeyboardInterrupt:
        return 130
    except KeyRefusedError as exc:
        print(f"testbed edge: error: {refused_key_message(exc, args.keys, args.device_id)}",
              file=sys.stderr)
        return 2
    except (EdgeError, KeyFileError, KeyFileMissingError, ValueError) as exc:
        print(f"testbed edge: error: {exc}", file=sys.stderr)
        return 2


def refused_key_message(exc: Exception, keys_dir: Path, device: int) -> str:
    """One line for an edge whose key the aggregator refused: what happened (``exc``,
    :class:`~testbed.core.transport.curve_client.KeyRefusedError`), this device's public key file
    and the allow-list directory that must hold it."""
    from testbed.core.transport.curve_keys import ALLOWED_DIRNAME, PUBLIC_SUFFIX, device_name

    key_file = Path(keys_dir) / f"{device_name(device)}{PUBLIC_SUFFIX}"
    return (f"{exc}; copy this device's public key file {key_file} into the aggregator's "
            f"allow-list directory (KEYS/{ALLOWED_DIRNAME}/ of `testbed keys --out KEYS` on "
            "the aggregator host) and restart both, or give --keys the keys `testbed keys` "
            "made for this aggregator")

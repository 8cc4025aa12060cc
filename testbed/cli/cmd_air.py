"""``testbed air --hw CONFIG``: run the virtual air of a virtual hardware config.

Every virtual transmitter's bursts meet on one sample timeline, each through its own path,
plus the receiver's thermal noise from the OS CSPRNG; the virtual receiver pulls the stream
(:mod:`testbed.lab.air`). Runs until SIGINT/SIGTERM or until ``--parent-pid`` is gone, then
exits 0 (its sockets closed, its log complete). Exit 2: a config that is not virtual, a bad
option, or an address that cannot be bound.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

from testbed.cli.overrides import UniqueOverrides
from testbed.core.config.loader import load_hardware


def _pid(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"--parent-pid: got {text!r}; allowed: a process "
                                         "id >= 1")
    return value


def register(sub: Any) -> None:
    """Add the ``air`` subcommand."""
    p = sub.add_parser(
        "air",
        help="run the virtual air of a virtual radio lab",
        description=(
            "Take the bursts of the config's virtual transmitters at virtual_air.burst_address, "
            "pass each through its path (loss, fading, carrier offset, delay), add them up "
            "with fresh thermal noise from the OS CSPRNG and stream the result to the virtual "
            "receiver at virtual_air.stream_address, in real time. Needs a config whose "
            "radios are virtual (type=virtual,serial=NAME). Stops on SIGINT/SIGTERM or when "
            "--parent-pid is gone (exit 0); exit 2 on a config that is not virtual."
        ),
    )
    p.add_argument("--hw", required=True, metavar="HW_CONFIG",
                   help="hardware config (name or YAML path) with virtual radios")
    p.add_argument("--hw-set", dest="hw_overrides", action=UniqueOverrides, default=[],
                   metavar="KEY=VALUE", help="override a hardware config key (dotted)")
    p.add_argument("--log-dir", type=Path, metavar="DIR",
                   help="write DIR/air.jsonl: one line per burst and a summary")
    p.add_argument("--parent-pid", type=_pid, metavar="PID",
                   help="stop when this process is gone")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    import zmq

    from testbed.lab.air.air import VirtualAir
    from testbed.lab.air.process import parent_alive, run_air

    hw = load_hardware(args.hw, args.hw_overrides)
    if not hw.virtual:
        print(f"testbed air: error: usrp.rx_args: got '{hw.usrp.rx_args}' in hardware config "
              f"'{args.hw}', a real USRP; allowed: a virtual config (every radio "
              "type=virtual,serial=NAME)", file=sys.stderr)
        return 2
    if args.parent_pid is not None and not parent_alive(args.parent_pid, False):
        print(f"testbed air: error: --parent-pid: process {args.parent_pid} does not exist",
              file=sys.stderr)
        return 2
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            air = VirtualAir(hw, log_dir=args.log_dir)
        except OSError as exc:
            print(f"testbed air: error: --log-dir: {args.log_dir}: {exc}", file=sys.stderr)
            return 2
        try:
            summary = run_air(air, stop, parent_pid=args.parent_pid,
                              on_bound=lambda: print(air.start_line(), flush=True))
        except zmq.ZMQError as exc:
            print(f"testbed air: error: cannot bind virtual_air.burst_address "
                  f"{hw.virtual_air.burst_address} / stream_address "
                  f"{hw.virtual_air.stream_address}: {exc}", file=sys.stderr)
            return 2
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    why = "stop signal" if stop.is_set() else "parent process gone"
    print(f"air: stopped ({why}): {summary['bursts']} bursts, {summary['dropped']} dropped, "
          f"{summary['late']} late, {summary['chunks_sent']} chunks sent, "
          f"{summary['chunks_dropped']} dropped, max lag {summary['max_lag_s']:.3f} s",
          flush=True)
    return 0

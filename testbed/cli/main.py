"""The ``testbed`` command line: one module per subcommand, each with ``register()``.

A subcommand module defines ``register(subparsers) -> None``, which adds its parser and
sets ``func`` (a callable taking the parsed namespace and returning an exit code).

Start-up (importing the subcommands, parsing, and whatever a command does before it installs
its own signal handling, e.g. ``testbed run`` loading its config and data) stops on SIGINT
or SIGTERM with one line and exit code :data:`EXIT_INTERRUPTED` (130, as an interrupted run),
never a traceback or death by the signal. This module imports nothing heavy at its top, so
that window starts as early as the console script allows.
"""

from __future__ import annotations

import argparse
import importlib
import re
import signal
import sys
from typing import NoReturn

from testbed import __version__
from testbed.core.config.errors import ConfigError
from testbed.core.process import startup_gc
from testbed.core.runs.faults import pause_point
from testbed.core.runs.interrupts import sigterm_as_interrupt

#: Exit code of a command stopped by SIGINT or SIGTERM (README, "Outcomes").
EXIT_INTERRUPTED = 130
#: Commands that keep the process' own SIGTERM behaviour once started (the lab processes:
#: their launcher stops them with SIGTERM, then SIGKILL).
OWN_SIGTERM = frozenset({"aggregator", "edge", "launch"})

#: Commands whose process runs rounds: a process started by :func:`entry` collects no
#: garbage until its first round begins (:mod:`testbed.core.process.startup_gc`).
GC_PAUSED_TO_FIRST_ROUND = frozenset({"run"})

#: Subcommand modules, in the order ``--help`` lists them.
COMMAND_MODULES: tuple[str, ...] = (
    "testbed.cli.cmd_run",
    "testbed.cli.cmd_bench",
    "testbed.cli.cmd_privacy",
    "testbed.cli.cmd_radio",
    "testbed.cli.cmd_air",
    "testbed.cli.cmd_plan",
    "testbed.cli.cmd_calibrate",
    "testbed.cli.cmd_keys",
    "testbed.cli.cmd_aggregator",
    "testbed.cli.cmd_edge",
    "testbed.cli.cmd_launch",
    "testbed.cli.cmd_sweep",
    "testbed.cli.cmd_report",
    "testbed.cli.cmd_reproduce",
    "testbed.cli.cmd_watch",
)


#: What a negative number looks like on the command line: ``-5``, ``-.5``, ``-1e308``,
#: ``-inf`` (argparse's own pattern, ``^-\d+$|^-\d*\.\d+$``, misses exponents, so
#: ``--snr-db -1e308`` was "expected one argument").
NEGATIVE_NUMBER = re.compile(r"^-(\d+\.?\d*|\.\d+)(e[-+]?\d+)?$|^-(inf|infinity|nan)$",
                             re.IGNORECASE)


class Parser(argparse.ArgumentParser):
    """``ArgumentParser`` that takes every negative number, exponents included, as a value
    (no option of the testbed looks like a number); its subparsers are of this class too."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._negative_number_matcher = NEGATIVE_NUMBER


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser with every registered subcommand."""
    parser = Parser(
        prog="testbed",
        description="Differentially private federated learning over radio links.",
    )
    parser.add_argument("--version", action="version", version=f"testbed {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``testbed`` console script; returns the exit code."""
    try:
        with sigterm_as_interrupt():
            parser = build_parser()
            pause_point("cli_startup")
            try:
                args = parser.parse_args(argv)
                if args.command not in GC_PAUSED_TO_FIRST_ROUND:
                    startup_gc.resume()
                if not getattr(args, "func", None):
                    parser.print_help()
                    return 2
                if args.command in OWN_SIGTERM:
                    signal.signal(signal.SIGTERM, signal.SIG_DFL)
                return int(args.func(args) or 0)
            except ConfigError as exc:
                print(f"testbed: error: {exc}", file=sys.stderr)
                return 2
    except KeyboardInterrupt:
        print("testbed: interrupted (SIGINT/SIGTERM); stopped", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        startup_gc.resume()


def entry() -> NoReturn:
    """The process entry point (console script ``testbed``, ``python -m testbed``):
    :func:`main`, then the end of the process, without the interpreter's teardown where the
    command allowed it (:mod:`testbed.cli.quick_exit`). The garbage collector is paused
    from here to the first round of the commands that run rounds, and to the parsed command
    line of the others (:mod:`testbed.core.process.startup_gc`)."""
    startup_gc.pause()
    code = main()
    from testbed.cli.quick_exit import finish

    finish(code)


if __name__ == "__main__":
    entry()

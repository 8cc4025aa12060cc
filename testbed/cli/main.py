"""The ``testbed`` command line: one module per subcommand, each with ``register()``.

A subcommand module defines ``register(subparsers) -> None``, which adds its parser and
sets ``func`` (a callable taking the parsed namespace and returning an exit code).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from testbed import __version__
from testbed.config.loader import ConfigError

#: Subcommand modules, in the order ``--help`` lists them.
COMMAND_MODULES: tuple[str, ...] = (
    "testbed.cli.cmd_run",
    "testbed.cli.cmd_bench",
    "testbed.cli.cmd_privacy",
    "testbed.cli.cmd_radio",
    "testbed.cli.cmd_plan",
    "testbed.cli.cmd_calibrate",
    "testbed.cli.cmd_keys",
    "testbed.cli.cmd_aggregator",
    "testbed.cli.cmd_edge",
    "testbed.cli.cmd_launch",
    "testbed.cli.cmd_sweep",
    "testbed.cli.cmd_report",
    "testbed.cli.cmd_reproduce",
)


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser with every registered subcommand."""
    parser = argparse.ArgumentParser(
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
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:
        print(f"testbed: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

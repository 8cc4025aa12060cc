"""``testbed watch RUN_OR_SWEEP_DIR``: TensorBoard on a run's, a launch's or a sweep's
event files (written as the run goes: :mod:`testbed.core.runs.tensorboard_log`).

Serves on 127.0.0.1 (this host only) unless ``--bind`` names another address, which is
said in a line of what it exposes. Prints the address once TensorBoard listens, then serves
until Ctrl-C or SIGTERM (exit 0). Exit 2, with one line: the directory is missing, holds no
event files, the port is taken, or the ``tensorboard`` package is not installed.
"""

from __future__ import annotations

import argparse
import ipaddress
import socket
import sys
import time
from pathlib import Path
from typing import Any

#: TensorBoard's own default port, tried first.
DEFAULT_PORT = 6006
#: Ports tried after the default when it is taken (without ``--port``).
PORT_TRIES = 20
#: Seconds between two reads of the event files (a running run's new rounds).
RELOAD_S = 2


def register(sub: Any) -> None:
    """Add the ``watch`` subcommand."""
    p = sub.add_parser(
        "watch",
        help="TensorBoard on a run, launch or sweep directory (live)",
        description=(
            "Start TensorBoard for the event files under RUN_OR_SWEEP_DIR (every run, lab "
            "aggregator and sweep cell writes them into its run directory's tensorboard/ as "
            "it goes) and print its address; new rounds appear within seconds. Serves on "
            "127.0.0.1 only, unless --bind names another address (every run under the "
            "directory is then visible to whoever reaches it). Ctrl-C stops it (exit 0). "
            "Exit 2: no such directory, no event files in it, the port taken, or tensorboard "
            "not installed."
        ),
    )
    p.add_argument("run_dir", type=Path, metavar="RUN_OR_SWEEP_DIR",
                   help="a run directory, a `testbed launch` folder, or a sweep's folder")
    p.add_argument("--port", type=_port, default=None, metavar="P",
                   help=f"port (default {DEFAULT_PORT}, or the next free one)")
    p.add_argument("--bind", default="127.0.0.1", metavar="ADDR",
                   help="address to listen on (default 127.0.0.1: this host only); any other "
                        "exposes every run under the directory to the network")
    p.set_defaults(func=_watch)


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"--port: got {text!r}; allowed: 1 .. 65535")
    return value


def event_files(folder: Path) -> list[Path]:
    """The TensorBoard event files under ``folder`` (any depth)."""
    return sorted(folder.rglob("events.out.tfevents.*"))


def is_loopback(address: str) -> bool:
    """Whether ``address`` (an IP address or ``localhost``) reaches this host only."""
    if address.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        return False


def port_free(address: str, port: int) -> bool:
    """Whether ``port`` can be bound on ``address`` now."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((address, port))
        except OSError:
            return False
    return True


def check_watchable(folder: Path) -> str | None:
    """Why ``folder`` cannot be watched (one line), or ``None``."""
    if not folder.exists():
        return f"no such directory: '{folder}'"
    if not folder.is_dir():
        return f"'{folder}' is a file; give a run, launch or sweep directory"
    if not event_files(folder):
        return (f"no TensorBoard event files under '{folder}' (a run writes them into "
                "RUN_DIR/tensorboard/ from its first round on, with the tensorboard package "
                "installed; is this a run, launch or sweep directory?)")
    return None


def exposure_note(address: str, port: int, folder: Path) -> str | None:
    """What a non-loopback ``address`` exposes (``None``: loopback, nothing)."""
    if is_loopback(address):
        return None
    return (f"testbed watch: --bind {address}: serving to the network on port {port}: "
            f"anyone who reaches this host there sees every run under '{folder}' (settings, "
            "trust statements, metrics, images); TensorBoard has no login")


def _watch(args: argparse.Namespace) -> int:
    def fail(text: str) -> int:
        print(f"testbed watch: error: {text}", file=sys.stderr)
        return 2

    folder: Path = args.run_dir
    why = check_watchable(folder)
    if why is not None:
        return fail(why)
    from testbed.core.runs.tensorboard_log import tensorboard_available

    if not tensorboard_available():
        return fail("the tensorboard package is not installed (pip install tensorboard, or "
                    "`make`, installs it)")
    address = args.bind
    if args.port is not None:
        port = args.port
        if not port_free(address, port):
            return fail(f"port {port} on {address} is taken (or the address is not this "
                        "host's); choose another with --port")
    else:
        free = [p for p in range(DEFAULT_PORT, DEFAULT_PORT + PORT_TRIES)
                if port_free(address, p)]
        if not free:
            return fail(f"ports {DEFAULT_PORT}..{DEFAULT_PORT + PORT_TRIES - 1} on {address} "
                        "are taken; give one with --port")
        port = free[0]
    note = exposure_note(address, port, folder)
    if note is not None:
        print(note, file=sys.stderr, flush=True)
    try:
        url = _launch(folder, address, port)
    except Exception as exc:  # noqa: BLE001 - TensorBoard's own failures, in one line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return fail(f"TensorBoard did not start on {address}:{port}: {first}")
    print(f"TensorBoard for {folder.resolve()} at {url} (Ctrl-C stops it)", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        print("testbed watch: stopped", file=sys.stderr)
    return 0


def _launch(folder: Path, address: str, port: int) -> str:
    """Start TensorBoard in this process (its server in a thread); returns its address."""
    import logging

    from tensorboard import program

    logging.getLogger("absl").setLevel(logging.ERROR)
    logging.getLogger("tensorboard").setLevel(logging.ERROR)
    board = program.TensorBoard()
    board.configure(argv=[
        "tensorboard", "--logdir", str(folder.resolve()), "--host", address,
        "--port", str(port), "--reload_interval", str(RELOAD_S), "--load_fast", "false",
    ])
    board.launch()
    if address in ("0.0.0.0", "::"):  # every interface: this host's name reaches it
        return f"http://{socket.gethostname()}:{port}/"
    host = f"[{address}]" if ":" in address else address
    return f"http://{host}:{port}/"

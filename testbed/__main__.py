"""``python -m testbed``: the command line of :mod:`testbed.cli.main`.

SIGTERM raises ``KeyboardInterrupt`` from the first line on, and an interrupt while the
command line is still being imported ends with one line and exit code 130, as it does later.
"""

import signal
import sys
from types import FrameType


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        from testbed.cli.main import entry
    except KeyboardInterrupt:
        print("testbed: interrupted (SIGINT/SIGTERM); stopped", file=sys.stderr)
        sys.exit(130)
    entry()

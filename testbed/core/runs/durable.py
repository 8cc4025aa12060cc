"""Making a file system change durable: the one fsync of a directory entry that the run
directory (:mod:`testbed.core.runs.rundir`), its ``inflight/`` log
(:mod:`testbed.core.runs.inflight`), the ledger and the key files all need."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(path: Path) -> None:
    """Flush a directory entry (after a create or rename) to disk.

    Best effort: some file systems refuse fsync on a directory; the write itself has
    already completed, so that is not turned into an error.
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)

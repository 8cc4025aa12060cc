"""Checks a lab process makes before it binds, connects or waits: each refuses bad input
with one line that says what is wrong and what to do.

* ``--bind`` / ``--connect`` endpoints: :func:`testbed.core.endpoints.check_endpoint` (the
  one check of zmq endpoints, shared with the virtual air's addresses).
* :func:`check_allow_list`: a run of more devices than the allow-list holds keys for (those
  devices could never join).
* :func:`mark_lab_run` / :func:`check_lab_run`: a lab run directory carries ``lab.json``;
  ``testbed aggregator --resume`` refuses a directory without it (a ``testbed run``
  directory: its devices are in process, no edge would ever join it).
* :func:`check_state_dir`: ``testbed edge --state-dir`` must be a directory (or not exist).
"""

from __future__ import annotations

import json
from pathlib import Path

from testbed.core.rundir import RunDir, RunDirError

#: File that marks a run directory as a lab run's (written by ``testbed aggregator``).
LAB_MARKER = "lab.json"


def check_allow_list(keys_dir: Path, devices: int) -> None:
    """Refuse a run whose devices are not all on the allow-list (``KEYS/allowed``).

    Raises
    ------
    ValueError
        Naming the run's device count, the allow-list's and the ids missing from it.
    KeyFileMissingError, KeyFileError
        The allow-list is missing or malformed (:func:`load_allow_list`).
    """
    from testbed.core.curve_keys import load_allow_list

    allowed_dir = Path(keys_dir) / "allowed"
    listed = set(load_allow_list(allowed_dir).values())
    missing = [i for i in range(devices) if i not in listed]
    if missing:
        shown = ", ".join(str(i) for i in missing[:10]) + (" ..." if len(missing) > 10 else "")
        raise ValueError(
            f"the run has {devices} devices but {allowed_dir} lists {len(listed)} device "
            f"keys; devices {shown} could never join. Add their keys (testbed keys) or run "
            "fewer devices"
        )


def mark_lab_run(rundir: RunDir) -> None:
    """Mark ``rundir`` as a lab run's (``lab.json``)."""
    rundir.write_text(LAB_MARKER, json.dumps({"kind": "lab", "aggregator": "testbed aggregator"})
                      + "\n")


def check_lab_run(path: Path) -> None:
    """Refuse to resume a directory that is not a lab run directory.

    Raises
    ------
    RunDirError
        ``path`` does not exist, is not a directory, is a ``testbed run`` directory, or is
        no run directory at all.
    """
    path = Path(path)
    if (path / LAB_MARKER).is_file():
        return
    if not path.exists():
        raise RunDirError(f"--resume {path}: no such run directory")
    if not path.is_dir():
        raise RunDirError(f"--resume {path}: not a directory")
    if (path / "config.yaml").is_file() and (path / "meta.json").is_file():
        raise RunDirError(
            f"--resume {path}: a `testbed run` directory (in-process devices; no {LAB_MARKER}),"
            f" not a lab run's: no edge would ever join it. Continue it with "
            f"`testbed run --resume {path}`"
        )
    raise RunDirError(f"--resume {path}: not a run directory (no config.yaml, no {LAB_MARKER})")


def check_state_dir(path: Path) -> None:
    """Refuse an edge state directory that names something other than a directory.

    Raises
    ------
    ValueError
        ``path`` (or a parent of it) exists and is not a directory.
    """
    path = Path(path)
    for p in (path, *path.parents):
        if p.exists() or p.is_symlink():
            if not p.is_dir():
                what = "the state directory" if p == path else f"its parent {p}"
                raise ValueError(f"--state-dir {path}: {what} exists and is not a directory")
            return

"""Checks a lab process makes before it binds, connects or waits: each refuses bad input
with one line that says what is wrong and what to do.

* ``--bind`` / ``--connect`` endpoints: :func:`testbed.core.transport.endpoints.check_endpoint` (the
  one check of zmq endpoints, shared with the virtual air's addresses).
* :func:`check_allow_list`: a run of more devices than the allow-list holds keys for (those
  devices could never join).
* :func:`mark_lab_run` / :func:`check_lab_run`: a lab run directory carries ``lab.json``;
  ``testbed aggregator --resume`` refuses a directory without it (a ``testbed run``
  directory: its devices are in process, no edge would ever join it).
* :func:`check_not_lab_run`: ``testbed run --resume`` refuses a lab run directory (and a
  ``testbed launch`` directory): in one process it would train and draw the noise off the
  edges. The line names the command that continues it.
* :func:`check_launch_dir`: ``testbed launch --resume OUT`` needs the layout a launch writes
  (:data:`LAUNCH_RUN`, :data:`LAUNCH_KEYS`).
* :func:`check_state_dir`: ``testbed edge --state-dir`` must be a directory (or not exist).
"""

from __future__ import annotations

import json
from pathlib import Path

from testbed.core.runs.rundir import RunDir, RunDirError

#: File that marks a run directory as a lab run's (written by ``testbed aggregator``).
LAB_MARKER = "lab.json"
#: A ``testbed launch --out OUT`` directory: the aggregator's run directory ``OUT/aggregator``
#: and the keys ``OUT/keys`` (each edge's state in ``OUT/edge-I``, the logs in ``OUT/logs``,
#: a hardware config every process reads in ``OUT/hw.yaml``).
LAUNCH_RUN = "aggregator"
#: See :data:`LAUNCH_RUN`.
LAUNCH_KEYS = "keys"
#: See :data:`LAUNCH_RUN`.
LAUNCH_HW = "hw.yaml"


def check_allow_list(keys_dir: Path, devices: int) -> None:
    """Refuse a run whose devices are not all on the allow-list (``KEYS/allowed``).

    Raises
    ------
    ValueError
        Naming the run's device count, the allow-list's and the ids missing from it.
    KeyFileMissingError, KeyFileError
        The allow-list is missing or malformed (:func:`load_allow_list`).
    """
    from testbed.core.transport.curve_keys import load_allow_list

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


def is_launch_dir(path: Path) -> bool:
    """Whether ``path`` has a ``testbed launch`` directory's keys and aggregator run
    directory (a lab run: ``lab.json``)."""
    path = Path(path)
    return ((path / LAUNCH_RUN / LAB_MARKER).is_file()
            and (path / LAUNCH_KEYS / "aggregator.key").is_file())


def check_not_lab_run(path: Path) -> None:
    """Refuse ``testbed run --resume`` of a lab run directory (or of a launch directory).

    A lab run's devices are ``testbed edge`` processes: each trains on its own shard, draws
    its own noise and keeps its own ledger. Continued in one process, the training and the
    noise would move off the edges and their ledgers would miss the rounds.

    Raises
    ------
    RunDirError
        ``path`` holds ``lab.json`` or is a launch directory; the line names the command
        that continues it: ``testbed launch --resume OUT`` when a launch started it, else
        ``testbed aggregator --resume`` (and its edges).
    """
    path = Path(path)
    if is_launch_dir(path):
        raise RunDirError(
            f"--resume {path}: a `testbed launch` directory (an aggregator and edge "
            f"processes), not a `testbed run` one. Continue it with "
            f"`testbed launch --resume {path}`")
    if not (path / LAB_MARKER).is_file():
        return
    if path.name == LAUNCH_RUN and is_launch_dir(path.parent):
        how = f"`testbed launch --resume {path.parent}`"
    else:
        how = (f"`testbed aggregator --bind tcp://ADDR:PORT --keys KEYS --resume {path}` "
               "and restart its `testbed edge` processes")
    raise RunDirError(
        f"--resume {path}: a lab run directory ({LAB_MARKER}: its devices are `testbed edge` "
        "processes, each training and adding its own noise), not a `testbed run` one; "
        f"`testbed run` would move that off the edges. Continue it with {how}")


def check_launch_dir(path: Path) -> None:
    """Refuse ``testbed launch --resume`` of a directory a launch did not write, or in
    which the aggregator never started its run.

    Raises
    ------
    RunDirError
        One line: what ``path`` is instead, and what to do.
    """
    path = Path(path)
    if is_launch_dir(path):
        return
    if not path.exists():
        raise RunDirError(f"--resume {path}: no such launch directory")
    if not path.is_dir():
        raise RunDirError(f"--resume {path}: not a directory")
    if path.name == LAUNCH_RUN and is_launch_dir(path.parent):
        raise RunDirError(
            f"--resume {path}: the launch's run directory, not the launch's; give the launch "
            f"directory: `testbed launch --resume {path.parent}`")
    if (path / LAB_MARKER).is_file():
        raise RunDirError(
            f"--resume {path}: a lab run directory not written by `testbed launch` (no "
            f"{LAUNCH_KEYS}/ next to it); continue it with `testbed aggregator --resume {path}` "
            "and its edges")
    if (path / "config.yaml").is_file() and (path / "meta.json").is_file():
        raise RunDirError(
            f"--resume {path}: a `testbed run` directory, not a launch's; continue it with "
            f"`testbed run --resume {path}`")
    if (path / LAUNCH_KEYS / "aggregator.key").is_file():
        raise RunDirError(
            f"--resume {path}: a launch directory whose aggregator never started its run (no "
            f"{LAUNCH_RUN}/{LAB_MARKER}; see {path / 'logs'}): nothing to resume, launch anew")
    raise RunDirError(
        f"--resume {path}: not a launch directory (no {LAUNCH_RUN}/{LAB_MARKER} and "
        f"{LAUNCH_KEYS}/aggregator.key: the layout of `testbed launch --out`)")


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

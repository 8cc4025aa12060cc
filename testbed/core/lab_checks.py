"""Checks a lab process makes before it binds, connects or waits: each refuses bad input
with one line that says what is wrong and what to do.

* :func:`check_endpoint`: ``--bind`` / ``--connect`` endpoints (a TCP port outside
  1..65535 is refused; libzmq would otherwise bind some other port, or connect nowhere and
  wait forever).
* :func:`check_allow_list`: a run of more devices than the allow-list holds keys for (those
  devices could never join).
* :func:`mark_lab_run` / :func:`check_lab_run`: a lab run directory carries ``lab.json``;
  ``testbed aggregator --resume`` refuses a directory without it (a ``testbed run``
  directory: its devices are in process, no edge would ever join it).
* :func:`check_state_dir`: ``testbed edge --state-dir`` must be a directory (or not exist).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from testbed.core.rundir import RunDir, RunDirError

#: File that marks a run directory as a lab run's (written by ``testbed aggregator``).
LAB_MARKER = "lab.json"

_TCP = re.compile(r"^tcp://(?P<host>\[[^\]]*\]|[^:/\[\]]+):(?P<port>[^:/]*)$")


def check_endpoint(endpoint: str, flag: str, *, bind: bool) -> str:
    """Return ``endpoint`` if it is a usable ``tcp://HOST:PORT`` (or another zmq transport).

    Parameters
    ----------
    endpoint
        The endpoint as given.
    flag
        The option it came from (named in the error).
    bind
        ``True`` for a bind endpoint: port ``*`` (any free port) is allowed there.

    Raises
    ------
    ValueError
        A tcp endpoint without a port, or a port that is not ``1..65535`` (``*`` when
        binding).
    """
    if not endpoint.startswith("tcp://"):
        if "://" in endpoint:
            return endpoint  # ipc://, inproc://: libzmq checks those
        raise ValueError(f"{flag}: got {endpoint!r}; expected tcp://HOST:PORT")
    m = _TCP.match(endpoint)
    allowed = "1..65535" + (" or * (any free port)" if bind else "")
    if m is None:
        raise ValueError(f"{flag}: got {endpoint!r}; expected tcp://HOST:PORT (PORT {allowed})")
    port = m.group("port")
    if bind and port == "*":
        return endpoint
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"{flag}: port {port!r} in {endpoint!r}; allowed: {allowed}")
    return endpoint


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

"""Find USRPs through UHD, which imports only under the system interpreter.

UHD's Python bindings (Debian's ``python3-uhd``) cannot be imported in the testbed's
virtual environment, and not in the same process as ``gnuradio.uhd`` either, so the probe
runs ``uhd.find`` in a short subprocess of ``/usr/bin/python3`` and reads back JSON.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass

from radio.flowgraph_process import SYSTEM_PYTHON
from radio.uhd_guard import LOOPBACK_ONLY_ENV, check_loopback_only

__all__ = ["LOOPBACK_ONLY_ENV", "ProbeResult", "check_loopback_only", "find_usrps"]

_SCRIPT = (
    "import json, uhd\n"
    "found = [dict(d.to_dict()) for d in uhd.find({args!r})]\n"
    "print('JSON:' + json.dumps(found))\n"
)


@dataclass(frozen=True)
class ProbeResult:
    """Outcome of a device search.

    Attributes
    ----------
    devices
        One mapping per device found (``type``, ``addr``, ``serial``, ``name``, ...).
    uhd_available
        Whether UHD's Python bindings could be imported.
    message
        Why the search could not run, when it could not.
    """

    devices: list[dict[str, str]]
    uhd_available: bool
    message: str = ""


def find_usrps(args: str = "", python: str = SYSTEM_PYTHON, timeout_s: float = 60.0) -> ProbeResult:
    """List the USRPs UHD finds for device ``args`` (``""``: all).

    Raises
    ------
    RuntimeError
        ``args`` other than the loopback address while :data:`LOOPBACK_ONLY_ENV` is ``1``.
    """
    check_loopback_only(args)
    try:
        out = subprocess.run(
            [python, "-c", _SCRIPT.format(args=args)],
            capture_output=True, text=True, timeout=timeout_s, check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return ProbeResult([], False, f"could not run {python}: {exc}")
    for line in out.stdout.splitlines():
        if line.startswith("JSON:"):
            return ProbeResult(json.loads(line[5:]), True)
    tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
    return ProbeResult([], False, f"UHD is not usable under {python}: {tail}")

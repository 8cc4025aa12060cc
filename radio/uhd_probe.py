"""Find USRPs through UHD, which imports only under the system interpreter.

UHD's Python bindings (Debian's ``python3-uhd``) cannot be imported in the testbed's
virtual environment, and not in the same process as ``gnuradio.uhd`` either, so the probe
runs ``uhd.find`` in a short subprocess of ``/usr/bin/python3`` and reads back JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass

from radio.flowgraph_process import SYSTEM_PYTHON

_SCRIPT = (
    "import json, uhd\n"
    "found = [dict(d.to_dict()) for d in uhd.find({args!r})]\n"
    "print('JSON:' + json.dumps(found))\n"
)


#: Set to ``1`` (the test suite does, for itself and every process it starts) to let
#: discovery ask only the loopback address: UHD's discovery packets then never leave the host.
LOOPBACK_ONLY_ENV = "TESTBED_UHD_LOOPBACK_ONLY"
_LOOPBACK = {"127.0.0.1", "localhost", "::1"}
#: Device types UHD finds on the USB bus only (their finder sends nothing on a network).
_USB_TYPES = {"b200", "b100", "usrp1"}


def check_loopback_only(args: str) -> None:
    """Refuse device ``args`` that would send discovery off the host while
    :data:`LOOPBACK_ONLY_ENV` is ``1``: only a loopback ``addr=`` (``127.0.0.1``, any
    ``127.x.y.z``, ``localhost``, ``::1``), or a USB-only device type with no address
    (``type=b200``), is allowed; empty args (a broadcast to every interface) are not.

    Raises
    ------
    RuntimeError
        Naming the args and the variable.
    """
    if os.environ.get(LOOPBACK_ONLY_ENV) != "1":
        return
    fields = dict(
        (part.split("=", 1)[0].strip(), part.split("=", 1)[1].strip())
        for part in args.split(",") if "=" in part
    )
    usb_only = fields.get("type") in _USB_TYPES and not {"addr", "resource"} & set(fields)
    if not _is_loopback(fields.get("addr")) and not usb_only:
        raise RuntimeError(
            f"UHD discovery with device args {args!r} refused: {LOOPBACK_ONLY_ENV}=1 allows "
            "only a loopback addr= (127.0.0.1, any 127.x.y.z, localhost, ::1) or a USB-only "
            "type (discovery would leave the host)"
        )


def _is_loopback(addr: str | None) -> bool:
    """Whether ``addr`` is a loopback address (127.0.0.0/8, ``::1``, ``localhost``)."""
    if addr is None:
        return False
    if addr in _LOOPBACK:
        return True
    import ipaddress

    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return False


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

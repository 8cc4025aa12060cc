"""The guard that keeps UHD's discovery on the host while the test suite runs.

Standard library only: the flowgraphs (``flowgraphs/tx.py``, ``rx.py``, under the system
interpreter) call it right before they construct a UHD block, as :func:`radio.uhd_probe.
find_usrps` does before ``uhd.find``, so no process the suite starts can send a discovery
packet off the host whatever device args it is given.
"""

from __future__ import annotations

import os

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

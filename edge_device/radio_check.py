"""An edge's radio before its first round: its USRP settings from the hardware config, and
its USRP looked for when the run's link is ``usrp`` (a clear error naming the device and the
args when none answers)."""

from __future__ import annotations

from radio.edge_radio import Probe, RadioUnavailable, args_key, require_usrp
from radio.uhd_probe import find_usrps
from radio.usrp_settings import DeviceRadio
from testbed.core.config.hardware import HardwareConfig, device_radio


def check_edge_radio(
    hw: HardwareConfig, device: int, *, probe: Probe = find_usrps, link: str | None = None
) -> DeviceRadio:
    """Device ``device``'s radio settings, its USRP looked for on the ``usrp`` link.

    Parameters
    ----------
    link
        The link in force (the experiment's ``link``); default the hardware config's.
        Simulated links return without probing.
    probe
        Device finder (tests inject one; the default runs ``uhd.find``).

    Raises
    ------
    RadioUnavailable
        No USRP (or no UHD) for the device's ``tx_args``, or no ``usrp.devices`` entry for a
        device other than 0 (``usrp.tx_args`` is the single-process link's transmitter).
    testbed.core.config.errors.ConfigError
        ``usrp.devices`` lists other devices but not this one.
    """
    radio = device_radio(hw, device)
    if (link or hw.link) != "usrp":
        return radio
    if radio.from_fallback and device != 0:
        raise RadioUnavailable(
            f"device {device}: hardware config '{hw.name}' lists no usrp.devices, and "
            f"usrp.tx_args '{radio.tx_args}' is the single-process link's one transmitter; "
            "add one usrp.devices entry per device, each with its own tx_args (docs/lab.md)"
        )
    require_usrp(f"device {device}", args_key(radio), radio.tx_args, radio.python, probe)
    return radio

"""The resolved USRP settings of one transmitter (an edge device's) and of the aggregator's
receiver: plain values the radio code runs on, made from a hardware config by
:func:`testbed.core.config.hardware.device_radio` and
:func:`~testbed.core.config.hardware.receiver_radio`."""

from __future__ import annotations

from dataclasses import dataclass

#: Time sources that give every USRP the same time (a shared PPS, the MIMO cable, GPS).
SHARED_TIME_SOURCES = ("external", "mimo", "gpsdo")


@dataclass(frozen=True)
class DeviceRadio:
    """The effective transmitter settings of one edge device.

    Attributes
    ----------
    device
        Device id.
    key
        Where the settings come from: ``usrp.devices[i]``, or ``usrp.tx_args`` when the
        config lists no devices (the single-process link's transmitter).
    tx_args, tx_gain_db, tx_antenna
        UHD device args, TX gain (dB), antenna port.
    max_tx_power_w
        Most this radio may radiate (W).
    tx_power_ref_w
        Power (W) radiated by a unit-average-power symbol stream at ``tx_gain_db``.
    center_freq_hz, sample_rate_hz, symbol_rate_hz
        Carrier (Hz), sample rate (S/s) and symbol rate (symbols/s) shared by all devices.
    tx_amplitude
        DAC scale of a unit-power stream.
    clock_source, time_source
        Reference inputs of the USRP (``external``/``mimo``/``gpsdo`` time: shared).
    burst_lead_s
        Default lead of a burst ahead of the USRP's current time (s).
    python
        Interpreter with GNU Radio and UHD.
    air_address
        A virtual device's air (where its bursts go; ``""`` for a real USRP).
    """

    device: int
    key: str
    tx_args: str
    tx_gain_db: float
    tx_antenna: str
    max_tx_power_w: float
    tx_power_ref_w: float
    center_freq_hz: float
    sample_rate_hz: float
    symbol_rate_hz: float
    tx_amplitude: float
    clock_source: str
    time_source: str
    burst_lead_s: float
    python: str
    air_address: str = ""

    @property
    def from_fallback(self) -> bool:
        """``True`` when no ``usrp.devices`` entry exists and ``usrp.tx_args`` stands in."""
        return not self.key.startswith("usrp.devices")

    @property
    def shared_time(self) -> bool:
        """Whether the time source aligns this USRP with the others (PPS, MIMO, GPS)."""
        return self.time_source in SHARED_TIME_SOURCES

    @property
    def virtual(self) -> bool:
        """Whether the device args name a virtual device (:mod:`radio.virtual_device`)."""
        from radio.virtual_device import is_virtual

        return is_virtual(self.tx_args)


@dataclass(frozen=True)
class ReceiverRadio:
    """The aggregator's receiver settings (``usrp.rx_*`` and the shared radio settings).

    Attributes
    ----------
    rx_args, rx_gain_db, rx_antenna
        UHD device args, RX gain (dB), antenna port.
    center_freq_hz, sample_rate_hz
        Carrier (Hz) and sample rate (S/s).
    clock_source, time_source
        Reference inputs of the USRP.
    python
        Interpreter with GNU Radio and UHD.
    ring_seconds
        Received samples kept in memory (s); a round's TDMA schedule must fit.
    air_address
        A virtual receiver's air (where its stream comes from; ``""`` for a real USRP).
    """

    rx_args: str
    rx_gain_db: float
    rx_antenna: str
    center_freq_hz: float
    sample_rate_hz: float
    clock_source: str
    time_source: str
    python: str
    ring_seconds: float = 4.0
    air_address: str = ""

    @property
    def shared_time(self) -> bool:
        """Whether the time source aligns this USRP with the devices' (PPS, MIMO, GPS)."""
        return self.time_source in SHARED_TIME_SOURCES

    @property
    def virtual(self) -> bool:
        """Whether the device args name a virtual device (:mod:`radio.virtual_device`)."""
        from radio.virtual_device import is_virtual

        return is_virtual(self.rx_args)

"""Typed, validated hardware configuration (``hw_configs/*.yaml``).

A hardware config says which link carries the uploads and how the radio is set up. The
same experiment config runs over any of them; only the link changes.

Sections (all optional, defaults shown in ``hw_configs/sim.yaml``):

``waveform``
    Frame numerology (pulse, preamble, pilots) and the impairments the emulated links
    apply (Doppler speed, frequency / timing / sample-rate offsets). Used by the
    ``waveform``, ``gnuradio`` and ``usrp`` links.
``gnuradio``
    The channel-emulator flowgraph process (seeds, interpreter, start-up limit).
``usrp``
    Device arguments, frequency, gains, power limit, clock and time source of a
    USRP (N210 + WBX in the paper's lab).

Types are strict as in :mod:`testbed.config.experiment`: no booleans or strings for
numbers, no integers for booleans, every number finite. Rates and powers have upper bounds
so later arithmetic cannot overflow: ``symbol_rate_hz <= 1e9``, ``tx_power_ref_w <= 100`` W,
``coherence_symbols <= 1e12``, ``snr_sweep_db`` values in [-50, 100] dB.

Any key can be changed from the command line with ``--hw-set KEY=VALUE`` (dotted for
sections, e.g. ``--hw-set waveform.speed_kmh=20``); see
:func:`testbed.config.loader.load_hardware`.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class _Strict(BaseModel):
    """Base: unknown keys refused, no coercion across kinds, finite numbers only."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, strict=True, allow_inf_nan=False, validate_default=True
    )


class WaveformSection(_Strict):
    """Baseband numerology and emulated impairments (see ``radio.framing``)."""

    samples_per_symbol: int = Field(5, ge=2, le=64, description="RRC oversampling")
    rolloff: float = Field(0.35, gt=0, le=1, description="RRC excess bandwidth")
    span_symbols: int = Field(16, ge=2, le=128, description="RRC length in symbols (even)")
    zc_length: int = Field(37, ge=3, le=1023, description="Zadoff-Chu length (odd)")
    preamble_repeats: int = Field(4, ge=2, le=16)
    pilot_spacing: int = Field(
        96, ge=1, le=1_000_000, description="payload symbols between pilot blocks"
    )
    pilots_per_block: int = Field(8, ge=2, le=256)
    pilot_smoothing: int = Field(3, ge=1, le=63, description="pilot blocks averaged (odd)")
    guard_symbols: int = Field(12, ge=0, le=4096)
    distortion_floor_db: float = Field(
        -40.0, ge=-80, le=-20, description="receiver distortion not credited as noise (dB)"
    )
    speed_kmh: float = Field(0.0, ge=0, le=1000, description="Doppler: speed (km/h)")
    cfo_hz: float = Field(0.0, ge=-1e5, le=1e5, description="emulated carrier offset (Hz)")
    cfo_spread_hz: float = Field(0.0, ge=0, le=1e5, description="+- uniform extra CFO (Hz)")
    delay_max_samples: float = Field(
        512.0, ge=0, le=1e7, description="emulated leading samples, uniform in [0, max]"
    )
    sro_ppm: float = Field(0.0, ge=-200, le=200, description="emulated sample-rate offset")
    tail_samples: int = Field(256, ge=0, le=10_000_000)

    @model_validator(mode="after")
    def _odd_even(self) -> WaveformSection:
        if self.span_symbols % 2:
            raise ValueError(f"waveform.span_symbols: got {self.span_symbols}; must be even")
        if self.zc_length % 2 == 0:
            raise ValueError(f"waveform.zc_length: got {self.zc_length}; must be odd")
        if self.pilot_smoothing % 2 == 0:
            raise ValueError(f"waveform.pilot_smoothing: got {self.pilot_smoothing}; must be odd")
        return self


class GnuradioSection(_Strict):
    """The GNU Radio channel-emulator process."""

    noise_seed: int = Field(0, ge=0, le=2**31 - 1, description="channel_model noise seed")
    fading_seed: int = Field(0, ge=0, le=2**31 - 1, description="fading_model seed")
    python: str = Field("/usr/bin/python3", description="interpreter with GNU Radio")
    startup_timeout_s: float = Field(60.0, gt=0, le=600)


class UsrpSection(_Strict):
    """One USRP transmitter and one receiver (lab over the air, darkroom)."""

    tx_args: str = Field("addr=192.168.10.2", description="UHD device args of the transmitter")
    rx_args: str = Field("addr=192.168.10.3", description="UHD device args of the receiver")
    tx_gain_db: float = Field(10.0, ge=0, le=31.5, description="WBX TX gain (dB)")
    rx_gain_db: float = Field(15.0, ge=0, le=31.5, description="WBX RX gain (dB)")
    tx_antenna: str = "TX/RX"
    rx_antenna: str = "RX2"
    max_tx_power_w: float = Field(0.1, gt=0, le=0.1, description="WBX maximum output (W)")
    tx_amplitude: float = Field(
        0.25, gt=0, le=1, description="DAC scale of a unit-power stream (peak headroom)"
    )
    clock_source: Literal["internal", "external", "mimo", "gpsdo"] = "internal"
    time_source: Literal["internal", "external", "mimo", "gpsdo", "none"] = "internal"
    burst_lead_s: float = Field(0.05, gt=0, le=10, description="tx_time ahead of now (s)")
    capture_margin_s: float = Field(0.02, ge=0, le=10, description="RX capture margin (s)")


class HardwareConfig(_Strict):
    """Link selection and the radio parameters every link shares."""

    name: str = "sim"
    link: Literal["symbol", "waveform", "gnuradio", "usrp"] = "symbol"
    symbol_rate_hz: float = Field(
        200e3, gt=0, le=1e9, description="analog symbol rate; t_cm = 1 / symbol_rate_hz (s)"
    )
    tx_power_ref_w: float = Field(
        0.1, gt=0, le=100, description="radiated power (W) of a unit-average-power symbol stream"
    )
    coherence_symbols: int | None = Field(
        None,
        ge=1,
        le=10**12,
        description="block-fading length in symbols; null = one block per upload",
    )
    center_freq_hz: float = Field(915e6, gt=0, le=6e9, description="carrier frequency (Hz)")
    fading: Literal["none", "rayleigh", "rician"] | None = Field(
        None, description="fading the medium imposes (darkroom); null = the experiment's"
    )
    snr_sweep_db: list[float] | None = Field(
        None, description="SNR points (dB) a sweep over this hardware visits"
    )
    waveform: WaveformSection = WaveformSection()
    gnuradio: GnuradioSection = GnuradioSection()
    usrp: UsrpSection = UsrpSection()

    @field_validator("snr_sweep_db")
    @classmethod
    def _sweep_range(cls, v: list[float] | None) -> list[float] | None:
        for x in v or []:
            if not (math.isfinite(x) and -50.0 <= x <= 100.0):
                raise ValueError(f"SNR {x} dB outside the allowed range [-50, 100] dB")
        return v

    @model_validator(mode="after")
    def _power(self) -> HardwareConfig:
        if self.link == "usrp" and self.tx_power_ref_w > self.usrp.max_tx_power_w:
            raise ValueError(
                f"tx_power_ref_w: got {self.tx_power_ref_w} W; the USRP allows at most "
                f"usrp.max_tx_power_w = {self.usrp.max_tx_power_w} W"
            )
        return self

    @property
    def sample_rate_hz(self) -> float:
        """Sample rate of the waveform links (Hz)."""
        return self.symbol_rate_hz * self.waveform.samples_per_symbol

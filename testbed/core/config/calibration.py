"""The ``calibration`` section of a hardware config: what ``testbed radio calibrate`` measured.

A bench's first-day measurement (``testbed radio calibrate HW_CONFIG --out CAL.yaml``,
docs/lab.md "Calibration") writes one YAML file; the hardware config includes it with
``calibration: CAL.yaml`` (a path relative to the hardware config's own file). The loader
(:func:`testbed.core.config.loader.load_hardware`) reads the file and embeds its content,
so a resolved config written elsewhere (a run's ``hw_config.yaml``, ``launch``'s
``OUT/hw.yaml``) still carries it, with ``source`` naming the file it came from.

Runs use it (:func:`calibrated_tx_power_ref_w`, :func:`n0_floor_lower`,
:func:`calibration_status`): the measured ``tx_power_ref_w`` per device, the receiver's N0
lower bound (the channel noise a run may credit never exceeds it), the guard and the
deadline; every report shows its age, and a run whose calibration is missing or older than
``calibration_max_age_days`` says so in its outcome line.

Units: powers in W, noise densities in W/Hz at the receiver's antenna (and per sample in the
receiver's own full-scale units), times in s, frequencies in Hz, gains in dB.
"""

from __future__ import annotations

import math
from datetime import datetime, timezone
from typing import Literal

from pydantic import Field, field_validator, model_validator

from testbed.core.config.sections import StrictModel

#: Default largest age (days) of a calibration before runs say it is stale.
DEFAULT_MAX_AGE_DAYS = 30.0
#: Values of :attr:`DeviceCalibration.late_burst`.
LATE_BURST_RESULTS = ("reported", "not_reported", "not_checked")


class NoiseFloor(StrictModel):
    """The receiver's noise floor at one gain (a noise-only capture).

    ``n0_w_per_hz`` is the estimate referred to the antenna (W/Hz); ``n0_lower_w_per_hz`` its
    one-sided lower confidence bound at ``confidence`` (what a run may credit at most);
    ``n0_sample_lower`` the same bound per sample in the receiver's output units (full scale
    1) at this gain, which is what a frame's pilot estimate is compared with.
    """

    rx_gain_db: float = Field(ge=0, le=100, description="receive gain applied (dB)")
    n0_w_per_hz: float | None = Field(
        None, gt=0, le=1.0, description="N0 estimate at the antenna (W/Hz); null: the "
        "receiver's full-scale power is not known")
    n0_lower_w_per_hz: float | None = Field(None, ge=0, le=1.0,
                                            description="its lower bound (W/Hz)")
    n0_sample: float = Field(gt=0, le=1e6, description="noise power per sample, rx units")
    n0_sample_lower: float = Field(ge=0, le=1e6, description="its lower bound, rx units")
    samples: int = Field(ge=1, description="noise samples the estimate rests on")
    confidence: float = Field(gt=0, lt=1, description="level of the lower bound")

    @model_validator(mode="after")
    def _bound_below(self) -> NoiseFloor:
        w_low, w = self.n0_lower_w_per_hz, self.n0_w_per_hz
        if (w_low is not None and w is not None and w_low > w) \
                or self.n0_sample_lower > self.n0_sample:
            raise ValueError("receiver.noise: a lower bound above its estimate; allowed: "
                             "n0_lower_w_per_hz <= n0_w_per_hz, n0_sample_lower <= n0_sample")
        return self

    @property
    def n0_dbm_per_hz(self) -> float | None:
        """The estimate in dBm/Hz (``None``: not known in W)."""
        return None if self.n0_w_per_hz is None else 10.0 * math.log10(self.n0_w_per_hz) + 30.0


class ReceiverCalibration(StrictModel):
    """The aggregator's receiver: noise floor per gain, overflows, real-time margin."""

    rx_args: str = Field(min_length=1, max_length=512)
    full_scale_w: float | None = Field(
        None, gt=0, le=1e3, description="input power (W) reading as full scale at 0 dB gain: "
        "the receiver's power reference all absolute powers rest on (null: not known)")
    full_scale_source: str = Field(
        "", max_length=300, description="where full_scale_w comes from")
    noise: list[NoiseFloor] = Field(default_factory=list, max_length=64)
    capture_s: float = Field(0.0, ge=0, description="seconds streamed in the overflow check")
    overflows: int = Field(0, ge=0, description="gaps (samples lost) in that capture")
    lost_samples: int = Field(0, ge=0)
    realtime_margin_s: float | None = Field(
        None, description="ring capacity minus the largest backlog seen (s); null: unmeasured")

    def floor_at(self, rx_gain_db: float) -> NoiseFloor | None:
        """The noise floor measured at ``rx_gain_db`` (within 0.01 dB), or ``None``."""
        return next((f for f in self.noise if abs(f.rx_gain_db - rx_gain_db) < 0.01), None)


class DeviceCalibration(StrictModel):
    """One transmitter measured through the cable or the air to the receiver.

    ``None`` marks a quantity the run could not measure; :attr:`Calibration.unmeasured` says
    why.
    """

    device: int = Field(ge=0, le=65535)
    tx_args: str = Field(min_length=1, max_length=512)
    tx_gain_db: float = Field(ge=0, le=100, description="gain measured at (dB)")
    tx_amplitude: float = Field(gt=0, le=1, description="the configured DAC amplitude")
    attenuation_db: float | None = Field(
        None, ge=0, le=300, description="known path loss to the receiver (dB); null: unknown")
    rx_power_w: float | None = Field(
        None, ge=0, description="received power of a unit-power stream at tx_amplitude (W, "
        "antenna; null: lost, or the receiver's full scale not known)")
    tx_power_ref_w: float | None = Field(
        None, gt=0, le=100, description="measured W a unit-power stream radiates at "
        "tx_amplitude and tx_gain_db (null: no attenuation_db given)")
    tx_power_ref_w_lower: float | None = Field(None, ge=0, le=100)
    tx_power_ref_w_upper: float | None = Field(None, gt=0, le=1e4)
    configured_tx_power_ref_w: float = Field(gt=0, le=100)
    gain_offset_db: float | None = Field(
        None, description="measured over configured tx_power_ref_w (dB)")
    path_loss_db: float | None = Field(
        None, description="configured tx_power_ref_w over received power (dB)")
    amplitudes: list[float] = Field(default_factory=list, description="DAC amplitudes sent")
    rx_powers: list[float] = Field(
        default_factory=list, description="received power of each, receiver output units")
    compression_amplitude: float | None = Field(
        None, description="smallest amplitude whose power falls 1 dB short of a^2 (null: none "
        "up to the largest sent)")
    cfo_hz: float | None = None
    cfo_std_hz: float | None = None
    snr_db: float | None = None
    bursts: int = Field(0, ge=0, description="timed bursts measured")
    timing_error_mean_s: float | None = None
    timing_error_std_s: float | None = None
    timing_error_worst_s: float | None = None
    clock_offset_s: float | None = Field(
        None, description="this USRP's time minus the receiver's (s), after the latch")
    clock_offset_uncertainty_s: float | None = None
    pps_seconds_off: int | None = Field(
        None, description="whole seconds between this USRP's and the receiver's PPS latch "
        "(shared reference only; 0 is agreement)")
    drift_ppm: float | None = Field(None, description="clock rate against the receiver's")
    drift_ppm_uncertainty: float | None = None
    late_burst: Literal["reported", "not_reported", "not_checked"] = "not_checked"


class Calibration(StrictModel):
    """What ``testbed radio calibrate`` measured on a bench (module docstring)."""

    written_utc: datetime = Field(description="when the measurement ended (UTC)")
    hw_config: str = Field(min_length=1, max_length=200, description="name of the config")
    radios: Literal["usrp", "virtual"] = "usrp"
    source: str | None = Field(None, description="the file it was read from (the loader)")
    sample_rate_hz: float = Field(gt=0, le=1e9)
    center_freq_hz: float = Field(gt=0, le=6e9)
    devices: list[DeviceCalibration] = Field(default_factory=list, max_length=1024)
    receiver: ReceiverCalibration | None = None
    guard_s: float | None = Field(None, ge=0, le=1.0, description="TDMA guard the timing needs")
    deadline_s: float | None = Field(
        None, gt=0, le=25, description="train allowance the edges need (s); null: unmeasured")
    problems: list[str] = Field(
        default_factory=list, description="faults found (late burst unreported, PPS "
        "disagreement, overflows), one line each")
    unmeasured: list[str] = Field(
        default_factory=list, description="quantities not measured, each with the reason")

    @field_validator("written_utc", mode="before")
    @classmethod
    def _iso(cls, v: object) -> object:
        if isinstance(v, str):
            try:  # Python 3.10 (an edge's) reads no "Z"
                return datetime.fromisoformat(v[:-1] + "+00:00" if v.endswith("Z") else v)
            except ValueError:
                raise ValueError("allowed: an ISO 8601 time with its zone, e.g. "
                                 "2026-12-02T17:00:00Z") from None
        return v

    @field_validator("written_utc")
    @classmethod
    def _aware(cls, v: datetime) -> datetime:
        if v.tzinfo is None:
            raise ValueError("allowed: an ISO 8601 time with its zone, e.g. "
                             "2026-12-02T17:00:00Z")
        return v.astimezone(timezone.utc)

    @model_validator(mode="after")
    def _one_per_device(self) -> Calibration:
        seen: set[int] = set()
        for i, d in enumerate(self.devices):
            if d.device in seen:
                raise ValueError(f"calibration.devices[{i}].device: {d.device} listed twice; "
                                 "allowed: one entry per device")
            seen.add(d.device)
        return self

    def device(self, device: int) -> DeviceCalibration | None:
        """The entry of ``device``, or ``None``."""
        return next((d for d in self.devices if d.device == device), None)

    def age_days(self, now: datetime | None = None) -> float:
        """Days since :attr:`written_utc` (``now``: the current time)."""
        now = datetime.now(timezone.utc) if now is None else now
        return (now - self.written_utc).total_seconds() / 86400.0

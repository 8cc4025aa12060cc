"""A virtual config's true radio values, and a calibration checked against them.

On virtual radios the hardware config sets what a bench would have to find: each path's loss,
carrier offset and delay (``virtual_air.paths``), each transmitter's clock drift, power
model and amplifier limit (its device args), the receiver's noise (``virtual_air``
``temperature_k`` and ``noise_figure_db``) and a host clock error at the PPS latch
(``host_clock_error_s``). :func:`virtual_truth` reads them; :func:`check_against_truth`
compares a :class:`~testbed.core.config.calibration.Calibration` with them, one quantity at
a time, within :data:`TOLERANCES` (``testbed radio calibrate --check-truth``, CI).

The tolerances (stated in docs/lab.md, "Calibration"):

=====================  ==============================================================
``tx_power_ref_w``     5 % on static paths; through fading within 3 standard errors of
                       the mean (``mean / sqrt(bursts)``: a burst's power is exponential
                       through Rayleigh fading; the reported interval is then wide)
``cfo_hz``             5 Hz on static paths, 10 Hz under fading (Doppler spreads it)
``timing``             mean burst-start error within 0.25 samples of the path delay plus
                       twice the float64 resolution of UNIX times (0.24 us each at
                       1.7e9 s: the virtual devices stamp bursts and ``rx_time`` anchors in
                       host time) with a shared reference; without, within the host-read
                       clock mappings' bound (``clock_offset_uncertainty_s``) plus 0.25
                       samples
``drift_ppm``          within max(0.1 ppm, 3 x the reported uncertainty)
``n0``                 the estimate within 3 %; the lower bound never above the true N0
``pps_seconds_off``    exact (whole seconds)
``compression``        the first ladder amplitude past the amplifier's 1 dB point
=====================  ==============================================================
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from radio.link_budget import path_gain
from radio.units import db_to_ratio
from radio.virtual_device import VirtualArgs
from testbed.core.config.calibration import Calibration
from testbed.core.config.hardware import HardwareConfig

#: Boltzmann's constant (J/K).
BOLTZMANN = 1.380649e-23
#: Tolerances of :func:`check_against_truth` (module docstring).
TOLERANCES = {
    "tx_power_rel_static": 0.05,
    "tx_power_std_errors_fading": 3.0,
    "cfo_hz_static": 5.0,
    "cfo_hz_fading": 10.0,
    "timing_samples": 0.25,
    "drift_ppm_min": 0.1,
    "drift_uncertainties": 3.0,
    "n0_rel": 0.03,
}


@dataclass(frozen=True)
class DeviceTruth:
    """One virtual transmitter's true values.

    Attributes
    ----------
    tx_power_ref_w
        W a unit-power stream radiates at the configured amplitude and gain (before the
        amplifier's limit).
    max_power_w
        The amplifier's limit (W, mean over a burst).
    compression_amplitude
        DAC amplitude where a unit-power stream reaches ``max_power_w``.
    path_gain
        Power gain of its path (linear).
    cfo_hz, delay_s, drift_ppm
        Carrier offset, propagation delay (s), clock drift against the receiver's (ppm).
    pps_seconds_off
        Whole seconds its PPS latch lands from the receiver's (shared reference).
    """

    tx_power_ref_w: float
    max_power_w: float
    compression_amplitude: float
    path_gain: float
    cfo_hz: float
    delay_s: float
    drift_ppm: float
    pps_seconds_off: int


@dataclass(frozen=True)
class Truth:
    """A virtual config's true values: per device, and the receiver's N0 (W/Hz at its
    antenna); ``fading`` says whether path powers fade."""

    devices: dict[int, DeviceTruth]
    n0_w_per_hz: float
    fading: bool


@dataclass(frozen=True)
class TruthCheck:
    """One measured quantity against its true value.

    Attributes
    ----------
    quantity
        What (``tx_power_ref_w``, ``cfo_hz``, ``timing_mean_s``, ``drift_ppm``, ``n0``,
        ``n0_lower``, ``pps_seconds_off``, ``compression_amplitude``).
    device
        Device id (``None``: the receiver).
    measured, truth, tolerance
        Values in the quantity's unit (``measured`` ``None``: not measured).
    ok
        Whether it is within the tolerance.
    """

    quantity: str
    device: int | None
    measured: float | None
    truth: float
    tolerance: float
    ok: bool

    def line(self) -> str:
        """One line for a person."""
        who = "receiver" if self.device is None else f"device {self.device}"
        got = "not measured" if self.measured is None else f"{self.measured:.6g}"
        return (f"[{'ok' if self.ok else 'FAIL'}] {who} {self.quantity}: measured {got}, "
                f"true {self.truth:.6g}, tolerance {self.tolerance:.3g}")


def virtual_truth(hw: HardwareConfig) -> Truth:
    """The true values of a virtual config (module docstring).

    Raises
    ------
    ValueError
        ``hw`` is not virtual.
    """
    if not hw.virtual:
        raise ValueError(f"hardware config '{hw.name}' is not virtual: no truth to check")
    air = hw.virtual_air
    rx = VirtualArgs.parse(hw.usrp.rx_args)
    sps = hw.waveform.samples_per_symbol
    entries = [(e.device, e.tx_args, e.tx_gain_db) for e in hw.usrp.devices] or \
        [(0, hw.usrp.tx_args, hw.usrp.tx_gain_db)]
    devices: dict[int, DeviceTruth] = {}
    for device, args, gain in entries:
        va = VirtualArgs.parse(args)
        path = air.path(va.serial)
        if path is None:
            continue
        w_per_unit = va.tx_full_scale_w * db_to_ratio(va.applied_gain(gain))
        devices[device] = DeviceTruth(
            tx_power_ref_w=w_per_unit * hw.usrp.tx_amplitude**2 / sps,
            max_power_w=va.max_power_w,
            compression_amplitude=math.sqrt(va.max_power_w * sps / w_per_unit),
            path_gain=path_gain(attenuation_db=path.attenuation_db,
                                distance_m=path.distance_m, center_freq_hz=hw.center_freq_hz),
            cfo_hz=path.cfo_hz, delay_s=path.delay_samples / hw.sample_rate_hz,
            drift_ppm=va.drift_ppm - rx.drift_ppm,
            pps_seconds_off=round(va.host_clock_error_s) - round(rx.host_clock_error_s))
    n0 = BOLTZMANN * air.temperature_k * db_to_ratio(air.noise_figure_db)
    return Truth(devices, n0, air.fading != "none")


def check_against_truth(cal: Calibration, hw: HardwareConfig) -> list[TruthCheck]:
    """Every measured quantity of ``cal`` against ``hw``'s virtual truth (module
    docstring); a quantity the calibration lacks is a failed check, except the power
    (needs a known attenuation), compression (not measurable under fading) and the PPS
    second (shared reference only).

    Raises
    ------
    ValueError
        ``hw`` is not virtual.
    """
    truth = virtual_truth(hw)
    tol = TOLERANCES
    fs = cal.sample_rate_hz
    shared = hw.usrp.time_source in ("external", "gpsdo", "mimo")
    out: list[TruthCheck] = []

    def add(quantity: str, device: int | None, measured: float | None, true: float,
            tolerance: float, ok: bool | None = None) -> None:
        if ok is None:
            ok = measured is not None and abs(measured - true) <= tolerance
        out.append(TruthCheck(quantity, device, measured, true, tolerance, bool(ok)))

    for d in cal.devices:
        t = truth.devices.get(d.device)
        if t is None:
            continue
        if d.tx_power_ref_w is not None:
            true_ref = min(t.tx_power_ref_w, t.max_power_w)
            if truth.fading:
                # a burst's power through Rayleigh fading is exponential: the mean of n
                # has a standard error of mean / sqrt(n)
                se = d.tx_power_ref_w / math.sqrt(max(d.bursts, 1))
                add("tx_power_ref_w", d.device, d.tx_power_ref_w, true_ref,
                    tol["tx_power_std_errors_fading"] * se)
            else:
                add("tx_power_ref_w", d.device, d.tx_power_ref_w, true_ref,
                    tol["tx_power_rel_static"] * true_ref)
        add("cfo_hz", d.device, d.cfo_hz, t.cfo_hz,
            tol["cfo_hz_fading" if truth.fading else "cfo_hz_static"])
        timing_tol = tol["timing_samples"] / fs
        if shared:
            # the virtual devices stamp bursts and rx_time anchors in UNIX host time, which
            # float64 resolves to ulp(1.7e9 s) = 0.24 us: each may be off by one step
            resolution = 2.0 * math.ulp(cal.written_utc.timestamp())
            add("timing_mean_s", d.device, d.timing_error_mean_s, t.delay_s,
                timing_tol + resolution)
            add("pps_seconds_off", d.device,
                None if d.pps_seconds_off is None else float(d.pps_seconds_off),
                float(t.pps_seconds_off), 0.0)
        else:
            # the mean carries the host-read clock mappings' error: within their bound
            unc = d.clock_offset_uncertainty_s or 0.0
            add("timing_mean_s", d.device, d.timing_error_mean_s, t.delay_s, unc + timing_tol)
        drift_tol = max(tol["drift_ppm_min"],
                        tol["drift_uncertainties"] * (d.drift_ppm_uncertainty or 0.0))
        add("drift_ppm", d.device, d.drift_ppm, t.drift_ppm, drift_tol)
        if d.compression_amplitude is not None or (d.amplitudes and not truth.fading):
            # first ladder amplitude whose power is 1 dB short of a^2: past the limit by
            # more than 10^(1/20)
            past = [a for a in d.amplitudes if a > t.compression_amplitude * 10 ** 0.05]
            expected = min(past) if past else None
            add("compression_amplitude", d.device, d.compression_amplitude,
                expected if expected is not None else math.nan, 0.0,
                ok=d.compression_amplitude == expected)
    rx = cal.receiver
    for f in rx.noise if rx is not None else []:
        if f.n0_w_per_hz is None or f.n0_lower_w_per_hz is None:
            add("n0", None, None, truth.n0_w_per_hz, 0.0, ok=False)
            continue
        add("n0", None, f.n0_w_per_hz, truth.n0_w_per_hz, tol["n0_rel"] * truth.n0_w_per_hz)
        add("n0_lower", None, f.n0_lower_w_per_hz, truth.n0_w_per_hz, 0.0,
            ok=f.n0_lower_w_per_hz <= truth.n0_w_per_hz)
    return out

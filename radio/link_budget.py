"""Link budget of the virtual air: path gain, thermal noise, and the SNR a frame should see.

Received power ``P_rx = P_tx G_path``, with ``G_path`` from an attenuation (cables,
attenuators, a channel emulator's loss: ``10^(-A/10)``) or a distance (free-space path
loss between isotropic antennas, ``(c / (4 pi d f_c))^2``). The receiver's noise has
power spectral density ``N0 = k T 10^(NF/10)`` (W/Hz) over the whole sampled band ``f_s``,
so each complex sample carries noise power ``N0 f_s`` (W). A frame of symbols at rate
``R_s`` with unit-energy pulses then has ``Es/N0 = P_rx / (N0 R_s)``: the per-symbol SNR the
waveform receiver estimates from its pilots after the matched filter (``snr_est_db``).
"""

from __future__ import annotations

import math

from radio.units import db_to_ratio, ratio_to_db

#: Boltzmann's constant (J/K).
BOLTZMANN = 1.380649e-23
#: Speed of light (m/s).
SPEED_OF_LIGHT = 299_792_458.0


def path_gain(*, attenuation_db: float | None = None, distance_m: float | None = None,
              center_freq_hz: float | None = None) -> float:
    """Power gain of a path (linear, <= 1 for a loss): from ``attenuation_db`` or from
    free space over ``distance_m`` at ``center_freq_hz``; exactly one of the two.

    Raises
    ------
    ValueError
        Both or neither given, or a value out of range.
    """
    if (attenuation_db is None) == (distance_m is None):
        raise ValueError("path: give exactly one of attenuation_db and distance_m")
    if attenuation_db is not None:
        if not (math.isfinite(attenuation_db) and 0 <= attenuation_db <= 300):
            raise ValueError(f"attenuation_db: got {attenuation_db}; allowed: 0..300 dB")
        return db_to_ratio(-attenuation_db)
    assert distance_m is not None
    if not (math.isfinite(distance_m) and distance_m > 0):
        raise ValueError(f"distance_m: got {distance_m}; allowed: a number > 0 (m)")
    if center_freq_hz is None or not center_freq_hz > 0:
        raise ValueError(f"center_freq_hz: got {center_freq_hz}; allowed: > 0 (Hz)")
    return min(1.0, (SPEED_OF_LIGHT / (4 * math.pi * distance_m * center_freq_hz)) ** 2)


def noise_psd_w_per_hz(temperature_k: float, noise_figure_db: float) -> float:
    """Receiver noise power spectral density ``k T 10^(NF/10)`` (W/Hz)."""
    if not (math.isfinite(temperature_k) and temperature_k > 0):
        raise ValueError(f"temperature_k: got {temperature_k}; allowed: > 0 (K)")
    if not (math.isfinite(noise_figure_db) and 0 <= noise_figure_db <= 40):
        raise ValueError(f"noise_figure_db: got {noise_figure_db}; allowed: 0..40 dB")
    return BOLTZMANN * temperature_k * db_to_ratio(noise_figure_db)


def sample_noise_power_w(temperature_k: float, noise_figure_db: float,
                         sample_rate_hz: float) -> float:
    """Noise power (W) of one complex sample at ``sample_rate_hz``: ``N0 f_s``."""
    return noise_psd_w_per_hz(temperature_k, noise_figure_db) * sample_rate_hz


def budget_snr_db(rx_power_w: float, symbol_rate_hz: float, temperature_k: float,
                  noise_figure_db: float) -> float:
    """``Es/N0`` (dB) of a frame received at mean power ``rx_power_w`` (W)."""
    if not rx_power_w > 0:
        return -math.inf
    n0 = noise_psd_w_per_hz(temperature_k, noise_figure_db)
    return ratio_to_db(rx_power_w / (n0 * symbol_rate_hz))

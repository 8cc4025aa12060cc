"""The one place that converts between SNR, noise variance and power units."""

from __future__ import annotations

import numpy as np


def db_to_linear(x_db: float | np.ndarray) -> float | np.ndarray:
    """``10 ** (x_db / 10)``."""
    return np.power(10.0, np.asarray(x_db, dtype=np.float64) / 10.0)


def linear_to_db(x: float | np.ndarray) -> float | np.ndarray:
    """``10 log10(x)``; ``-inf`` for 0."""
    with np.errstate(divide="ignore"):
        return 10.0 * np.log10(np.asarray(x, dtype=np.float64))


def noise_var_from_snr_db(snr_db: float, signal_power: float = 1.0) -> float:
    """N0 per complex symbol giving ``snr_db`` for a stream of ``signal_power``."""
    return float(signal_power / db_to_linear(snr_db))


def snr_db_from_noise_var(noise_var: float, signal_power: float = 1.0) -> float:
    """Receive SNR in dB of a stream of ``signal_power`` over noise ``noise_var``."""
    return float(linear_to_db(signal_power / noise_var))

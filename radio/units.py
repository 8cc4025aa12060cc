"""The one place that converts between SNR, noise variance and power units."""

from __future__ import annotations

import math

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


def db_to_ratio(x_db: float) -> float:
    """``10 ** (x_db / 10)`` of one number, in Python floats.

    The scalar form of :func:`db_to_linear`, bit for bit the expression written out: Python's
    ``**`` (the C library's ``pow``), whose last bit numpy's vectorised ``power`` need not
    match.
    """
    return 10.0 ** (x_db / 10.0)


def ratio_to_db(x: float) -> float:
    """``10 log10(x)`` of one number ``x > 0``, in Python floats (the scalar form of
    :func:`linear_to_db`); ``ValueError`` for ``x <= 0``, as :func:`math.log10`."""
    return 10.0 * math.log10(x)

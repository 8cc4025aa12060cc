"""Time-varying flat fading: the Clarke/Jakes model by sum of sinusoids.

:func:`clarke_gains` draws one realisation of a Rayleigh (or Rician) process with the
classical Jakes Doppler spectrum, using the statistical sum-of-sinusoids model of Zheng
and Xiao (IEEE Trans. Commun. 51(6), 2003): ``M`` sinusoids per quadrature with random
arrival angles and phases; ``E|h|^2 = 1`` and the autocorrelation tends to
``J0(2 pi fD tau)``.
"""

from __future__ import annotations

import numpy as np

from radio.units import db_to_linear

#: Speed of light (m/s).
SPEED_OF_LIGHT = 299_792_458.0


def doppler_hz(speed_kmh: float, carrier_hz: float) -> float:
    """Maximum Doppler shift ``fD = v fc / c`` (Hz) for ``speed_kmh`` at ``carrier_hz``."""
    if speed_kmh < 0 or carrier_hz <= 0:
        raise ValueError(f"need speed_kmh >= 0 and carrier_hz > 0, got {speed_kmh}, {carrier_hz}")
    return speed_kmh / 3.6 * carrier_hz / SPEED_OF_LIGHT


def clarke_gains(
    times_s: np.ndarray,
    doppler: float,
    rng: np.random.Generator,
    *,
    rician_k_db: float | None = None,
    n_sinusoids: int = 16,
) -> np.ndarray:
    """One realisation of a flat fading process at ``times_s``.

    Parameters
    ----------
    times_s
        Sample times (s), shape ``(n,)``.
    doppler
        Maximum Doppler shift ``fD`` (Hz).
    rng
        Channel generator.
    rician_k_db
        ``None`` for Rayleigh; otherwise the K-factor (dB) of a line-of-sight component
        with random angle of arrival and phase.
    n_sinusoids
        Sinusoids per quadrature.

    Returns
    -------
    numpy.ndarray
        ``complex128``, shape ``(n,)``, ``E|h|^2 = 1``.
    """
    t = np.asarray(times_s, dtype=np.float64)
    m = n_sinusoids
    w = 2 * np.pi * doppler
    theta = rng.uniform(-np.pi, np.pi)
    n = np.arange(1, m + 1)
    alpha = (2 * np.pi * n - np.pi + theta) / (4 * m)
    phi = rng.uniform(-np.pi, np.pi, m)
    psi = rng.uniform(-np.pi, np.pi, m)
    xc = np.sqrt(2.0 / m) * np.cos(np.outer(t, w * np.cos(alpha)) + phi).sum(axis=1)
    xs = np.sqrt(2.0 / m) * np.cos(np.outer(t, w * np.sin(alpha)) + psi).sum(axis=1)
    scatter = (xc + 1j * xs) / np.sqrt(2.0)
    if rician_k_db is None:
        return scatter
    k = float(db_to_linear(rician_k_db))
    aoa = rng.uniform(-np.pi, np.pi)
    los = np.exp(1j * (w * np.cos(aoa) * t + rng.uniform(-np.pi, np.pi)))
    return np.sqrt(k / (k + 1)) * los + np.sqrt(1 / (k + 1)) * scatter

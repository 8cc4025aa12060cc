"""Time-varying flat fading: the Clarke/Jakes model by sum of sinusoids.

:func:`clarke_gains` draws one realisation of a Rayleigh (or Rician) process with the
classical Jakes Doppler spectrum, using the statistical sum-of-sinusoids model of Zheng
and Xiao (IEEE Trans. Commun. 51(6), 2003): ``M`` sinusoids per quadrature with random
arrival angles and phases; ``E|h|^2 = 1`` and the autocorrelation tends to
``J0(2 pi fD tau)``.

:class:`FadingProcess` is the same model kept as an object: its sinusoids are drawn once, so
one realisation can be evaluated at any times, in pieces that join continuously (the virtual
air's per-transmitter channel, which keeps fading between bursts), with
:meth:`FadingProcess.uniform` evaluating long sample grids on a coarse grid plus linear
interpolation.
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


class FadingProcess:
    """One flat fading process with its sum-of-sinusoids parameters fixed at creation.

    The same model as :func:`clarke_gains` (and the same draws, in the same order, from the
    generator), but kept as an object: it can be evaluated at any times, in any pieces, and
    the pieces join continuously (a transmitter's bursts see one channel that keeps fading
    between them). ``FadingProcess.draw(fd, rng).at(t)`` equals ``clarke_gains(t, fd, rng')``
    (to rounding) for a generator ``rng'`` in the same state as ``rng``.

    Parameters
    ----------
    doppler
        Maximum Doppler shift ``fD`` (Hz), ``>= 0``.
    theta
        The arrival-angle offset (rad).
    phi, psi
        Phases (rad) of the in-phase and quadrature sinusoids, shape ``(M,)`` each.
    rician_k_db
        ``None`` for Rayleigh; otherwise the K-factor (dB) of the line-of-sight component.
    los_aoa, los_phase
        Angle of arrival and phase (rad) of the line-of-sight component (Rician only).
    """

    def __init__(self, doppler: float, theta: float, phi: np.ndarray, psi: np.ndarray, *,
                 rician_k_db: float | None = None, los_aoa: float = 0.0,
                 los_phase: float = 0.0) -> None:
        if not (np.isfinite(doppler) and doppler >= 0):
            raise ValueError(f"doppler: got {doppler}; allowed: a finite number >= 0 (Hz)")
        phi = np.asarray(phi, dtype=np.float64)
        psi = np.asarray(psi, dtype=np.float64)
        if phi.ndim != 1 or phi.shape != psi.shape or phi.size < 1:
            raise ValueError(f"phi, psi: shapes {phi.shape}, {psi.shape}; allowed: two equal "
                             "shapes (M,), M >= 1")
        m = phi.size
        self.doppler = float(doppler)
        self.rician_k_db = rician_k_db
        w = 2 * np.pi * self.doppler
        alpha = (2 * np.pi * np.arange(1, m + 1) - np.pi + theta) / (4 * m)
        #: Angular frequencies (rad/s) of the in-phase and quadrature sinusoids, ``(M,)``.
        self.w_c = w * np.cos(alpha)
        self.w_s = w * np.sin(alpha)
        self.phi = phi
        self.psi = psi
        self._amp = np.sqrt(2.0 / m)
        if rician_k_db is None:
            self._los, self._scatter = 0.0, 1.0
        else:
            k = float(db_to_linear(rician_k_db))
            self._los, self._scatter = np.sqrt(k / (k + 1)), np.sqrt(1 / (k + 1))
        self.w_los = w * np.cos(los_aoa)
        self.los_phase = float(los_phase)

    @classmethod
    def draw(cls, doppler: float, rng: np.random.Generator, *,
             rician_k_db: float | None = None, n_sinusoids: int = 16) -> FadingProcess:
        """Draw a realisation from ``rng`` (the channel generator).

        Parameters are those of :func:`clarke_gains`; the draws are the same, in the same
        order.
        """
        if isinstance(n_sinusoids, bool) or not isinstance(n_sinusoids, int) \
                or n_sinusoids < 1:
            raise ValueError(f"n_sinusoids: got {n_sinusoids!r}; allowed: an integer >= 1")
        theta = rng.uniform(-np.pi, np.pi)
        phi = rng.uniform(-np.pi, np.pi, n_sinusoids)
        psi = rng.uniform(-np.pi, np.pi, n_sinusoids)
        if rician_k_db is None:
            return cls(doppler, theta, phi, psi)
        aoa = rng.uniform(-np.pi, np.pi)
        phase = rng.uniform(-np.pi, np.pi)
        return cls(doppler, theta, phi, psi, rician_k_db=rician_k_db, los_aoa=aoa,
                   los_phase=phase)

    def at(self, times_s: np.ndarray) -> np.ndarray:
        """The gains at ``times_s`` (s), shape ``(n,)``: ``complex128``, ``E|h|^2 = 1``.

        Exact evaluation (``2 M`` cosines per time); for long uniform grids see
        :meth:`uniform`.
        """
        t = np.asarray(times_s, dtype=np.float64)
        xc = self._amp * np.cos(np.outer(t, self.w_c) + self.phi).sum(axis=1)
        xs = self._amp * np.cos(np.outer(t, self.w_s) + self.psi).sum(axis=1)
        h = (xc + 1j * xs) * (self._scatter / np.sqrt(2.0))
        if self.rician_k_db is not None:
            h = h + self._los * np.exp(1j * (self.w_los * t + self.los_phase))
        return h

    def uniform(self, start_s: float, n: int, step_s: float, *,
                points_per_cycle: int = 128) -> np.ndarray:
        """The gains at ``start_s + i step_s`` (s), ``i = 0 .. n-1``: ``complex128``, ``(n,)``.

        Evaluated exactly on a coarse grid of at least ``points_per_cycle`` points per
        Doppler period (never coarser than the samples themselves) and linearly
        interpolated in between: relative error about ``(2 pi / points_per_cycle)^2 / 8``
        (3e-4 at the default). The grid is anchored at absolute multiples of its step, so
        pieces evaluated apart join as one evaluation would.
        """
        if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 0:
            raise ValueError(f"n: got {n!r}; allowed: an integer >= 0")
        if not (np.isfinite(step_s) and step_s > 0):
            raise ValueError(f"step_s: got {step_s}; allowed: a finite number > 0 (s)")
        n = int(n)
        idx = np.arange(n, dtype=np.float64)
        fastest = max(self.doppler, abs(self.w_los) / (2 * np.pi))
        if fastest == 0:
            return self.at(np.full(1, start_s)).repeat(n)
        grid_step = 1.0 / (fastest * points_per_cycle)
        if n < 4 or grid_step <= 2 * step_s:
            return self.at(start_s + idx * step_s)
        t_end = start_s + (n - 1) * step_s
        g0 = np.floor(start_s / grid_step)
        g1 = np.ceil(t_end / grid_step)
        grid = np.arange(g0, g1 + 1) * grid_step
        hg = self.at(grid)
        t = start_s + idx * step_s
        return np.interp(t, grid, hg.real) + 1j * np.interp(t, grid, hg.imag)

"""One transmitter's channel to the receiver in the virtual air: delay, gain, fading, CFO.

A burst ``x`` (radiated amplitude, ``|x|^2`` in W) whose first sample leaves at fractional
air index ``s`` reaches the receiver as

``y[k] = sqrt(G) h(k / fs) exp(j 2 pi cfo (t0 + k / fs)) x(k - s)``

at every air index ``k``: ``x(.)`` is the band-limited interpolation of the burst's samples
(a Kaiser-windowed sinc of :data:`HALF_TAPS` taps either side; none when ``s`` is an integer),
``G`` the path's power gain (:func:`radio.link_budget.path_gain`), ``h`` the transmitter's own
fading process (:class:`radio.fading.FadingProcess`, evaluated at the receive times, so one
channel keeps fading between bursts), and the carrier offset's phase a function of the true
time alone (continuous across bursts).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import numpy as np

from radio.fading import FadingProcess, doppler_hz
from radio.link_budget import path_gain
from radio.units import ratio_to_db
from testbed.core.config.virtual_air import AirPath, VirtualAirSection

#: Taps of the fractional-delay interpolator on either side of the delayed instant.
HALF_TAPS = 16
#: Kaiser window parameter of the interpolator (error < 1e-4 up to 0.35 fs).
KAISER_BETA = 8.0
#: A fractional index this close to an integer is that integer (a float time stamp cannot
#: resolve better; an exact placement needs no interpolation).
SNAP_SAMPLES = 1e-6


def fractional_delay_taps(frac: float) -> tuple[np.ndarray, int]:
    """Interpolator that delays a stream by ``frac`` samples, ``0 < frac < 1``.

    Returns
    -------
    taps
        ``float64``, shape ``(2 HALF_TAPS,)``, DC gain 1.
    first_lag
        Output sample ``m`` of ``np.convolve(x, taps)`` is ``x(m + first_lag - frac)``.
    """
    if not 0.0 < frac < 1.0:
        raise ValueError(f"frac: got {frac}; allowed: 0 < frac < 1 (samples)")
    lags = np.arange(-HALF_TAPS + 1, HALF_TAPS + 1, dtype=np.float64)
    u = (lags - frac) / HALF_TAPS
    window = np.i0(KAISER_BETA * np.sqrt(np.clip(1.0 - u * u, 0.0, None))) / np.i0(KAISER_BETA)
    taps = np.sinc(lags - frac) * window
    return taps / taps.sum(), -HALF_TAPS + 1


def place(samples: np.ndarray, start_index: float) -> tuple[int, np.ndarray]:
    """A burst on the air's integer sample grid.

    Parameters
    ----------
    samples
        The burst, complex, shape ``(n,)``.
    start_index
        Fractional air index of its first sample.

    Returns
    -------
    first
        Air index of the first output sample.
    placed
        ``complex128``: ``placed[m] = x(first + m - start_index)``; ``n`` samples when
        ``start_index`` is (within :data:`SNAP_SAMPLES` of) an integer, else
        ``n + 2 HALF_TAPS - 1`` (the interpolator's tails).
    """
    x = np.asarray(samples, dtype=np.complex128)
    i0 = math.floor(start_index)
    frac = start_index - i0
    if frac < SNAP_SAMPLES:
        return i0, x.copy()
    if frac > 1.0 - SNAP_SAMPLES:
        return i0 + 1, x.copy()
    taps, first_lag = fractional_delay_taps(frac)
    if x.size == 0:
        return i0, x.copy()
    out = np.convolve(x.real, taps) + 1j * np.convolve(x.imag, taps)
    return i0 + first_lag, out


def serial_seed(seed: int, serial: str) -> np.random.SeedSequence:
    """The fading seed of one transmitter: ``seed`` and a stable hash of its ``serial``
    (independent processes per serial, unchanged by the order of ``paths``)."""
    key = int.from_bytes(hashlib.sha256(serial.encode()).digest()[:8], "little")
    return np.random.SeedSequence([int(seed), key])


@dataclass(frozen=True)
class Received:
    """A burst as it reaches the receiver, on the air's integer grid.

    Attributes
    ----------
    first
        Air index of ``samples[0]``.
    samples
        ``complex128`` amplitude at the receiver (``|y|^2`` in W), shape ``(m,)``.
    rx_power_w
        ``sum |y|^2 / n`` (W) over the burst's ``n`` transmitted samples, noise excluded.
    fading_gain_db
        ``10 log10`` of the mean of ``|h|^2`` over the burst (dB); exactly 0 without fading.
    """

    first: int
    samples: np.ndarray
    rx_power_w: float
    fading_gain_db: float


class PathChannel:
    """One transmitter's path (``virtual_air.paths`` entry) with its own fading process.

    Parameters
    ----------
    path
        The config's path entry.
    air
        The ``virtual_air`` section (fading model, speed, K-factor).
    center_freq_hz
        The receiver's carrier (Hz): free-space loss and Doppler.
    sample_rate_hz
        The air's sample rate ``fs`` (S/s).
    t0_true_s
        True time (s) of air sample 0.
    fading_rng
        Channel generator this path's fading realisation is drawn from (never the thermal
        noise's source).
    """

    def __init__(self, path: AirPath, air: VirtualAirSection, *, center_freq_hz: float,
                 sample_rate_hz: float, t0_true_s: float,
                 fading_rng: np.random.Generator) -> None:
        self.serial = path.serial
        self.path = path
        self.fs = float(sample_rate_hz)
        self.t0 = float(t0_true_s)
        #: Power gain (linear) and its amplitude.
        self.gain = path_gain(attenuation_db=path.attenuation_db, distance_m=path.distance_m,
                              center_freq_hz=center_freq_hz)
        self.amplitude = math.sqrt(self.gain)
        self.fading: FadingProcess | None = None
        if air.fading != "none":
            fd = doppler_hz(air.speed_kmh, center_freq_hz)
            k_db = air.rician_k_db if air.fading == "rician" else None
            self.fading = FadingProcess.draw(fd, fading_rng, rician_k_db=k_db)

    @property
    def gain_db(self) -> float:
        """Path gain (dB)."""
        return ratio_to_db(self.gain) if self.gain > 0 else -math.inf

    def start_index(self, t_true_s: float) -> float:
        """Fractional air index at which a burst sent at ``t_true_s`` (s) arrives."""
        return (t_true_s - self.t0) * self.fs + self.path.delay_samples

    def rotation(self, first: int, m: int, cfo_hz: float) -> np.ndarray:
        """``exp(j 2 pi cfo t)`` at air indices ``first .. first+m-1``, ``complex128 (m,)``;
        ``t`` the true time, so the phase runs on between bursts."""
        if cfo_hz == 0:
            return np.ones(m, dtype=np.complex128)
        ref = math.fmod(cfo_hz * self.t0, 1.0) + math.fmod(cfo_hz * first / self.fs, 1.0)
        cycles = ref + (cfo_hz / self.fs) * np.arange(m, dtype=np.float64)
        return np.exp(2j * np.pi * np.mod(cycles, 1.0))

    def receive(self, samples: np.ndarray, t_true_s: float, *, cfo_extra_hz: float = 0.0
                ) -> Received:
        """The burst ``samples`` (radiated amplitude, ``(n,)``) sent at ``t_true_s`` (s), as
        the receiver gets it (noise excluded).

        ``cfo_extra_hz`` adds to the path's ``cfo_hz`` (the transmitter's carrier minus the
        receiver's).
        """
        n = int(np.asarray(samples).size)
        first, y = place(samples, self.start_index(t_true_s))
        if self.fading is None:
            fading_gain_db = 0.0
            y *= self.amplitude
        else:
            h = self.fading.uniform(first / self.fs, y.size, 1.0 / self.fs)
            mean_h2 = float(np.mean(h.real**2 + h.imag**2)) if y.size else 1.0
            fading_gain_db = ratio_to_db(mean_h2) if mean_h2 > 0 else -math.inf
            y *= h
            y *= self.amplitude
        cfo = self.path.cfo_hz + cfo_extra_hz
        if cfo != 0:
            y *= self.rotation(first, y.size, cfo)
        energy = float(np.sum(y.real**2 + y.imag**2))
        return Received(first=first, samples=y, rx_power_w=energy / n if n else 0.0,
                        fading_gain_db=fading_gain_db)

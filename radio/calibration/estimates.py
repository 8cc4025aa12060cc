"""The statistics of a bench calibration: noise floor and its lower bound, means with
confidence intervals, clock drift from burst arrivals, the amplitude where the transmitter
compresses, whole-second PPS disagreement, and the guard the timing needs.

Pure functions of numbers (numpy, scipy on use); :mod:`radio.calibration.bench` collects the
numbers from the radios.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

#: A transmitter compresses where its received power falls this far (dB) below ``a^2``
#: scaling from the smallest amplitude measured.
COMPRESSION_DB = 1.0
#: Burst-to-burst spread (dB, standard deviation of the received power) above which the
#: power ladder cannot show compression (a fading channel).
LADDER_MAX_SPREAD_DB = 0.5
#: Burst-start jitter (s) added to the guard (as :data:`radio.tdma.BURST_START_JITTER_S`).
GUARD_JITTER_S = 0.2e-3


@dataclass(frozen=True)
class Interval:
    """A mean with a two-sided confidence interval.

    Attributes
    ----------
    mean, lower, upper
        Estimate and interval (the values' unit).
    std
        Sample standard deviation of the values (0 for one value).
    n
        How many values.
    """

    mean: float
    lower: float
    upper: float
    std: float
    n: int


def mean_interval(values: Sequence[float] | np.ndarray, confidence: float = 0.95) -> Interval:
    """Student-t interval of the mean of ``values`` (shape ``(n,)``, ``n >= 1``; one value
    gives an interval of zero width around it, which the caller must not take for a
    precise one).

    Raises
    ------
    ValueError
        No values, a non-finite value, or ``confidence`` outside (0, 1).
    """
    x = np.asarray(values, dtype=np.float64).ravel()
    if x.size == 0 or not np.all(np.isfinite(x)):
        raise ValueError(f"values: need at least one finite number, got {x.size} "
                         f"({int(np.sum(~np.isfinite(x)))} not finite)")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence: got {confidence}; allowed: 0 < confidence < 1")
    m = float(np.mean(x))
    if x.size == 1:
        return Interval(m, m, m, 0.0, 1)
    from scipy import stats  # imported on use (start-up time)

    sd = float(np.std(x, ddof=1))
    half = float(stats.t.ppf(0.5 + confidence / 2, x.size - 1)) * sd / math.sqrt(x.size)
    return Interval(m, m - half, m + half, sd, int(x.size))


def exponential_mean_interval(values: Sequence[float] | np.ndarray,
                              confidence: float = 0.95) -> Interval:
    """Interval of the mean of ``values`` (shape ``(n,)``) drawn from an exponential law:
    the received power of bursts through Rayleigh fading, each shorter than the channel's
    coherence time (longer bursts average several fades and are less spread, so the
    interval is conservative). ``2 n mean / mu`` is chi-square with ``2 n`` degrees of
    freedom.

    Raises
    ------
    ValueError
        As :func:`mean_interval`, or a negative value.
    """
    x = np.asarray(values, dtype=np.float64).ravel()
    base = mean_interval(x, confidence)
    if np.any(x < 0):
        raise ValueError("values: an exponential law has no negative values")
    from scipy import stats  # imported on use

    dof = 2 * x.size
    lo = dof * base.mean / float(stats.chi2.ppf(0.5 + confidence / 2, dof))
    hi = dof * base.mean / float(stats.chi2.ppf(0.5 - confidence / 2, dof))
    return Interval(base.mean, lo, hi, base.std, base.n)


@dataclass(frozen=True)
class NoiseEstimate:
    """Noise power per sample of a noise-only capture.

    Attributes
    ----------
    power
        Mean ``|y|^2`` (the samples' unit squared).
    lower
        One-sided lower confidence bound of the noise power at ``confidence``: the block
        means' Student-t bound, so correlated samples within a block (a receiver's filters)
        do not overstate the precision; never below 0.
    samples, blocks
        Samples used and blocks they were cut into.
    confidence
        Level of ``lower``.
    """

    power: float
    lower: float
    samples: int
    blocks: int
    confidence: float


def noise_floor(chunks: Sequence[np.ndarray], confidence: float = 0.95,
                block: int = 10_000) -> NoiseEstimate:
    """The noise power of noise-only capture ``chunks`` (complex arrays, each ``(m,)``;
    pieces between receiver gaps) and its lower confidence bound.

    Each chunk is cut into blocks of ``block`` samples (the remainder dropped); the estimate
    is the mean of the block powers, the bound their one-sided Student-t lower bound.

    Raises
    ------
    ValueError
        Fewer than 2 whole blocks, non-finite samples, or ``confidence`` outside (0, 1).
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence: got {confidence}; allowed: 0 < confidence < 1")
    if block < 1:
        raise ValueError(f"block: got {block}; allowed: an integer >= 1")
    powers: list[float] = []
    for c in chunks:
        y = np.asarray(c)
        if not np.all(np.isfinite(y)):
            raise ValueError("noise capture: non-finite samples")
        nb = y.size // block
        if nb:
            p = np.abs(y[: nb * block].astype(np.complex128)) ** 2
            powers.extend(np.mean(p.reshape(nb, block), axis=1).tolist())
    if len(powers) < 2:
        raise ValueError(f"noise capture: {len(powers)} whole block(s) of {block} samples; "
                         "allowed: at least 2 (capture longer)")
    from scipy import stats  # imported on use

    x = np.asarray(powers)
    m = float(np.mean(x))
    t = float(stats.t.ppf(confidence, x.size - 1))
    lower = max(0.0, m - t * float(np.std(x, ddof=1)) / math.sqrt(x.size))
    return NoiseEstimate(m, lower, int(x.size * block), int(x.size), confidence)


@dataclass(frozen=True)
class DriftFit:
    """A transmitter's clock against the receiver's, from burst arrivals.

    Attributes
    ----------
    drift_ppm
        How much faster the transmitter's clock runs than the receiver's (ppm).
    uncertainty_ppm
        Half-width of its 95 % interval (ppm); ``inf`` with fewer than 3 bursts.
    residual_s
        Standard deviation of the arrivals about the fitted line (s).
    span_s
        Receiver time between the first and the last burst (s).
    """

    drift_ppm: float
    uncertainty_ppm: float
    residual_s: float
    span_s: float


def fit_drift(tx_times_s: Sequence[float] | np.ndarray,
              rx_times_s: Sequence[float] | np.ndarray) -> DriftFit:
    """Fit ``rx = a + b (tx - tx[0])`` to bursts sent at transmitter times ``tx_times_s``
    and found at receiver times ``rx_times_s`` (both shape ``(n,)``, ``n >= 2``, s).

    A transmitter clock that runs ``d`` ppm fast makes ``b = 1 / (1 + d 1e-6)``. Only the
    differences from the first burst matter: pass times relative to a nearby origin to keep
    sub-sample precision (float64 resolves 0.24 us at a UNIX epoch of 1.7e9 s).

    Raises
    ------
    ValueError
        Fewer than 2 bursts, lengths differ, or all sent at one time.
    """
    tx = np.asarray(tx_times_s, dtype=np.float64)
    rx = np.asarray(rx_times_s, dtype=np.float64)
    if tx.shape != rx.shape or tx.ndim != 1 or tx.size < 2:
        raise ValueError(f"bursts: need two equal-length lists of >= 2 times, got "
                         f"{tx.shape} and {rx.shape}")
    u = tx - tx[0]
    v = rx - rx[0]  # small numbers: no precision lost to 1.7e9 s epochs
    if float(np.ptp(u)) <= 0:
        raise ValueError("bursts: all sent at the same time; allowed: spread over time")
    um = float(np.mean(u))
    suu = float(np.sum((u - um) ** 2))
    b = float(np.sum((u - um) * (v - np.mean(v)))) / suu
    a = float(np.mean(v)) - b * um
    resid = v - (a + b * u)
    dof = tx.size - 2
    if dof >= 1:
        from scipy import stats  # imported on use

        s = math.sqrt(float(np.sum(resid**2)) / dof)
        half_b = float(stats.t.ppf(0.975, dof)) * s / math.sqrt(suu)
    else:
        s, half_b = 0.0, math.inf
    drift = (1.0 / b - 1.0) * 1e6
    # d(1/b)/db = -1/b^2
    unc = half_b / (b * b) * 1e6
    return DriftFit(drift, unc, s, float(np.ptp(v)))


def compression_amplitude(amplitudes: Sequence[float] | np.ndarray,
                          powers: Sequence[float] | np.ndarray,
                          threshold_db: float = COMPRESSION_DB,
                          snr_db: Sequence[float] | np.ndarray | None = None,
                          min_snr_db: float = 10.0) -> float | None:
    """The smallest amplitude whose power falls ``threshold_db`` below ``a^2`` scaling
    (``None``: none does).

    The ``a^2`` line goes through the largest ``power / a^2`` among the points measured at
    ``min_snr_db`` or more (every point when ``snr_db`` is not given or none is): compression
    only lowers that ratio, and a point near the noise floor is too uncertain to anchor it.

    Parameters
    ----------
    amplitudes, powers
        DAC amplitudes sent and the received power of each (any one unit), shape ``(n,)``.
    snr_db
        The SNR (dB) each power was measured at, shape ``(n,)``.

    Raises
    ------
    ValueError
        Lengths differ, fewer than 2 points, or a non-positive amplitude or power.
    """
    a = np.asarray(amplitudes, dtype=np.float64)
    p = np.asarray(powers, dtype=np.float64)
    if a.shape != p.shape or a.size < 2:
        raise ValueError(f"ladder: need >= 2 (amplitude, power) pairs, got {a.size}/{p.size}")
    if np.any(a <= 0) or np.any(p <= 0):
        raise ValueError("ladder: amplitudes and powers must be > 0")
    ratio = p / a**2
    anchor = np.ones(a.size, dtype=bool)
    if snr_db is not None:
        snr = np.asarray(snr_db, dtype=np.float64)
        if snr.shape != a.shape:
            raise ValueError(f"ladder: {snr.size} SNR values for {a.size} points")
        if np.any(snr >= min_snr_db):
            anchor = snr >= min_snr_db
    ref = float(np.max(ratio[anchor]))
    short_db = 10.0 * np.log10(ref / ratio)
    order = np.argsort(a)
    hit = [int(i) for i in order if short_db[i] >= threshold_db]
    return float(a[hit[0]]) if hit else None


def whole_seconds_off(tx_minus_host_s: float, rx_minus_host_s: float) -> int:
    """Whole seconds between a transmitter's USRP time and the receiver's, both read
    against one host clock (s): 0 when both latched the same PPS second."""
    return int(round(tx_minus_host_s - rx_minus_host_s))


def guard_needed(worst_timing_error_s: Sequence[float], *, shared_time: bool,
                 mapping_uncertainty_s: float = 0.0) -> float:
    """The TDMA guard (s) the measured timing needs: the worst burst-start error seen over
    every transmitter, plus the host-to-USRP mapping uncertainty (no shared reference), plus
    the burst-start jitter allowance; at least the fixed 0.5 ms of a shared reference.

    Raises
    ------
    ValueError
        No timing measured, or a non-finite value.
    """
    w = [abs(float(x)) for x in worst_timing_error_s]
    if not w or not all(math.isfinite(x) for x in w) or not math.isfinite(mapping_uncertainty_s):
        raise ValueError("guard: need the worst timing error of at least one transmitter")
    guard = max(w) + (0.0 if shared_time else abs(mapping_uncertainty_s)) + GUARD_JITTER_S
    return max(guard, 0.5e-3) if shared_time else guard

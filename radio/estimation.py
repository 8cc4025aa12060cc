"""Complex gain and noise estimation from pilots, with confidence bounds.

Model per pilot block ``b`` (``Np`` unit-modulus pilots ``p``): ``y = h_b p + n`` with
``n ~ CN(0, N0 I)``. The least-squares gain is ``h_b = p^H y / Np`` and the residual
``RSS_b = ||y - h_b p||^2`` satisfies ``2 RSS_b / N0 ~ chi2(2 (Np - 1))`` independently of
``h_b``. Summed over ``B`` blocks, ``2 RSS / N0 ~ chi2(nu)`` with ``nu = 2 B (Np - 1)``,
which gives the exact interval ``[2 RSS / chi2_{1-a/2}(nu), 2 RSS / chi2_{a/2}(nu)]`` for
``N0``. The gain error ``h_b - h`` is ``CN(0, N0 / Np)``, so ``|h_b - h|^2 <= (N0 / Np) q``
with probability ``1 - a'`` for ``q = -ln a'``; a union bound over the ``B`` blocks
(``a' = a / B``) and ``N0 <= N0_upper`` bound ``max_b |h_b|^2`` from above. See
``docs/radio.md`` for the derivation and its assumptions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class PilotEstimate:
    """Estimates from the pilot blocks of one frame.

    Attributes
    ----------
    block_gain
        Least-squares gain per block, ``complex128``, shape ``(B,)``.
    noise_var, noise_var_lower, noise_var_upper
        ``N0`` point estimate and two-sided confidence bounds (symbol-power units).
    gain_power_upper
        Upper confidence bound on ``max_b |h_b|^2``.
    confidence
        Confidence level of the bounds.
    dof
        Degrees of freedom ``nu`` of the chi-square statistic.
    """

    block_gain: np.ndarray
    noise_var: float
    noise_var_lower: float
    noise_var_upper: float
    gain_power_upper: float
    confidence: float
    dof: int


def estimate_from_pilots(
    received: np.ndarray, pilots: np.ndarray, confidence: float
) -> PilotEstimate:
    """Estimate per-block gain and ``N0`` with confidence bounds.

    Parameters
    ----------
    received
        Received pilot symbols, shape ``(B, Np)``.
    pilots
        Known pilot block, unit modulus, shape ``(Np,)``.
    confidence
        Two-sided confidence level in ``(0, 1)``.
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    y = np.asarray(received, dtype=np.complex128)
    if y.ndim != 2 or y.shape[1] != pilots.size or y.shape[1] < 2:
        raise ValueError(f"received pilots shape {y.shape} does not match ({pilots.size},)")
    n_blocks, npb = y.shape
    h = (y @ np.conj(pilots)) / np.sum(np.abs(pilots) ** 2)
    rss = float(np.sum(np.abs(y - h[:, None] * pilots[None, :]) ** 2))
    dof = 2 * n_blocks * (npb - 1)
    alpha = 1.0 - confidence
    n0 = 2.0 * rss / dof
    from scipy import stats  # imported on use: it costs every CLI process 0.25 s

    lower = 2.0 * rss / float(stats.chi2.ppf(1.0 - alpha / 2.0, dof))
    upper = 2.0 * rss / float(stats.chi2.ppf(alpha / 2.0, dof))
    radius = np.sqrt(upper / npb * -np.log(alpha / n_blocks))
    gain_upper = float(np.max(np.abs(h) + radius) ** 2)
    return PilotEstimate(
        block_gain=h,
        noise_var=n0,
        noise_var_lower=lower,
        noise_var_upper=upper,
        gain_power_upper=gain_upper,
        confidence=confidence,
        dof=dof,
    )


#: Fewest off-frame noise samples for :func:`off_frame_noise` to bound ``N0``.
MIN_OFF_FRAME_SAMPLES = 32


@dataclass(frozen=True)
class OffFrameNoise:
    """``N0`` measured where the capture holds no signal (before and after the frame).

    Attributes
    ----------
    noise_var
        Point estimate over both sides (symbol-power units).
    noise_var_lower
        Lower confidence bound: the least of the bound over both sides and the bound of each
        side that holds :data:`MIN_OFF_FRAME_SAMPLES` samples.
    samples
        Independent samples used (``m``: ``2 sum |x|^2 / N0 ~ chi2(2 m)``).
    side_noise_var
        Point estimates before and after the frame (``nan``: too few samples there).
    """

    noise_var: float
    noise_var_lower: float
    samples: int
    side_noise_var: tuple[float, float] = (math.nan, math.nan)


def off_frame_noise(mf: np.ndarray, first_peak: float, last_peak: float, sps: int,
                    n_taps: int, confidence: float) -> OffFrameNoise | None:
    """``N0`` from the matched-filter output ``mf`` outside a frame, ``None`` when fewer than
    :data:`MIN_OFF_FRAME_SAMPLES` independent samples are there.

    ``mf`` is the full convolution of the capture with the unit-energy pulse (``n_taps``
    taps), so its noise has the pilots' variance ``N0`` and, sampled every ``sps`` samples,
    is white (a Nyquist pulse). Excluded: the first and last ``n_taps`` samples (partial
    sums at the capture's edges) and everything within ``n_taps + 2 sps`` of the frame's
    first and last symbol peaks (``first_peak``, ``last_peak``: fractional indices in
    ``mf``). Interference there (another burst) only raises the estimate. Each lower bound
    is exact: ``2 S / chi2_{1 - a/2}(2 m)`` with ``S = sum |x|^2`` over ``m`` samples. The
    bound over both sides and each side's own are all lower bounds at the confidence asked,
    so their least is one too: a burst that reaches into one side (a colliding frame that
    starts before this one or ends after it) raises that side's, not the other's.
    """
    margin = n_taps + 2 * sps
    before = np.arange(n_taps, int(np.floor(first_peak - margin)), sps)
    after = np.arange(int(np.ceil(last_peak + margin)), mf.size - n_taps, sps)
    idx = np.concatenate([before, after])
    if idx.size < MIN_OFF_FRAME_SAMPLES:
        return None
    from scipy import stats  # imported on use (see estimate_from_pilots)

    quantile = 1.0 - (1.0 - confidence) / 2.0
    power = {"both": (float(np.sum(np.abs(mf[idx]) ** 2)), idx.size)}
    sides = []
    for name, part in (("before", before), ("after", after)):
        if part.size >= MIN_OFF_FRAME_SAMPLES:
            power[name] = (float(np.sum(np.abs(mf[part]) ** 2)), part.size)
            sides.append(power[name][0] / part.size)
        else:
            sides.append(math.nan)
    lower = min(2.0 * total / float(stats.chi2.ppf(quantile, 2 * m))
                for total, m in power.values())
    total, m = power["both"]
    return OffFrameNoise(total / m, lower, int(m), (sides[0], sides[1]))


def smooth_gains(block_gain: np.ndarray, width: int) -> np.ndarray:
    """Centred moving average over ``width`` (odd) blocks, shrinking at the edges."""
    if width <= 1 or block_gain.size < 2:
        return block_gain.copy()
    half = width // 2
    c = np.concatenate([[0], np.cumsum(block_gain)])
    i = np.arange(block_gain.size)
    lo = np.maximum(i - half, 0)
    hi = np.minimum(i + half + 1, block_gain.size)
    return (c[hi] - c[lo]) / (hi - lo)


def interpolate_gain(centers: np.ndarray, gains: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Linear interpolation of complex ``gains`` known at ``centers``, evaluated ``at``."""
    return np.interp(at, centers, gains.real) + 1j * np.interp(at, centers, gains.imag)

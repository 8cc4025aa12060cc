"""Privacy loss distributions in bounded memory: coarsen the grid instead of growing it.

``dp_accounting``'s PLDs live on a grid of ``value_discretization_interval`` nats, and the
number of grid points grows with the width of the privacy loss' support: with the number of
compositions ``K`` (``self_compose(K)`` sizes its FFT by a Chernoff bound that grows about
linearly in ``K``: 23.7 GB at ``q = 0.5, z = 0.3, K = 10^6``) and with ``1 / z^2`` for a
single step. This module keeps every PLD at most :data:`MAX_PLD_POINTS` points per direction
(a few hundred MB at peak, whatever ``K`` or ``z``):

* a PLD whose support would not fit is built, or *coarsened*, on the grid ``interval x 2^j``
  for the smallest ``j`` that fits. Coarsening moves the mass of every grid point up to the
  next point of the coarser grid (losses rounded **up**): the hockey-stick divergence
  ``delta(eps) = E[(1 - e^(eps - L))_+]`` only grows when losses grow, and sums of
  independent losses that each grew are stochastically larger, so a pessimistic PLD stays
  pessimistic through coarsening and through every later composition. Epsilon can only be
  over-reported, by at most the coarse interval per coarsening;
* ``K`` identical steps are composed by repeated squaring (``O(log K)`` compositions), each
  composition truncating ``1e-15`` of tail mass the pessimistic way (left tail moved up,
  right tail to infinity) as ``dp_accounting`` does, when ``self_compose(K)`` would need
  more than :data:`MAX_PLD_POINTS` points; otherwise ``self_compose(K)`` is called as before,
  so every result that fitted before is bit for bit unchanged.

Grids are always ``base x 2^j``, so two PLDs of one engine are composed on the coarser of
their two grids (the finer one coarsened to it, exactly: the ratio is a power of two).

Two PLDs are composed as ``dp_accounting``'s ``PrivacyLossDistribution.compose`` does it
(:func:`compose_plds`: the same FFT convolution, infinity mass and tail truncation, bit for
bit), except that the search for the tails to truncate runs in numpy instead of a Python
loop over every grid point (most of a composition's time on a long PLD): it forms the same
running sums, added in the same order (``np.cumsum``), and stops at the same index.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

#: Most grid points per PLD direction (``2^22``: ~32 MB per array, ~0.5 GB at peak).
MAX_PLD_POINTS = 1 << 22
#: Coarsest grid tried, as ``base x 2^MAX_COARSENING``; beyond it epsilon is reported inf.
MAX_COARSENING = 80
_TAIL = 1e-15  # dp_accounting's default tail mass truncation per composition
_GAUSS_TAILS = 21.0  # the Gaussian PLD is built over ~ +-10.5 sd (log mass bound -50)


def _pmfs(pld: Any) -> tuple[Any, Any | None]:
    """The remove and (``None`` when symmetric) add PMFs of a ``dp_accounting`` PLD."""
    # pylint: disable=protected-access
    return pld._pmf_remove, (None if pld._symmetric else pld._pmf_add)


def interval_of(pld: Any) -> float:
    """The grid step (nats) of a ``dp_accounting`` PLD."""
    return float(_pmfs(pld)[0]._discretization)


def size_of(pld: Any) -> int:
    """Grid points of the larger direction of a PLD."""
    size: int = max(p.size for p in _pmfs(pld) if p is not None)
    return size


def _coarsen_pmf(pmf: Any, factor: int) -> Any:
    from dp_accounting.pld.pld_pmf import DensePLDPmf

    dense = pmf.to_dense_pmf()
    if factor == 1:
        return dense
    lower = int(dense._lower_loss)
    probs = np.asarray(dense._probs, dtype=float)
    # grid point i (loss i x interval) goes to ceil(i / factor) on the coarse grid
    new_lower = -((-lower) // factor)
    index = -((-(lower + np.arange(len(probs), dtype=np.int64))) // factor) - new_lower
    coarse = np.bincount(index, weights=probs)
    return DensePLDPmf(dense._discretization * factor, new_lower, coarse,
                       dense._infinity_mass, dense._pessimistic_estimate)


def coarsen(pld: Any, factor: int) -> Any:
    """The PLD on the grid ``factor`` times coarser, losses rounded up (pessimistic)."""
    from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution

    if factor == 1:
        return pld
    remove, add = _pmfs(pld)
    if not remove._pessimistic_estimate:
        raise ValueError("coarsen: only a pessimistic PLD stays an upper bound when coarsened")
    return PrivacyLossDistribution(_coarsen_pmf(remove, factor),
                                   None if add is None else _coarsen_pmf(add, factor))


def _ratio(fine: float, coarse: float) -> int:
    j = round(math.log2(coarse / fine))
    if j < 0 or fine * 2.0**j != coarse:
        raise ValueError(f"PLD grids {fine!r} and {coarse!r} are not base x 2^j")
    return 1 << j


def compose(a: Any, b: Any, max_points: int | None = None) -> Any:
    """``a`` composed with ``b``, on their coarser grid, coarsened until it fits in
    ``max_points`` (default :data:`MAX_PLD_POINTS`)."""
    max_points = MAX_PLD_POINTS if max_points is None else max_points
    ia, ib = interval_of(a), interval_of(b)
    if ia < ib:
        a = coarsen(a, _ratio(ia, ib))
    elif ib < ia:
        b = coarsen(b, _ratio(ib, ia))
    while size_of(a) + size_of(b) > max_points:
        a, b = coarsen(a, 2), coarsen(b, 2)
    return compose_plds(a, b, _TAIL)


def compose_plds(a: Any, b: Any, tail_mass_truncation: float) -> Any:
    """``a.compose(b, tail_mass_truncation)`` of ``dp_accounting`` (0.6), bit for bit, with
    the tail search in numpy (module docstring)."""
    from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution

    # pylint: disable=protected-access
    remove = _compose_pmfs(a._pmf_remove, b._pmf_remove, tail_mass_truncation)
    if a._symmetric and b._symmetric:
        return PrivacyLossDistribution(remove)
    return PrivacyLossDistribution(
        remove, _compose_pmfs(a._pmf_add, b._pmf_add, tail_mass_truncation))


def _compose_pmfs(p1: Any, p2: Any, tail_mass_truncation: float) -> Any:
    """``dp_accounting.pld.pld_pmf.compose_pmfs``; dense PMFs as ``DensePLDPmf.compose``
    with :func:`_truncate_tails` (small sparse ones are left to ``dp_accounting``)."""
    from dp_accounting.pld import pld_pmf

    if (isinstance(p1, pld_pmf.SparsePLDPmf) and isinstance(p2, pld_pmf.SparsePLDPmf)
            and p1.size * p2.size <= pld_pmf._MAX_PMF_SPARSE_SIZE):
        return pld_pmf.compose_pmfs(p1, p2, tail_mass_truncation)
    p1, p2 = p1.to_dense_pmf(), p2.to_dense_pmf()
    p1.validate_composable(p2)
    lower_loss = p1._lower_loss + p2._lower_loss
    probs = _fft_convolve(p1._probs, p2._probs)
    infinity_mass = (p1._infinity_mass + p2._infinity_mass
                     - p1._infinity_mass * p2._infinity_mass)
    offset, probs, right_tail = _truncate_tails(probs, tail_mass_truncation,
                                                p1._pessimistic_estimate)
    return pld_pmf.DensePLDPmf(p1._discretization, lower_loss + offset, probs,
                               infinity_mass + right_tail, p1._pessimistic_estimate)


def _fft_convolve(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``scipy.signal.fftconvolve(a, b)`` of two real 1-d arrays, bit for bit: the same
    ``rfftn`` / ``irfftn`` of scipy's next fast length, the same product, without its
    argument handling. ``b``'s spectrum is reused when ``b`` holds exactly the values of
    one held before (compared in full): a replay composes one event's PLD onto a growing
    state, round after round."""
    from scipy import fft as sp_fft

    if a.size == 1 or b.size == 1:  # as scipy: no axis to transform, the plain product
        product: np.ndarray = a * b
        return product
    if a.dtype.kind in "iu":  # as scipy: integer arrays are transformed as float64
        a = a.astype(np.float64)
    if b.dtype.kind in "iu":
        b = b.astype(np.float64)
    n = a.size + b.size - 1
    nfft = sp_fft.next_fast_len(n, True)
    key = (b.size, nfft, b.dtype.str)
    held = _SPECTRA.get(key)
    if held is not None and np.array_equal(held[0], b):
        spectrum_b = held[1]
    else:
        spectrum_b = sp_fft.rfftn(b, [nfft], axes=[0])
        if len(_SPECTRA) >= _SPECTRA_HELD:
            _SPECTRA.pop(next(iter(_SPECTRA)))
        _SPECTRA[key] = (b.copy(), spectrum_b)
    out: np.ndarray = sp_fft.irfftn(sp_fft.rfftn(a, [nfft], axes=[0]) * spectrum_b, [nfft],
                                    axes=[0])
    return out[:n]


#: Spectra :func:`_fft_convolve` computed for its second argument, by ``(size, FFT size,
#: dtype)``, each with a copy of the values it is the spectrum of; the oldest goes first.
_SPECTRA: dict[tuple[int, int, str], tuple[np.ndarray, np.ndarray]] = {}
_SPECTRA_HELD = 8


def _truncate_tails(probs: np.ndarray, tail_mass_truncation: float,
                    pessimistic_estimate: bool) -> tuple[int, np.ndarray, float]:
    """``dp_accounting.pld.pld_pmf._truncate_tails`` with :func:`_prefix_to_truncate`."""
    if tail_mass_truncation == 0:
        return 0, probs, 0
    left_idx = _prefix_to_truncate(probs, tail_mass_truncation / 2)
    right_idx = len(probs) - _prefix_to_truncate(np.flip(probs), tail_mass_truncation / 2)
    right_idx = max(right_idx, left_idx + 1)
    left_mass = np.sum(probs[:left_idx])
    right_mass = np.sum(probs[right_idx:])
    truncated_probs = probs[left_idx:right_idx]
    if pessimistic_estimate:
        truncated_probs[0] += left_mass
        return left_idx, truncated_probs, right_mass
    truncated_probs[-1] += right_mass
    return left_idx, truncated_probs, 0


def _prefix_to_truncate(arr: np.ndarray, threshold: float) -> int:
    """The first ``i`` whose running sum ``arr[0] + ... + arr[i]``, added left to right,
    exceeds ``threshold`` (``len(arr)``: none), as ``dp_accounting``'s Python loop finds
    it: ``np.cumsum`` adds in the same order, over chunks that grow fourfold, each chunk's
    sums continuing from the last sum of the one before (so a short tail costs little)."""
    if arr.dtype != np.float64:  # the loop itself, for anything but float64 sums
        total: Any = 0
        for i, value in enumerate(arr):
            total += value
            if total > threshold:
                return i
        return len(arr)
    n = len(arr)
    start, width = 0, 64
    carry: np.ndarray | None = None
    while start < n:
        part = arr[start:start + width]
        sums = (np.cumsum(part) if carry is None
                else np.cumsum(np.concatenate((carry, part)))[1:])
        above = np.flatnonzero(sums > threshold)
        if above.size:
            return start + int(above[0])
        carry = sums[-1:]
        start += len(part)
        width *= 4
    return n


def _self_compose_points(pld: Any, steps: int) -> int:
    """Points ``pld.self_compose(steps)`` would allocate (its own Chernoff bounds)."""
    from dp_accounting.pld import common

    most = 0
    for pmf in _pmfs(pld):
        if pmf is None:
            continue
        probs = pmf.to_dense_pmf()._probs
        lo, hi = common.compute_self_convolve_bounds(probs, steps, _TAIL)
        most = max(most, hi - lo + 1, len(probs))
    return most


def self_compose(pld: Any, steps: int, max_points: int | None = None) -> Any:
    """``pld`` composed ``steps`` times: ``pld.self_compose(steps)`` when that fits in
    ``max_points`` (default :data:`MAX_PLD_POINTS`), else by repeated squaring with
    :func:`compose` (bounded memory)."""
    max_points = MAX_PLD_POINTS if max_points is None else max_points
    if steps == 1:
        return pld
    if size_of(pld) ** 2 <= 1000 or _self_compose_points(pld, steps) <= max_points:
        return pld.self_compose(steps)
    result, power, k = None, pld, steps
    while True:
        if k & 1:
            result = power if result is None else compose(result, power, max_points)
        k >>= 1
        if not k:
            return result
        power = compose(power, power, max_points)


def grid_exponent(width: float, base: float, max_points: int | None = None) -> int | None:
    """Smallest ``j`` with ``width / (base 2^j) <= max_points`` (default
    :data:`MAX_PLD_POINTS`; ``None``: none up to :data:`MAX_COARSENING`, or ``width`` not
    finite)."""
    max_points = MAX_PLD_POINTS if max_points is None else max_points
    if not math.isfinite(width):
        return None
    j = 0
    while width / (base * 2.0**j) > max_points:
        j += 1
        if j > MAX_COARSENING:
            return None
    return j


def gaussian_width(standard_deviation: float) -> float:
    """Width (nats) of the support ``dp_accounting`` gives a Gaussian PLD of sensitivity 1
    (subsampling only narrows it): ``~21 / sd + 1 / sd^2``, or ``inf``."""
    inv = 1.0 / standard_deviation
    return _GAUSS_TAILS * inv + inv * inv

"""C_{q,s}: shared masks, the quantizer's grid and unbiasedness, and Lemma 3 by Monte Carlo."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from edge_device.compression import (
    Compressor,
    quantize,
    sparsify,
)
from testbed.core.compression_bounds import theta_qs
from testbed.core.masks import sparsify_mask

SECRET = "a3f1" * 16


def test_mask_is_reproducible_and_well_formed() -> None:
    a = sparsify_mask(SECRET, 3, 7, 1000, 100)
    b = sparsify_mask(SECRET, 3, 7, 1000, 100)
    assert np.array_equal(a, b)
    assert a.dtype == np.int64 and a.shape == (100,)
    assert np.all(np.diff(a) > 0) and a[0] >= 0 and a[-1] < 1000


def test_mask_changes_with_secret_device_and_round() -> None:
    base = sparsify_mask(SECRET, 3, 7, 1000, 100)
    for other in (
        sparsify_mask(SECRET + "x", 3, 7, 1000, 100),
        sparsify_mask(SECRET, 4, 7, 1000, 100),
        sparsify_mask(SECRET, 3, 8, 1000, 100),
    ):
        assert not np.array_equal(base, other)


def test_mask_covers_coordinates_uniformly() -> None:
    d, l, rounds = 50, 10, 4000
    counts = np.zeros(d)
    for r in range(rounds):
        counts[sparsify_mask(SECRET, 0, r, d, l)] += 1
    # each coordinate is kept with probability l/d; chi-square goodness of fit
    expected = rounds * l / d
    chi2 = float(np.sum((counts - expected) ** 2 / expected))
    # Var of count is n p (1-p); scale the statistic accordingly
    p_value = stats.chi2.sf(chi2 / (1 - l / d), d - 1)
    assert p_value > 1e-4


def test_full_mask_without_sparsification() -> None:
    assert np.array_equal(sparsify_mask(SECRET, 0, 0, 17, 17), np.arange(17))


@pytest.mark.parametrize(
    ("args", "word"),
    [
        (("", 0, 0, 10, 5), "run_secret"),
        ((SECRET, -1, 0, 10, 5), "device"),
        ((SECRET, 0, -2, 10, 5), "round_index"),
        ((SECRET, 0, 0, 10, 11), "l=11"),
        ((SECRET, 0, 0, 10, 0), "l=0"),
    ],
)
def test_mask_refuses_bad_arguments(args: tuple, word: str) -> None:
    with pytest.raises(ValueError, match=word):
        sparsify_mask(*args)


def test_sparsify_scales_kept_values() -> None:
    g = np.arange(10.0)
    idx = np.array([1, 4, 9])
    assert np.allclose(sparsify(g, idx, 10), g[idx] * 10 / 3)


def test_quantize_lands_on_the_grid_keeps_signs_and_bounds_levels() -> None:
    rng = np.random.default_rng(1)
    v = rng.normal(size=300)
    q, s = quantize(v, 8, rng)
    assert s == pytest.approx(np.linalg.norm(v))
    levels = q * 8 / s
    assert np.allclose(levels, np.round(levels), atol=1e-9)
    assert np.all(np.abs(levels) <= 8 + 1e-9)
    nonzero = q != 0
    assert np.all(np.sign(q[nonzero]) == np.sign(v[nonzero]))
    # each output is one of the two neighbouring grid points of the input
    r = np.abs(v) * 8 / s
    assert np.all((np.abs(levels) == np.floor(r)) | (np.abs(levels) == np.floor(r) + 1))


def test_quantize_zero_vector_and_fixed_scale() -> None:
    rng = np.random.default_rng(0)
    q, s = quantize(np.zeros(5), 4, rng)
    assert s == 0.0 and np.array_equal(q, np.zeros(5))
    q, s = quantize(np.array([0.5, -0.25]), 4, rng, scale=1.0)
    assert s == 1.0 and np.allclose(q * 4, np.round(q * 4))
    with pytest.raises(ValueError, match="scale"):
        quantize(np.array([2.0]), 4, rng, scale=1.0)
    with pytest.raises(ValueError, match="levels"):
        quantize(np.array([2.0]), 0, rng)


def test_quantize_is_unbiased() -> None:
    rng = np.random.default_rng(5)
    v = np.array([0.3, -0.7, 0.05, 1.2, -0.01])
    trials = 40000
    draws = np.stack([quantize(v, 2, rng)[0] for _ in range(trials)])
    se = draws.std(axis=0, ddof=1) / math.sqrt(trials)
    assert np.all(np.abs(draws.mean(axis=0) - v) <= 4 * se + 1e-12)


def test_encode_decode_without_quantization_is_exact_on_the_mask() -> None:
    comp = Compressor(d=40, l=8)
    g = np.random.default_rng(2).normal(size=40)
    enc = comp.encode(g, run_secret=SECRET, device=1, round_index=2,
                      rng=np.random.default_rng(0))
    assert enc.values.shape == (8,) and enc.norm is None
    dense = comp.decode(enc.values, run_secret=SECRET, device=1, round_index=2)
    idx = comp.mask(SECRET, 1, 2)
    assert np.allclose(dense[idx], g[idx] * 5.0)
    assert np.count_nonzero(np.delete(dense, idx)) == 0


def test_compressor_with_both_stages_off_is_identity() -> None:
    comp = Compressor(d=6, l=6, levels=None)
    g = np.arange(6.0)
    enc = comp.encode(g, run_secret=SECRET, device=0, round_index=0,
                      rng=np.random.default_rng(0))
    assert np.array_equal(comp.decode(enc.values, run_secret=SECRET, device=0, round_index=0), g)


def test_compressor_refuses_bad_configuration() -> None:
    with pytest.raises(ValueError, match="l=9"):
        Compressor(d=8, l=9)
    with pytest.raises(ValueError, match="levels"):
        Compressor(d=8, l=4, levels=0)


def _monte_carlo(g: np.ndarray, l: int, levels: int | None, trials: int) -> np.ndarray:
    d = g.size
    comp = Compressor(d=d, l=l, levels=levels)
    rng = np.random.default_rng(12345)
    out = np.empty((trials, d))
    for t in range(trials):  # the mask is random per trial: a new round each time
        enc = comp.encode(g, run_secret=SECRET, device=0, round_index=t, rng=rng)
        out[t] = comp.decode(enc.values, run_secret=SECRET, device=0, round_index=t)
    return out


@pytest.mark.parametrize(("d", "l", "levels"), [(24, 6, 2), (24, 6, 8), (24, 24, 3), (24, 8, None)])
def test_lemma3_unbiased(d: int, l: int, levels: int | None) -> None:
    g = np.random.default_rng(d + l).normal(size=d)
    trials = 20000
    draws = _monte_carlo(g, l, levels, trials)
    se = draws.std(axis=0, ddof=1) / math.sqrt(trials)
    z = (draws.mean(axis=0) - g) / se
    # 3 standard errors per coordinate; deterministic (seeded), d=24 coordinates
    assert np.all(np.abs(z) < 3.0), z
    assert stats.chi2.sf(float(np.sum(z**2)), d) > 1e-3


@pytest.mark.parametrize(("d", "l", "levels"), [(64, 16, 1), (64, 16, 2), (64, 16, 16),
                                                (64, 64, 2), (64, 4, 8)])
def test_lemma3_variance_bound(d: int, l: int, levels: int) -> None:
    """E||C(g) - g||^2 <= (theta_qs - 1) ||g||^2 with theta_qs = d/l + d/(Q sqrt(l))."""
    g = np.random.default_rng(7).standard_t(3, size=d)
    trials = 8000
    draws = _monte_carlo(g, l, levels, trials)
    err = np.sum((draws - g) ** 2, axis=1)
    mean, se = float(err.mean()), float(err.std(ddof=1) / math.sqrt(trials))
    bound = (theta_qs(d=d, l=l, levels=levels) - 1.0) * float(g @ g)
    assert mean <= bound + 3 * se, (mean, bound)
    # and the bound is not vacuous: the sparsification part alone is attained exactly
    # in expectation, so the measured error exceeds it
    assert mean >= (d / l - 1.0) * float(g @ g) - 3 * se


def test_encode_exposes_integer_levels_on_the_grid() -> None:
    comp = Compressor(d=50, l=10, levels=4)
    g = np.random.default_rng(3).normal(size=50)
    enc = comp.encode(g, run_secret=SECRET, device=0, round_index=1,
                      rng=np.random.default_rng(1))
    assert enc.levels is not None and enc.levels.dtype == np.int64
    assert enc.step == pytest.approx(enc.norm / 4)
    assert np.array_equal(enc.values, enc.levels * enc.step)
    assert np.all(np.abs(enc.levels) <= 4)


def test_fixed_scale_matches_the_aggregator_bound_and_holds() -> None:
    from edge_device.clipping import clip
    from testbed.core.compression_bounds import fixed_quantizer_scale
    from testbed.core.privacy.analysis.strict import sparse_norm_bound

    rng = np.random.default_rng(4)
    d, l, z = 400, 40, 5.0
    for mode in ("coordinate", "norm"):
        b = fixed_quantizer_scale(clip=z, d=d, l=l, clip_mode=mode)
        assert b == sparse_norm_bound(clip=z, d=d, l=l, clip_mode=mode)
        for r in range(50):
            g = clip(rng.standard_cauchy(size=d), mode=mode, bound=z)
            v = sparsify(g, sparsify_mask(SECRET, 0, r, d, l), d)
            assert np.linalg.norm(v) <= b * (1 + 1e-12)


@pytest.mark.parametrize("levels", [1, 2, 5, 16, 64])
def test_quantized_norm_bound_used_by_the_strict_accounting(levels: int) -> None:
    """||C(v)|| <= B (1 + sqrt(l)/Q) for every rounding draw when ||v|| <= B = scale."""
    rng = np.random.default_rng(levels)
    l, b = 30, 2.0
    worst = 0.0
    for _ in range(2000):
        v = rng.normal(size=l) * rng.uniform(0, 1, size=l) ** 3  # uneven magnitudes
        v *= b * rng.uniform(0.2, 1.0) / np.linalg.norm(v)
        q, _ = quantize(v, levels, rng, scale=b)
        worst = max(worst, float(np.linalg.norm(q)) / (b * (1 + math.sqrt(l) / levels)))
        q2, s2 = quantize(v, levels, rng)  # the norm as scale obeys the same bound
        assert np.linalg.norm(q2) <= s2 * (1 + math.sqrt(l) / levels) * (1 + 1e-12)
    assert worst <= 1 + 1e-12

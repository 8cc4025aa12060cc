"""Privacy noise: statistics of the secure Gaussian and the exact discrete Gaussian.

The noise cannot be seeded (by design), so these tests are statistical with thresholds
whose false-alarm probability is below about 1e-6 each.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from testbed.core import noise
from testbed.core.noise import discrete_gaussian, discrete_gaussian_pmf, gaussian


def test_gaussian_variance_mean_and_shape() -> None:
    n, sigma = 400_000, 2.5
    x = gaussian(n, sigma)
    assert x.shape == (n,) and x.dtype == np.float64
    # Var of the sample variance of a Gaussian: 2 sigma^4 / n
    assert abs(x.var() - sigma**2) < 6 * sigma**2 * math.sqrt(2 / n)
    assert abs(x.mean()) < 6 * sigma / math.sqrt(n)
    assert gaussian((3, 4), 1.0).shape == (3, 4)


def test_gaussian_is_symmetric_and_normal() -> None:
    x = gaussian(200_000, 1.0)
    positives = int(np.sum(x > 0))
    assert abs(positives - 100_000) < 6 * math.sqrt(200_000 * 0.25)
    assert stats.kstest(x, "norm").pvalue > 1e-6
    assert abs(stats.kurtosis(x)) < 6 * math.sqrt(24 / 200_000)


@pytest.mark.parametrize("n", [1, 2, 7, 10_920, (1 << 20) + 3])
def test_gaussian_is_box_muller_of_the_urandom_uniforms(
    n: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The transform against numpy's Box-Muller on the same uniforms: per chunk of at most
    2^20 values (m of them), one draw of 2 ceil(m/2) uniforms, u1 then u2; z = r cos, then
    r sin, truncated to m."""
    drawn: list[np.ndarray] = []
    real = noise.secure_uniform

    def spy(k: int) -> np.ndarray:
        drawn.append(real(k).copy())
        return drawn[-1].copy()

    monkeypatch.setattr(noise, "secure_uniform", spy)
    z = gaussian(n, 1.5)
    parts = []
    for start, u in zip(range(0, n, 1 << 20), drawn, strict=True):
        m = min(1 << 20, n - start)
        pairs = (m + 1) // 2
        assert u.shape == (2 * pairs,)
        r = np.sqrt(-2.0 * np.log(u[:pairs]))
        angle = 2.0 * np.pi * u[pairs:]
        parts.append(np.concatenate([r * np.cos(angle), r * np.sin(angle)])[:m])
    np.testing.assert_allclose(z, 1.5 * np.concatenate(parts), rtol=1e-13, atol=1e-15)


def test_gaussian_draws_differ_between_calls_and_zero_sigma_is_zero() -> None:
    assert not np.array_equal(gaussian(64, 1.0), gaussian(64, 1.0))
    assert np.array_equal(gaussian(5, 0.0), np.zeros(5))


@pytest.mark.parametrize("fn", [lambda: gaussian(4, 1.0, seed=0),
                                lambda: discrete_gaussian(4, 1.0, seed=123),
                                lambda: noise.secure_uniform(3, seed=1)])
def test_a_seed_is_refused(fn) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="seed"):
        fn()


def test_bad_parameters_are_refused() -> None:
    with pytest.raises(ValueError, match="sigma"):
        gaussian(3, -1.0)
    with pytest.raises(ValueError, match="sigma"):
        gaussian(3, float("nan"))
    with pytest.raises(ValueError, match="sigma2"):
        discrete_gaussian(3, 0)
    with pytest.raises(ValueError, match="sigma2"):
        discrete_gaussian(3, float("inf"))
    with pytest.raises(ValueError, match="n="):
        discrete_gaussian(-1, 1.0)


@pytest.mark.parametrize("sigma2", [0.4, 2.5, Fraction(49, 3)])
def test_discrete_gaussian_pmf_by_chi_square(sigma2: float | Fraction) -> None:
    n = 30_000
    x = discrete_gaussian(n, sigma2)
    assert x.dtype == np.int64
    s2 = float(sigma2)
    m = int(4 * math.sqrt(s2)) + 1  # bins -m..m, tails merged into the end bins
    support = np.arange(-m, m + 1)
    p = discrete_gaussian_pmf(support, s2)
    tail = (1.0 - p.sum()) / 2
    p[0] += tail
    p[-1] += tail
    counts = np.array([np.sum(np.clip(x, -m, m) == k) for k in support])
    chi2 = float(np.sum((counts - n * p) ** 2 / (n * p)))
    assert stats.chi2.sf(chi2, support.size - 1) > 1e-6


def test_discrete_gaussian_symmetry_and_variance() -> None:
    n, s2 = 40_000, 9.0
    x = discrete_gaussian(n, s2)
    support = np.arange(-80, 81)
    p = discrete_gaussian_pmf(support, s2)
    var = float(np.sum(support.astype(float) ** 2 * p))
    fourth = float(np.sum(support.astype(float) ** 4 * p))
    se_var = math.sqrt((fourth - var**2) / n)
    assert abs(float(np.mean(x.astype(float) ** 2)) - var) < 6 * se_var
    assert abs(float(x.mean())) < 6 * math.sqrt(var / n)
    pos, neg = int(np.sum(x > 0)), int(np.sum(x < 0))
    assert abs(pos - neg) < 6 * math.sqrt(pos + neg)


def test_discrete_gaussian_large_scale_variance() -> None:
    n, s2 = 20_000, 1e4
    x = discrete_gaussian(n, s2).astype(float)
    # for sigma2 >= 1 the variance equals sigma2 up to < 1e-30 relative (CKS Cor. 9)
    assert abs(x.var() - s2) < 6 * s2 * math.sqrt(2 / n)


@pytest.mark.parametrize(("num", "den"), [(1, 2), (23, 10), (0, 1), (7, 1)])
def test_exact_bernoulli_exp(num: int, den: int) -> None:
    n = 60_000
    hits = sum(noise._bernoulli_exp(num, den) for _ in range(n))
    p = math.exp(-num / den)
    assert abs(hits - n * p) <= 6 * math.sqrt(n * p * (1 - p)) + 1e-9

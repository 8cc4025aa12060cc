"""RDP math against closed forms and an independent high-precision (mpmath) computation."""

from __future__ import annotations

import math
import warnings

import mpmath
import pytest

from testbed.core.privacy.analysis.rdp import (
    OrderAtEdgeWarning,
    compose,
    convert,
    epsilon_from_rdp,
    gaussian_epsilon,
    gaussian_epsilon_closed_form,
    gaussian_rdp,
    gaussian_rdp_coefficient,
)

mpmath.mp.dps = 50


def test_gaussian_rdp_formula() -> None:
    assert gaussian_rdp(order=3.0, sensitivity=2.0, noise_std=4.0) == pytest.approx(3 * 4 / 32)
    assert gaussian_rdp_coefficient(sensitivity=0.0, noise_std=0.0) == 0.0
    assert gaussian_rdp_coefficient(sensitivity=1.0, noise_std=0.0) == math.inf
    assert gaussian_rdp_coefficient(sensitivity=1.0, noise_std=math.inf) == 0.0
    with pytest.raises(ValueError, match="order"):
        gaussian_rdp(order=1.0, sensitivity=1.0, noise_std=1.0)
    with pytest.raises(ValueError, match="noise_std"):
        gaussian_rdp_coefficient(sensitivity=1.0, noise_std=-1.0)


def test_composition_adds() -> None:
    assert compose(rdps=[0.1, 0.2, 0.3]) == pytest.approx(0.6)
    assert compose(rdps=[0.1, math.inf]) == math.inf
    with pytest.raises(ValueError, match=">= 0"):
        compose(rdps=[-0.1])


def _mp_standard(c: float, delta: float) -> tuple[float, float]:
    """Independent: minimise a c + log(1/delta)/(a-1) with mpmath's root finder."""
    big_l = mpmath.log(1 / mpmath.mpf(delta))
    c = mpmath.mpf(c)
    f = lambda a: a * c + big_l / (a - 1)  # noqa: E731
    a_star = mpmath.findroot(lambda a: mpmath.diff(f, a), 1 + mpmath.sqrt(big_l / c) * 1.1)
    return float(f(a_star)), float(a_star)


def _mp_balle(c: float, delta: float) -> float:
    c, dl = mpmath.mpf(c), mpmath.mpf(delta)
    f = lambda a: a * c + mpmath.log((a - 1) / a) - (mpmath.log(dl) + mpmath.log(a)) / (a - 1)  # noqa: E731
    a0 = 1 + mpmath.sqrt(mpmath.log(1 / dl) / c)
    a_star = mpmath.findroot(lambda a: mpmath.diff(f, a), a0)
    return float(f(a_star))


@pytest.mark.parametrize("c", [1e-4, 0.01, 0.37, 2.0, 50.0])
@pytest.mark.parametrize("delta", [1e-5, 1e-3])
def test_standard_conversion_matches_closed_form_and_mpmath(c: float, delta: float) -> None:
    eps, order = gaussian_epsilon(coefficient=c, delta=delta)
    closed, closed_order = gaussian_epsilon_closed_form(coefficient=c, delta=delta)
    mp_eps, mp_order = _mp_standard(c, delta)
    assert eps == pytest.approx(closed, rel=1e-10)
    assert eps == pytest.approx(mp_eps, rel=1e-10)
    assert order == pytest.approx(mp_order, rel=1e-4)
    assert closed_order == pytest.approx(mp_order, rel=1e-10)


@pytest.mark.parametrize("c", [0.01, 0.37, 2.0])
def test_balle_conversion_matches_mpmath_and_is_tighter(c: float) -> None:
    eps, _ = gaussian_epsilon(coefficient=c, delta=1e-5, conversion="balle2020")
    assert eps == pytest.approx(_mp_balle(c, 1e-5), rel=1e-9)
    assert eps < gaussian_epsilon(coefficient=c, delta=1e-5)[0]


def test_generic_curve_against_mpmath() -> None:
    """A non-linear (but increasing) RDP curve exercises the generic search."""
    rdp = lambda a: 0.05 * a + 0.002 * a * a  # noqa: E731
    eps, order = epsilon_from_rdp(rdp=rdp, delta=1e-6)
    f = lambda a: 0.05 * a + 0.002 * a * a + mpmath.log(mpmath.mpf(10) ** 6) / (a - 1)  # noqa: E731
    a_star = mpmath.findroot(lambda a: mpmath.diff(f, a), 10)
    assert eps == pytest.approx(float(f(a_star)), rel=1e-10)
    assert order == pytest.approx(float(a_star), rel=1e-4)


def test_edge_of_order_range_warns_and_interior_does_not() -> None:
    with pytest.warns(OrderAtEdgeWarning):
        epsilon_from_rdp(rdp=lambda a: 1e-3 * a, delta=1e-5, order_max=50.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gaussian_epsilon(coefficient=0.5, delta=1e-5)


def test_degenerate_coefficients() -> None:
    assert gaussian_epsilon(coefficient=0.0, delta=1e-5)[0] == 0.0
    eps, order = gaussian_epsilon(coefficient=math.inf, delta=1e-5)
    assert eps == math.inf and math.isnan(order)


def test_conversion_validation() -> None:
    with pytest.raises(ValueError, match="delta"):
        convert(rdp=1.0, order=2.0, delta=1.0)
    with pytest.raises(ValueError, match="conversion"):
        convert(rdp=1.0, order=2.0, delta=1e-5, conversion="exact")
    with pytest.raises(ValueError, match="order_min"):
        epsilon_from_rdp(rdp=lambda a: a, delta=1e-5, order_min=0.5)

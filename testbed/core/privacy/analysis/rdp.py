"""Renyi-DP math: pure, keyword-only functions; no state, no randomness, no torch.

Gaussian mechanism (Mironov 2017, Cor. 3): releasing ``f(D) + N(0, s^2 I)`` with l2
sensitivity ``Delta`` is ``(a, a Delta^2 / (2 s^2))``-RDP for every order ``a > 1``. Every
mechanism in this testbed is Gaussian (or discrete Gaussian with the same bound, Canonne et
al. 2020, univariate and multivariate), so a device's RDP curve is ``a * c`` with ``c`` the sum of
per-upload coefficients ``Delta^2 / (2 s^2)`` (composition, Mironov Prop. 1).

Conversion to ``(epsilon, delta)``-DP, for an RDP curve ``R(a)``:

* ``"standard"`` (Mironov Prop. 3; 003 Lemma 2): ``epsilon = R(a) + log(1/delta) / (a - 1)``.
* ``"balle2020"`` (Balle et al. 2020, Thm. 21; also in Canonne et al. 2020; tighter):
  ``epsilon = R(a) + log((a - 1)/a) - (log(delta) + log(a)) / (a - 1)``.

The order is optimised numerically over ``a in [ORDER_MIN, ORDER_MAX]``: a log-spaced grid
then a bounded scalar search around the best grid point. A warning is issued when the
optimum lies at the edge of that range (the true optimum lies outside; the returned epsilon
is then an upper bound, still valid, but not the best one).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterable

import numpy as np

CONVERSIONS = ("standard", "balle2020")
ORDER_MIN = 1.0 + 1e-6
ORDER_MAX = 1e9
_GRID = 400


class OrderAtEdgeWarning(UserWarning):
    """The optimal Renyi order lies at the edge of the searched range."""


def gaussian_rdp_coefficient(*, sensitivity: float, noise_std: float) -> float:
    """``c = Delta^2 / (2 s^2)``: the Gaussian mechanism's RDP is ``a * c`` at order ``a``.

    ``Delta = 0`` gives ``0`` (nothing released); ``s = 0`` with ``Delta > 0`` gives ``inf``;
    ``s = inf`` gives ``0``.
    """
    _check_nonneg("sensitivity", sensitivity, allow_inf=False)
    _check_nonneg("noise_std", noise_std, allow_inf=True)
    if sensitivity == 0:
        return 0.0
    if noise_std == 0:
        return math.inf
    if math.isinf(noise_std):
        return 0.0
    ratio = sensitivity / noise_std  # divide first: noise_std**2 may underflow to 0
    return 0.5 * ratio * ratio


def referred_noise_var(*, noise_var: float, amplitude: float) -> float:
    """Variance of noise ``N(0, noise_var)`` added after a linear gain ``amplitude``, referred
    back to the input: ``noise_var / amplitude^2``.

    ``noise_var == 0`` gives ``0`` whatever the amplitude (no noise is credited: an adversary
    that sees the signal noiselessly learns it whatever the gain); ``amplitude == 0`` with
    ``noise_var > 0`` gives ``inf`` (nothing of the input reaches the output). Overflow gives
    ``inf``, never an exception.
    """
    _check_nonneg("noise_var", noise_var, allow_inf=False)
    _check_nonneg("amplitude", amplitude, allow_inf=False)
    if noise_var == 0:
        return 0.0
    if amplitude == 0:
        return math.inf
    ratio = math.sqrt(noise_var) / amplitude
    return ratio * ratio


def gaussian_rdp(*, order: float, sensitivity: float, noise_std: float) -> float:
    """RDP of the Gaussian mechanism at ``order > 1``: ``order * Delta^2 / (2 s^2)``."""
    _check_order(order)
    c = gaussian_rdp_coefficient(sensitivity=sensitivity, noise_std=noise_std)
    return 0.0 if c == 0 else order * c


def compose(*, rdps: Iterable[float]) -> float:
    """Sequential composition: RDP values at one order add (``math.fsum``, exact order)."""
    values = [float(v) for v in rdps]
    for v in values:
        if math.isnan(v) or v < 0:
            raise ValueError(f"compose: RDP values must be >= 0, got {v}")
    if any(math.isinf(v) for v in values):
        return math.inf
    return math.fsum(values)


def convert(*, rdp: float, order: float, delta: float, conversion: str = "standard") -> float:
    """``epsilon`` at one order from the RDP value ``rdp`` at that order."""
    _check_order(order)
    _check_delta(delta)
    if conversion not in CONVERSIONS:
        raise ValueError(f"convert: conversion={conversion!r} not in {CONVERSIONS}")
    if math.isinf(rdp):
        return math.inf
    if conversion == "standard":
        return rdp + math.log(1.0 / delta) / (order - 1.0)
    eps = rdp + math.log1p(-1.0 / order) - (math.log(delta) + math.log(order)) / (order - 1.0)
    return max(eps, 0.0)


def epsilon_from_rdp(
    *,
    rdp: Callable[[float], float],
    delta: float,
    conversion: str = "standard",
    order_min: float = ORDER_MIN,
    order_max: float = ORDER_MAX,
    vectorized: Callable[[np.ndarray], np.ndarray] | None = None,
) -> tuple[float, float]:
    """Smallest ``epsilon`` over Renyi orders, and the order attaining it.

    Parameters
    ----------
    rdp
        The RDP curve ``a -> R(a)`` (non-decreasing in ``a``, as every RDP curve is).
    delta
        Target ``delta`` in ``(0, 1)``.
    conversion
        ``"standard"`` or ``"balle2020"`` (module docstring).
    order_min, order_max
        Search range, ``1 < order_min < order_max``.
    vectorized
        Optional: epsilon (after conversion) over an array of orders, used for the grid
        stage only (speed); must agree with ``rdp`` and ``conversion``.

    Returns
    -------
    tuple
        ``(epsilon, order)``. ``(inf, nan)`` when ``R`` is infinite everywhere.

    Warns
    -----
    OrderAtEdgeWarning
        When the optimum is at ``order_min`` or ``order_max``.
    """
    _check_delta(delta)
    if conversion not in CONVERSIONS:
        raise ValueError(f"epsilon_from_rdp: conversion={conversion!r} not in {CONVERSIONS}")
    if not (1.0 < order_min < order_max):
        raise ValueError(
            f"epsilon_from_rdp: need 1 < order_min < order_max, got {order_min}, {order_max}"
        )
    lo, hi = math.log(order_min - 1.0), math.log(order_max - 1.0)

    def objective(x: float) -> float:
        a = 1.0 + math.exp(x)
        return convert(rdp=float(rdp(a)), order=a, delta=delta, conversion=conversion)

    grid = np.linspace(lo, hi, _GRID)
    if vectorized is not None:
        values = np.asarray(vectorized(1.0 + np.exp(grid)), dtype=np.float64)
    else:
        values = np.array([objective(float(x)) for x in grid])
    if not np.any(np.isfinite(values)):
        return math.inf, math.nan
    i = int(np.argmin(values))
    best_x, best = float(grid[i]), float(values[i])
    left, right = float(grid[max(i - 1, 0)]), float(grid[min(i + 1, _GRID - 1)])
    if right > left:
        from scipy.optimize import minimize_scalar  # on use: scipy.optimize takes 0.3 s

        res = minimize_scalar(
            objective, bounds=(left, right), method="bounded", options={"xatol": 1e-10}
        )
        if res.success and float(res.fun) < best:
            best_x, best = float(res.x), float(res.fun)
    order = 1.0 + math.exp(best_x)
    span = (hi - lo) / (_GRID - 1)
    if best_x <= lo + 0.5 * span or best_x >= hi - 0.5 * span:
        warnings.warn(
            f"optimal Renyi order {order:.6g} is at the edge of [{order_min:g}, {order_max:g}]; "
            "epsilon is a valid upper bound but may not be the smallest",
            OrderAtEdgeWarning,
            stacklevel=2,
        )
    return best, order


def gaussian_epsilon(
    *, coefficient: float, delta: float, conversion: str = "standard"
) -> tuple[float, float]:
    """``(epsilon, order)`` for the RDP curve ``a -> a * coefficient`` (composed Gaussians).

    ``coefficient == 0`` (nothing released) gives ``(0.0, inf)`` without a search.
    """
    _check_nonneg("coefficient", coefficient, allow_inf=True)
    if coefficient == 0:
        _check_delta(delta)
        return 0.0, math.inf
    if math.isinf(coefficient):
        _check_delta(delta)
        return math.inf, math.nan
    return epsilon_from_rdp(
        rdp=lambda a: a * coefficient,
        delta=delta,
        conversion=conversion,
        vectorized=lambda a: _convert_array(a * coefficient, a, delta, conversion),
    )


def _convert_array(rdp: np.ndarray, order: np.ndarray, delta: float, conversion: str) -> np.ndarray:
    """:func:`convert` over arrays of orders (same formulas)."""
    if conversion == "standard":
        return rdp + math.log(1.0 / delta) / (order - 1.0)
    eps = rdp + np.log1p(-1.0 / order) - (math.log(delta) + np.log(order)) / (order - 1.0)
    out: np.ndarray = np.maximum(eps, 0.0)
    return out


def gaussian_epsilon_closed_form(*, coefficient: float, delta: float) -> tuple[float, float]:
    """Standard conversion minimised analytically for ``R(a) = a c`` (SEED-NOTES item 3).

    ``a* = 1 + sqrt(log(1/delta) / c)``, ``epsilon = c + 2 sqrt(c log(1/delta))``.
    """
    _check_nonneg("coefficient", coefficient, allow_inf=False)
    _check_delta(delta)
    if coefficient == 0:
        return 0.0, math.inf
    big_l = math.log(1.0 / delta)
    return coefficient + 2.0 * math.sqrt(coefficient * big_l), 1.0 + math.sqrt(
        big_l / coefficient
    )


def _check_order(order: float) -> None:
    if not (isinstance(order, int | float) and order > 1 and not math.isnan(order)):
        raise ValueError(f"order={order!r} must be a real number > 1")


def _check_delta(delta: float) -> None:
    if not (isinstance(delta, int | float) and 0 < delta < 1):
        raise ValueError(f"delta={delta!r} must lie in (0, 1)")


def _check_nonneg(name: str, value: float, *, allow_inf: bool) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float | np.floating):
        raise ValueError(f"{name}={value!r} must be a real number >= 0")
    if math.isnan(value) or value < 0 or (math.isinf(value) and not allow_inf):
        raise ValueError(f"{name}={value!r} must be >= 0" + ("" if allow_inf else " and finite"))

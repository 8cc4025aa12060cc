"""Renyi DP of the Poisson-subsampled Gaussian, vectorized: pure keyword-only functions.

The numbers are those of Google's ``dp_accounting`` (``RdpAccountant`` with a
``PoissonSampledDpEvent(q, GaussianDpEvent(z))``, add/remove relation), which follows
Mironov, Talwar, Zhang 2019 (arXiv:1908.10530), Sec. 3.3:

* integer order ``a``: ``A_a = sum_i C(a, i) (1-q)^(a-i) q^i exp((i^2 - i) / (2 z^2))``;
* fractional order: the two-sided series of Sec. 3.3 with ``|C(a, i)|`` (an upper bound),
  summed until both terms decrease and lie ``e^-30`` below the running total;

and the RDP at order ``a`` is ``log(A_a) / (a - 1)``, valid for the mixture against the base
distribution *and* the reverse (their Thm. 5), i.e. for adding and removing a record.
``dp_accounting`` evaluates these sums in a Python loop per order (20-80 ms for its 156
default orders); here every order is evaluated in one numpy pass (about 1 ms), and the
tests check that the two agree to ``1e-10`` relative.

Replace-one neighbours ``D = R + {x}``, ``D' = R + {x'}`` are two add/remove steps apart
(through ``R``); Mironov 2017, Prop. 11 (Hoelder, ``p = q = 2``) gives, for the composed
mechanism ``M``, ``D_a(M(D) || M(D')) <= (a - 1/2)/(a - 1) E(2a) + E(2a - 1)`` with ``E`` the
composed add/remove RDP curve (which bounds both directions): :func:`replace_one_rdp`.
"""

from __future__ import annotations

import functools
import math

import numpy as np

#: Renyi orders searched by the record accountant: dp_accounting's default grid
#: (1.1 .. 10.9, 11 .. 63, 128 .. 1024), widened at both ends.
ORDERS: tuple[float, ...] = tuple(
    [1.02, 1.04, 1.06, 1.08]
    + [1 + x / 10.0 for x in range(1, 100)]
    + [float(a) for a in range(11, 64)]
    + [64.0, 80.0, 96.0, 112.0, 128.0, 160.0, 192.0, 224.0, 256.0, 320.0, 384.0, 448.0,
       512.0, 640.0, 768.0, 896.0, 1024.0, 1536.0, 2048.0, 3072.0, 4096.0]
)
#: dp_accounting's conversion ignores orders <= 1.01 (it returns inf there).
_MIN_USABLE_ORDER = 1.01
_FRAC_MAX_TERMS = 1000  # dp_accounting's _MAX_STEPS_LOG_A_FRAC
_FRAC_CHUNK = 32


def extended_orders(orders: tuple[float, ...]) -> tuple[float, ...]:
    """``orders`` together with ``2a`` and ``2a - 1`` for each ``a`` (sorted, unique).

    The replace-one bound at order ``a`` needs the add/remove curve at ``2a`` and ``2a - 1``.
    """
    values = set(orders) | {2.0 * a for a in orders} | {2.0 * a - 1.0 for a in orders}
    return tuple(sorted(values))


@functools.lru_cache(maxsize=8)
def _integer_terms(orders: tuple[float, ...]) -> tuple[np.ndarray, ...]:
    """Flat ``(i, a - i, log C(a, i))`` over every integer order, and segment starts."""
    from scipy import special  # on use, as below: 30 ms to import, which a run may not need

    ints = [int(a) for a in orders if float(a).is_integer()]
    i = np.concatenate([np.arange(a + 1, dtype=np.float64) for a in ints])
    a = np.concatenate([np.full(a + 1, a, dtype=np.float64) for a in ints])
    log_comb = special.gammaln(a + 1) - special.gammaln(i + 1) - special.gammaln(a - i + 1)
    starts = np.cumsum([0] + [a + 1 for a in ints[:-1]]).astype(np.intp)
    return i, a - i, log_comb, starts, np.array(ints, dtype=np.float64)


def _log_a_integer(q: float, z: float, orders: tuple[float, ...]) -> np.ndarray:
    """``log A_a`` at the integer orders of ``orders`` (in their order)."""
    i, rest, log_comb, starts, _ = _integer_terms(orders)
    with np.errstate(over="ignore", divide="ignore"):
        terms = log_comb + i * math.log(q) + rest * math.log1p(-q) + (i * i - i) / (2 * z * z)
    top = np.maximum.reduceat(terms, starts)
    safe = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(over="ignore", invalid="ignore"):
        sums = np.add.reduceat(np.exp(terms - np.repeat(safe, np.diff(np.append(starts,
                                                                              terms.size)))),
                               starts)
        out = safe + np.log(sums)
    return np.where(np.isfinite(top), out, top)


def _log_erfc(x: np.ndarray) -> np.ndarray:
    from scipy import special

    out: np.ndarray = math.log(2.0) + special.log_ndtr(-x * math.sqrt(2.0))
    return out


def _log_a_fractional(q: float, z: float, alphas: np.ndarray) -> np.ndarray:
    """``log A_a`` at fractional orders ``alphas`` (series of Sec. 3.3, ``|C(a, i)|``).

    Terms are evaluated in chunks for the orders whose series has not yet stopped, with
    dp_accounting's stopping rule: both terms decreasing and ``e^-30`` below the total.
    """
    from scipy import special

    z0 = z * z * math.log(1.0 / q - 1.0) + 0.5
    log_q, log_1mq = math.log(q), math.log1p(-q)
    out = np.full(alphas.shape, np.inf)  # an order that does not converge stays inf
    active = np.arange(alphas.size)
    total = np.full(alphas.shape, -np.inf)
    last0 = np.full(alphas.shape, -np.inf)
    last1 = np.full(alphas.shape, -np.inf)
    start = 0
    while active.size and start < _FRAC_MAX_TERMS:
        width = min(_FRAC_CHUNK, _FRAC_MAX_TERMS - start)
        i = np.arange(start, start + width, dtype=np.float64)[None, :]
        a = alphas[active][:, None]
        j = a - i
        log_coef = special.gammaln(a + 1) - special.gammaln(i + 1) - special.gammaln(j + 1)
        with np.errstate(over="ignore"):
            s0 = (log_coef + i * log_q + j * log_1mq + (i * i - i) / (2 * z * z)
                  + math.log(0.5) + _log_erfc((i - z0) / (math.sqrt(2.0) * z)))
            s1 = (log_coef + j * log_q + i * log_1mq + (j * j - j) / (2 * z * z)
                  + math.log(0.5) + _log_erfc((z0 - j) / (math.sqrt(2.0) * z)))
        step = np.logaddexp(s0, s1)
        step[:, 0] = np.logaddexp(step[:, 0], total[active])
        run = np.logaddexp.accumulate(step, axis=1)
        prev0 = np.concatenate([last0[active][:, None], s0[:, :-1]], axis=1)
        prev1 = np.concatenate([last1[active][:, None], s1[:, :-1]], axis=1)
        stop = (s0 < prev0) & (s1 < prev1) & (np.maximum(s0, s1) < run - 30.0)
        done = stop.any(axis=1)
        first = np.argmax(stop, axis=1)
        rows = np.arange(active.size)
        out[active[done]] = run[rows[done], first[done]]
        total[active] = run[:, -1]
        last0[active] = s0[:, -1]
        last1[active] = s1[:, -1]
        active = active[~done]
        start += width
    return out


def sgm_rdp(*, q: float, noise_multiplier: float, orders: tuple[float, ...]) -> np.ndarray:
    """RDP of one Poisson-subsampled Gaussian step (add/remove) at each order.

    Parameters
    ----------
    q
        Sampling probability in ``(0, 1]``.
    noise_multiplier
        ``z = std / sensitivity`` (``>= 0``, may be ``inf``).
    orders
        Renyi orders ``> 1`` (a tuple, so the integer-order tables can be cached).

    Returns
    -------
    numpy.ndarray
        Shape ``(len(orders),)``, float64, nats; ``inf`` where unbounded (``z = 0``).
    """
    if not (isinstance(q, int | float) and 0 < q <= 1):
        raise ValueError(f"sgm_rdp: q={q!r} must lie in (0, 1]")
    z = float(noise_multiplier)
    if math.isnan(z) or z < 0:
        raise ValueError(f"sgm_rdp: noise_multiplier={noise_multiplier!r} must be >= 0")
    alphas = np.asarray(orders, dtype=np.float64)
    if alphas.ndim != 1 or np.any(alphas <= 1):
        raise ValueError("sgm_rdp: orders must be a flat sequence of numbers > 1")
    if z == 0:
        return np.full(alphas.shape, np.inf)
    if math.isinf(z):
        return np.zeros(alphas.shape)
    if q == 1:
        return alphas / (2 * z * z)
    out = np.empty(alphas.shape)
    is_int = np.array([float(a).is_integer() for a in orders])
    if is_int.any():
        log_a = _log_a_integer(float(q), z, orders)
        out[is_int] = log_a / (alphas[is_int] - 1)
    if (~is_int).any():
        log_a = _log_a_fractional(float(q), z, alphas[~is_int])
        out[~is_int] = log_a / (alphas[~is_int] - 1)
    return out


def replace_one_rdp(
    *, orders: tuple[float, ...], extended: tuple[float, ...], rdp: np.ndarray
) -> np.ndarray:
    """Replace-one RDP at ``orders`` from the add/remove curve ``rdp`` on ``extended``.

    ``(a - 1/2)/(a - 1) E(2a) + E(2a - 1)`` (module docstring); ``extended`` must be
    :func:`extended_orders` of ``orders``.
    """
    grid = np.asarray(extended)
    a = np.asarray(orders)
    at_2a = np.searchsorted(grid, 2.0 * a)
    at_2a1 = np.searchsorted(grid, 2.0 * a - 1.0)
    if not (np.array_equal(grid[at_2a], 2.0 * a) and np.array_equal(grid[at_2a1], 2.0 * a - 1)):
        raise ValueError("replace_one_rdp: extended must be extended_orders(orders)")
    out: np.ndarray = (a - 0.5) / (a - 1.0) * rdp[at_2a] + rdp[at_2a1]
    return out


def restrict(*, orders: tuple[float, ...], extended: tuple[float, ...],
             rdp: np.ndarray) -> np.ndarray:
    """The values of ``rdp`` (on ``extended``) at ``orders`` (a subset of it)."""
    return rdp[np.searchsorted(np.asarray(extended), np.asarray(orders))]


def rdp_to_epsilon(
    *, orders: tuple[float, ...], rdp: np.ndarray, delta: float
) -> tuple[float, float, bool]:
    """``(epsilon, order, at_edge)`` from an RDP curve, with dp_accounting's conversion.

    ``dp_accounting.rdp.compute_epsilon`` (Canonne et al. 2020, Prop. 12; Balle et al. 2020,
    Thm. 21):
    ``eps = R(a) + log1p(-1/a) - log(delta a) / (a - 1)`` (orders ``<= 1.01`` excluded).
    ``at_edge`` is ``True`` when the optimum is the smallest usable or the largest order:
    the epsilon is then a valid bound, but a wider grid could give a smaller one.
    ``(0.0, inf, False)`` for an all-zero curve (nothing released).
    """
    from dp_accounting.rdp import compute_epsilon

    values = np.asarray(rdp, dtype=np.float64)
    if not np.any(values):
        return 0.0, math.inf, False
    eps, order = compute_epsilon(orders, values, delta)
    eps, order = float(eps), float(order)
    if not math.isfinite(eps):
        return math.inf, math.nan, False
    usable = [a for a in orders if a > _MIN_USABLE_ORDER]
    at_edge = eps > 0 and order in (usable[0], usable[-1])
    return eps, order, at_edge


def round_down(value: float, resolution: float) -> float:
    """Largest point ``(1 + resolution)^k <= value`` of a log grid (``value`` if ``0``).

    Used to share cached computations between nearby noise multipliers: rounding ``z``
    *down* can only overstate epsilon (conservative). ``0``, ``inf`` and
    ``resolution == 0`` return ``value`` unchanged.
    """
    if resolution == 0 or value == 0 or math.isinf(value):
        return value
    step = math.log1p(resolution)
    k = math.floor(math.log(value) / step)
    out = math.exp(k * step)
    while out > value:  # floating-point guard: never round up
        k -= 1
        out = math.exp(k * step)
    return out

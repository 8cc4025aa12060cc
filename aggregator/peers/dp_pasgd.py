"""DP-PASGD (paper 000, Hu et al.): the resource-constrained planner.

Pure functions, no randomness. Device ``m`` takes ``K`` noisy local steps and the models are
averaged every ``tau`` steps; a round costs ``c1`` (one upload) and a step ``c2`` (eq. 8).
Here: that resource model (:func:`resource_cost`, :func:`tau_star`, :func:`max_period`),
Theorem 1's convergence bound (:class:`BoundConstants`, :func:`convergence_bound`) and the
planner of problem (21) (:func:`plan_dp_pasgd`, returning a :class:`DpPasgdPlan`), which
enumerates every feasible integer ``(K, tau)`` and reports the paper's relaxed solution
beside it.

The noise is calibrated by the zCDP accounting of
:mod:`aggregator.peers.dp_pasgd_accounting` (with the corrected root). Derivations and the
planner's rounding: ``docs/peers/dp-pasgd.md``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from aggregator.peers.checks import check_delta, check_epsilon, check_int, check_real
from aggregator.peers.dp_pasgd_accounting import (
    paper_epsilon,
    paper_noise_multiplier,
    rho_star,
    rho_star_printed,
    rho_total,
    sigma_for,
    zcdp_to_eps,
)

#: The exhaustive planner enumerates every (K, tau); it refuses budgets allowing more steps.
MAX_PLANNED_STEPS = 10**6
_PAIRS_PER_CHUNK = 1 << 20
_RELAXED_GRID = 4000


# ---------------------------------------------------------------------------- resource model
def resource_cost(K: int, tau: int, *, c1: float = 100.0, c2: float = 1.0) -> float:
    """Eq. (8): ``c1 K / tau + c2 K`` (communication per round, computation per step)."""
    where = "resource_cost"
    K, tau = check_int(where, "K", K, 1), check_int(where, "tau", tau, 1)
    return (check_real(where, "c1", c1, 0.0) * K / tau
            + check_real(where, "c2", c2, 0.0, low_open=True) * K)


def tau_star(K: float, C_th: float, *, c1: float = 100.0, c2: float = 1.0) -> float:
    """Eq. (22), relaxed: the ``tau`` that makes (8) tight, ``c1 K / (C_th - c2 K)``.

    ``K`` real in ``(0, C_th / c2)``. The planner uses the smallest feasible integer above it.
    """
    where = "tau_star"
    C_th = check_real(where, "C_th", C_th, 0.0, low_open=True)
    c2 = check_real(where, "c2", c2, 0.0, low_open=True)
    K = check_real(where, "K", K, 0.0, C_th / c2, low_open=True, high_open=True)
    return check_real(where, "c1", c1, 0.0) * K / (C_th - c2 * K)


def max_period(learning_rate: float, smoothness: float) -> int:
    """Largest integer ``tau`` with ``eta L + eta^2 L^2 tau (tau - 1) <= 1`` (eq. 21e)."""
    eta_l = (check_real("max_period", "learning_rate", learning_rate, 0.0, low_open=True)
             * check_real("max_period", "smoothness", smoothness, 0.0, low_open=True))
    if eta_l > 1.0:
        raise ValueError(f"learning_rate={learning_rate!r} gives learning_rate * smoothness = "
                         f"{eta_l:g}; (21e) needs it in (0, 1]")
    cap = float(MAX_PLANNED_STEPS)
    slack = (1.0 - eta_l) / (eta_l * eta_l)
    tau = int(min(cap, (1.0 + math.sqrt(1.0 + 4.0 * slack)) / 2.0))
    while tau > 1 and eta_l + eta_l * eta_l * tau * (tau - 1) > 1.0:
        tau -= 1
    while tau < cap and eta_l + eta_l * eta_l * (tau + 1) * tau <= 1.0:
        tau += 1
    return max(tau, 1)


# ---------------------------------------------------------------------------- convergence bound
@dataclass(frozen=True)
class BoundConstants:
    """Constants of Theorem 1 (none is printed in the paper: estimate them beforehand).

    Attributes
    ----------
    d
        Model size (number of parameters).
    num_devices
        ``M``.
    smoothness
        ``L``, Lipschitz constant of the gradient (1 / parameter units^2 times loss).
    strong_convexity
        ``lambda`` in ``(1/2)||grad L||^2 >= lambda (L - L*)``; ``<= smoothness``.
    learning_rate
        ``eta``, with ``eta * smoothness <= 1`` (eq. 21e at ``tau = 1``).
    grad_variance
        ``xi^2``, variance bound of the mini-batch gradient (gradient units^2).
    initial_gap
        ``alpha = L(theta^0) - L*`` (loss units; the paper takes the initial loss).
    """

    d: int
    num_devices: int
    smoothness: float
    strong_convexity: float
    learning_rate: float
    grad_variance: float
    initial_gap: float

    def __post_init__(self) -> None:
        where = "BoundConstants"
        check_int(where, "d", self.d, 1)
        check_int(where, "num_devices", self.num_devices, 1)
        smooth = check_real(where, "smoothness", self.smoothness, 0.0, low_open=True)
        check_real(where, "strong_convexity", self.strong_convexity, 0.0, smooth, low_open=True)
        max_period(self.learning_rate, smooth)  # validates learning_rate
        check_real(where, "grad_variance", self.grad_variance, 0.0)
        check_real(where, "initial_gap", self.initial_gap, 0.0)

    def floor(self, tau: Any, sigma2: Any) -> Any:
        """Eq. (13)/(21b): ``B = (eta L + eta^2 L^2 (tau-1) M)/(2 lambda M) (xi^2 + d sigma^2)``."""
        eta, lip, lam, m = (self.learning_rate, self.smoothness, self.strong_convexity,
                            self.num_devices)
        factor = (eta * lip + eta * eta * lip * lip * (tau - 1.0) * m) / (2.0 * lam * m)
        return factor * (self.grad_variance + self.d * sigma2)

    def bound(self, K: Any, tau: Any, sigma2: Any) -> Any:
        """Eq. (12)/(21a): ``(1 - eta lambda)^K (alpha - B) / K + B`` (arrays broadcast)."""
        b = self.floor(tau, sigma2)
        with np.errstate(divide="ignore"):
            decay = np.exp(K * np.log1p(-self.learning_rate * self.strong_convexity))
        return decay * (self.initial_gap - b) / K + b


def convergence_bound(K: int, tau: int, sigma: float, constants: BoundConstants) -> float:
    """Theorem 1, as printed: bound on ``E[L(theta*) - L*]`` after ``K`` steps (loss units).

    ``K`` must be a multiple of ``tau`` (the theorem's assumption); ``sigma`` is the noise
    std per coordinate (every device the same).
    """
    where = "convergence_bound"
    K, tau = check_int(where, "K", K, 1), check_int(where, "tau", tau, 1)
    if K % tau:
        raise ValueError(f"K={K} must be a multiple of tau={tau} (Theorem 1)")
    if tau > max_period(constants.learning_rate, constants.smoothness):
        raise ValueError(f"tau={tau} violates (21e) for learning_rate="
                         f"{constants.learning_rate!r}, smoothness={constants.smoothness!r}")
    sigma = check_real("convergence_bound", "sigma", sigma, 0.0)
    return float(constants.bound(float(K), float(tau), sigma * sigma))


# ---------------------------------------------------------------------------- planner
@dataclass(frozen=True)
class DpPasgdPlan:
    """A DP-PASGD configuration: ``K`` local steps, averaging every ``tau``, noise ``sigma``.

    Attributes
    ----------
    K, tau, rounds
        Local steps, averaging period and uploads (``K = rounds * tau``).
    sigma
        Noise std per coordinate added to each mini-batch gradient (gradient units).
    noise_multiplier
        ``sigma / (2G/X)`` (replace-one).
    rho, rho_star
        zCDP spent (``2 K G^2/(X^2 sigma^2)``) and allowed (corrected root), nats.
    eps_zcdp
        ``zcdp_to_eps(rho, delta)`` (paper accounting, corrected root), ``<= eps_target``.
    sigma_printed_root, eps_printed_root
        What the printed (23) would set for this ``K``, and the epsilon it really gives.
    cost
        Eq. (8) at ``(K, tau)``, ``<= C_th``.
    objective, floor
        Theorem 1's bound at the plan and its ``B`` term (loss units).
    k_relaxed, tau_relaxed
        The paper's continuous solution of (24) (corrected root, ``tau >= 1``), for comparison.
    cost_paper_rounding
        Eq. (8) at ``(round(k_relaxed), max(1, round(tau_relaxed)))``: the paper's heuristic,
        which may exceed ``C_th`` and need not have ``tau | K``.
    """

    eps_target: float
    delta: float
    C_th: float
    c1: float
    c2: float
    G: float
    X: float
    d: int
    num_devices: int
    smoothness: float
    strong_convexity: float
    learning_rate: float
    grad_variance: float
    initial_gap: float
    K: int
    tau: int
    rounds: int
    sigma: float
    noise_multiplier: float
    rho: float
    rho_star: float
    eps_zcdp: float
    sigma_printed_root: float
    eps_printed_root: float
    cost: float
    objective: float
    floor: float
    k_relaxed: float
    tau_relaxed: float
    cost_paper_rounding: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (plain ints and floats, all finite)."""
        out = asdict(self)
        out["accounting"] = "zcdp-paper-corrected-root"
        return out


def _pairs(C_th: float, c1: float, c2: float, tau_cap: int) -> Any:
    """Yield chunks ``(K, tau)`` of every integer pair with ``tau | K`` within budget (8)."""
    tau_hi = min(tau_cap, int((C_th - c1) / c2) + 1)
    taus = np.arange(1, tau_hi + 1, dtype=np.int64)
    r_max = np.floor(C_th / (c1 + c2 * taus)).astype(np.int64) + 1  # one spare, filtered
    start = 0
    while start < taus.size:
        counts = np.cumsum(r_max[start:])
        stop = start + max(1, int(np.searchsorted(counts, _PAIRS_PER_CHUNK, side="right")))
        t, n = taus[start:stop], r_max[start:stop]
        tau = np.repeat(t, n)
        offsets = np.repeat(np.cumsum(n) - n, n)
        rounds = np.arange(tau.size, dtype=np.int64) - offsets + 1
        K = rounds * tau
        cost = c1 * K / tau + c2 * K  # the formula resource_cost uses, element by element
        keep = cost <= C_th
        yield K[keep], tau[keep]
        start = stop


def _relaxed(C_th: float, c1: float, c2: float, tau_cap: int, sigma2_per_step: float,
             constants: BoundConstants) -> tuple[float, float]:
    """Minimise (24) over real ``K`` with ``tau = max(1, tau*(K)) <= tau_cap``."""
    from scipy import optimize

    k_hi = C_th / c2 * tau_cap / (tau_cap + c1 / c2)  # tau*(k_hi) = tau_cap
    if k_hi <= 1.0:
        return 1.0, 1.0

    def period(k: Any) -> Any:  # (22), at least 1; c1 = 0 makes communication free
        return np.maximum(1.0, c1 * k / (C_th - c2 * k)) if c1 > 0 else np.ones_like(k)

    def f(k: Any) -> Any:
        return constants.bound(k, period(k), sigma2_per_step * k)

    grid = np.unique(np.concatenate([np.geomspace(1.0, k_hi, _RELAXED_GRID),
                                     np.linspace(1.0, k_hi, _RELAXED_GRID)]))
    i = int(np.argmin(f(grid)))
    lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, grid.size - 1)]
    k = grid[i]
    if hi > lo:
        res = optimize.minimize_scalar(lambda x: float(f(np.float64(x))), bounds=(lo, hi),
                                       method="bounded", options={"xatol": 1e-9 * hi})
        if res.fun <= f(k):
            k = float(res.x)
    return float(k), float(period(np.float64(k)))


def plan_dp_pasgd(eps: float, delta: float, C_th: float, *, c1: float = 100.0,
                  c2: float = 1.0, G: float, X: float, d: int, num_devices: int,
                  smoothness: float, strong_convexity: float, learning_rate: float,
                  grad_variance: float, initial_gap: float) -> DpPasgdPlan:
    """Best ``(K, tau, sigma)`` for Theorem 1's bound under the privacy and resource budgets.

    Problem (21): minimise (21a) over integers ``K, tau`` and ``sigma`` subject to (21c) (with
    the corrected root), (21d) and (21e). The bound grows with ``sigma`` and, for fixed ``K``,
    with ``tau``; so ``sigma = sigma_for(eps, delta, K, G, X)``. Instead of the paper's
    heuristic (relax, descend on (24), round ``K*`` and ``tau*`` to the nearest integers) every
    integer pair with ``tau | K`` (Theorem 1 and (8) assume it), ``tau`` within (21e) and
    ``c1 K/tau + c2 K <= C_th`` is evaluated: the optimum of the integer problem, which is
    the smallest divisor of ``K`` not below ``tau*`` (22) for the best ``K``. Ties go to the
    smallest ``K``. The relaxed solution is reported beside it.

    Parameters
    ----------
    eps, delta
        Privacy target ``eps > 0``, ``delta in (0, 1)`` (paper default ``delta = 1e-4``).
    C_th
        Resource budget, ``>= c1 + c2`` (one step and one upload).
    c1, c2
        Cost of one upload (averaging round) and of one local step (paper: 100 and 1).
    G, X
        Per-example gradient norm bound and mini-batch size (> 0).
    d, num_devices, smoothness, strong_convexity, learning_rate, grad_variance, initial_gap
        Theorem 1's constants (:class:`BoundConstants`); the paper prints none.

    Raises
    ------
    ValueError
        Naming the argument, its value and the allowed range.
    """
    eps, delta = check_epsilon("plan_dp_pasgd", eps, "eps"), check_delta("plan_dp_pasgd", delta)
    c1 = check_real("plan_dp_pasgd", "c1", c1, 0.0)
    c2 = check_real("plan_dp_pasgd", "c2", c2, 0.0, low_open=True)
    C_th = check_real("plan_dp_pasgd", "C_th", C_th, c1 + c2)
    if (C_th - c1) / c2 > MAX_PLANNED_STEPS:
        raise ValueError(f"C_th={C_th!r} allows up to {(C_th - c1) / c2:.3g} local steps; the "
                         f"exhaustive search takes C_th <= c1 + c2 * {MAX_PLANNED_STEPS}")
    G = check_real("plan_dp_pasgd", "G", G, 0.0, low_open=True)
    X = check_real("plan_dp_pasgd", "X", X, 0.0, low_open=True)
    constants = BoundConstants(d, num_devices, smoothness, strong_convexity, learning_rate,
                               grad_variance, initial_gap)
    tau_cap = max_period(learning_rate, smoothness)
    target = rho_star(eps, delta)
    sigma2_per_step = 2.0 * G * G / (X * X * target)  # sigma^2 = K * this

    best: tuple[float, int, int] | None = None
    for K, tau in _pairs(C_th, c1, c2, tau_cap):
        if K.size == 0:
            continue
        values = constants.bound(K.astype(np.float64), tau.astype(np.float64),
                                 sigma2_per_step * K)
        order = np.lexsort((tau, K, values))  # smallest bound, then K, then tau
        i = int(order[0])
        cand = (float(values[i]), int(K[i]), int(tau[i]))
        if best is None or (cand[0], cand[1], cand[2]) < best:
            best = cand
    assert best is not None  # K = tau = 1 is always feasible once C_th >= c1 + c2
    _, K_best, tau_best = best

    sigma = sigma_for(eps, delta, K_best, G, X)
    rho = rho_total(K_best, G, X, sigma)
    cost = resource_cost(K_best, tau_best, c1=c1, c2=c2)
    if cost > C_th or K_best % tau_best:  # the enumeration guarantees both
        raise AssertionError(f"plan K={K_best}, tau={tau_best} breaks the budget")
    sigma_printed = (G / X) * math.sqrt(2.0 * K_best / rho_star_printed(eps, delta))
    k_rel, tau_rel = _relaxed(C_th, c1, c2, tau_cap, sigma2_per_step, constants)
    k_round, tau_round = max(1, round(k_rel)), max(1, round(tau_rel))
    return DpPasgdPlan(
        eps_target=eps, delta=delta, C_th=C_th, c1=c1, c2=c2, G=G, X=X,
        d=constants.d, num_devices=constants.num_devices,
        smoothness=float(constants.smoothness),
        strong_convexity=float(constants.strong_convexity),
        learning_rate=float(constants.learning_rate),
        grad_variance=float(constants.grad_variance),
        initial_gap=float(constants.initial_gap),
        K=K_best, tau=tau_best, rounds=K_best // tau_best, sigma=sigma,
        noise_multiplier=paper_noise_multiplier(sigma, G, X), rho=rho, rho_star=target,
        eps_zcdp=zcdp_to_eps(rho, delta), sigma_printed_root=sigma_printed,
        eps_printed_root=paper_epsilon(K_best, G, X, sigma_printed, delta), cost=cost,
        objective=convergence_bound(K_best, tau_best, sigma, constants),
        floor=float(constants.floor(float(tau_best), sigma * sigma)),
        k_relaxed=k_rel, tau_relaxed=tau_rel,
        cost_paper_rounding=resource_cost(k_round, tau_round, c1=c1, c2=c2),
    )

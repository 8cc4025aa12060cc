"""Planner of peer scheme 002 (Hu, Guo, Gong, IEEE OJ-CS 2021): noise, rounds and devices.

:func:`plan_zcdp_secagg` chooses the per-step noise ``sigma`` (and, when left open, the rounds
``T`` and the devices per round ``r``) so that 002's zCDP guarantee with the ``1/r``
secure-aggregation credit meets an ``(epsilon, delta)`` target, and reports the testbed's
dp-accounting figures beside it (:class:`SecaggPlan`). ``T`` and ``r`` are chosen by 002's
convergence bound, eq. (18) (:class:`ConvergenceConstants`, :func:`convergence_bound`).

Symbols and units as in :mod:`aggregator.peers.zcdp_secagg_accounting`, which holds the
accounting formulas this planner uses. The derivation and its trust assumption are in
``docs/peers/zcdp-secagg.md``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from aggregator.peers.checks import check_delta, check_int, check_real
from aggregator.peers.zcdp_secagg_accounting import (
    ACCOUNTANTS,
    TRUST_ASSUMPTION,
    epsilon_to_zcdp,
    paper_round_rho,
    participation_bound,
    secagg_sum_epsilon,
    testbed_epsilon,
    zcdp_to_epsilon,
)

_MAX_GRID = 10_000_000


# ------------------------------------------------------------------------- planner


@dataclass(frozen=True)
class ConvergenceConstants:
    """Constants of 002 Theorem 2 (eq. 18), used to choose ``T`` and ``r``.

    Attributes
    ----------
    smoothness
        ``L`` (1 / parameter units squared, loss units).
    grad_variance
        ``beta^2``: bound on a per-record stochastic gradient's variance (Assumption 3).
    learning_rate
        ``eta``; Theorem 2 needs ``5 eta L + 3 tau^2 eta^2 L^2 <= 1``.
    dimension
        ``d`` model parameters.
    initial_gap
        ``f(theta_0) - f*`` (loss units).
    """

    smoothness: float
    grad_variance: float
    learning_rate: float
    dimension: int
    initial_gap: float

    def __post_init__(self) -> None:
        where = "ConvergenceConstants"
        check_real(where, "smoothness", self.smoothness, 0.0, low_open=True)
        check_real(where, "grad_variance", self.grad_variance, 0.0)
        check_real(where, "learning_rate", self.learning_rate, 0.0, low_open=True)
        check_int(where, "dimension", self.dimension, 1)
        check_real(where, "initial_gap", self.initial_gap, 0.0)


def convergence_bound(*, T: Any, tau: int, r: Any, sigma: Any, gamma: int,
                      constants: ConvergenceConstants) -> Any:
    """002 eq. (18): bound on the average squared gradient norm after ``K = T tau`` steps.

    ``T``, ``r`` and ``sigma`` may be numpy arrays (broadcast). Raises ``ValueError`` when the
    learning rate breaks Theorem 2's condition ``5 eta L + 3 tau^2 eta^2 L^2 <= 1``.
    """
    c = constants
    eta, lip, var, d = c.learning_rate, c.smoothness, c.grad_variance, c.dimension
    if 5 * eta * lip + 3 * tau**2 * eta**2 * lip**2 > 1:
        raise ValueError(f"convergence_bound: learning_rate={eta!r} breaks 5 eta L + "
                         f"3 tau^2 eta^2 L^2 <= 1 (L={lip}, tau={tau})")
    T = np.asarray(T, dtype=float)
    r = np.asarray(r, dtype=float)
    s2 = np.asarray(sigma, dtype=float) ** 2
    k = T * tau
    local = (tau - 1) * (2 * tau - 1) * (2 * eta**2 * lip**2 * var / (3 * gamma)
                                         + eta**2 * lip**2 * d * s2 * (r + 1) / (3 * r))
    out = (2 * c.initial_gap / (eta * k) + eta * lip * var / (2 * gamma)
           + eta * lip * d * s2 / (2 * r) + local)
    return out if out.ndim else float(out)


@dataclass(frozen=True)
class SecaggPlan:
    """A noise level (and ``T``, ``r``) meeting ``(epsilon, delta)`` under 002's accounting.

    Attributes
    ----------
    epsilon, delta
        The target; ``delta_total`` adds the participation-bound failure probability.
    n, r, T, tau, G, m, gamma
        As in the module docstring (``T``, ``r`` chosen when the caller left them open).
    participations, participation_mode
        ``C`` used in the composition and where it came from: ``"expected"`` (``T r / n``,
        as printed), ``"given"``, or ``"bound"`` (:func:`participation_bound`).
    honest_summands
        Updates whose noise is credited: ``(min_aggregated or r) - colluding``.
    rho_target, rho_round, rho_total
        ``rho*`` of the target, per round and composed (``rho_total <= rho_target``).
    sigma
        Per-coordinate noise std added to the batch-average gradient (gradient units).
    epsilon_zcdp
        ``rho_total`` converted by Lemma 4 (``<= epsilon``).
    epsilon_no_credit_zcdp
        Same noise, no secure-aggregation credit (``h = 1``), by Lemma 4.
    epsilon_no_credit, epsilon_credit
        The testbed's dp-accounting figures (:func:`testbed_epsilon`,
        :func:`secagg_sum_epsilon`) at ``ceil(participations)``; ``None`` when ``gamma``
        does not divide ``m``.
    epoch_aligned
        ``tau gamma / m`` is an integer (Theorem 1's assumption).
    credit_is_theorem
        ``tau == 1``: the aggregate is a Gaussian mechanism and the credit is rigorous.
    convergence_bound
        eq. (18) at the plan, or ``None`` without convergence constants.
    trust_assumption
        :data:`TRUST_ASSUMPTION`.
    """

    epsilon: float
    delta: float
    delta_total: float
    n: int
    r: int
    T: int
    tau: int
    G: float
    m: int
    gamma: int
    participations: float
    participation_mode: str
    honest_summands: int
    colluding: int
    rho_target: float
    rho_round: float
    rho_total: float
    sigma: float
    epsilon_zcdp: float
    epsilon_no_credit_zcdp: float
    epsilon_no_credit: float | None
    epsilon_credit: float | None
    epoch_aligned: bool
    credit_is_theorem: bool
    convergence_bound: float | None
    trust_assumption: str = TRUST_ASSUMPTION

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict of every field."""
        return asdict(self)


def _sigma_for(rho_target: float, *, participations: Any, tau: int, G: float, m: int,
               gamma: int, honest: Any) -> Any:
    # rho_total = C * tau * gamma / m * 2 G^2 / (h gamma^2 sigma^2) = rho_target
    return np.sqrt(2.0 * np.asarray(participations) * tau * G**2
                   / (np.asarray(honest) * m * gamma * rho_target))


def plan_zcdp_secagg(epsilon: float, delta: float, n: int, r: int | None, tau: int,
                     T: int | None, G: float, m: int, gamma: int, *,
                     participations: float | None = None,
                     participation_failure_prob: float | None = None,
                     colluding: int = 0, min_aggregated: int | None = None,
                     convergence: ConvergenceConstants | None = None,
                     round_budget: int | None = None, upload_budget: int | None = None,
                     accountant: str = "rdp") -> SecaggPlan:
    """Choose ``sigma`` (and ``T``, ``r`` when ``None``) so that 002's guarantee meets the target.

    Parameters
    ----------
    epsilon, delta
        Target per device, ``epsilon > 0``, ``0 < delta < 1``.
    n
        Devices.
    r
        Devices selected per round, ``1 <= r <= n``; ``None``: chosen in ``[3, n]`` (secure
        aggregation needs at least 3) to minimise eq. (18) (needs ``convergence``).
    tau
        Local steps per round.
    T
        Rounds; ``None``: chosen in ``[1, round_budget]`` to minimise eq. (18) (needs
        ``convergence`` and ``round_budget``).
    G, m, gamma
        Gradient bound, records per device, mini-batch size (records).
    participations
        ``C`` per device; default ``T r / n`` as printed (an expectation).
    participation_failure_prob
        Instead of the expectation use :func:`participation_bound` at this probability,
        added to ``delta_total``. Exclusive with ``participations``.
    colluding
        Participants whose noise the adversary knows (a curious peer: 1).
    min_aggregated
        Fewest updates the server accepts in a sum (the secure-aggregation threshold ``t``);
        default ``r`` (no dropouts).
    convergence
        Theorem 2 constants; needed to choose ``T`` or ``r`` and to report the bound.
    round_budget, upload_budget
        Most rounds ``T``, most uploads ``T r`` (communication budget) when choosing.
    accountant
        dp-accounting accountant of the testbed figures.

    Raises
    ------
    ValueError
        Naming the argument, its value and its allowed range.
    """
    where = "plan_zcdp_secagg"
    epsilon = check_real(where, "epsilon", epsilon, 0.0, low_open=True)
    delta = check_delta(where, delta)
    n = check_int(where, "n", n, 1)
    tau = check_int(where, "tau", tau, 1)
    G = check_real(where, "G", G, 0.0, low_open=True)
    m = check_int(where, "m", m, 1)
    gamma = check_int(where, "gamma", gamma, 1, m)
    colluding = check_int(where, "colluding", colluding, 0, max(n - 1, 0))
    if accountant not in ACCOUNTANTS:
        raise ValueError(f"{where}: accountant={accountant!r} must be one of {ACCOUNTANTS}")
    if participations is not None and participation_failure_prob is not None:
        raise ValueError(f"{where}: give participations={participations!r} or "
                         f"participation_failure_prob={participation_failure_prob!r}, not both")
    choose = T is None or r is None
    if choose and convergence is None:
        raise ValueError(f"{where}: convergence=None, but choosing T={T!r} / r={r!r} needs "
                         "ConvergenceConstants")
    if T is None:
        if round_budget is None:
            raise ValueError(f"{where}: T=None needs round_budget (an integer >= 1)")
        t_grid = np.arange(1, check_int(where, "round_budget", round_budget, 1) + 1)
    else:
        t_grid = np.array([check_int(where, "T", T, 1)])
    if r is None:
        if n < 3:
            raise ValueError(f"{where}: r=None chooses r in [3, n], but n={n} < 3")
        r_grid = np.arange(max(3, colluding + 1), n + 1)
    else:
        r_grid = np.array([check_int(where, "r", r, 1, n)])
    if upload_budget is not None:
        check_int(where, "upload_budget", upload_budget, 1)
    if t_grid.size * r_grid.size > _MAX_GRID:
        raise ValueError(f"{where}: round_budget={round_budget!r} times {r_grid.size} values "
                         f"of r exceeds {_MAX_GRID} candidates")
    if min_aggregated is not None:
        check_int(where, "min_aggregated", min_aggregated, colluding + 1, int(r_grid.max()))
    t_mesh, r_mesh = np.meshgrid(t_grid, r_grid, indexing="ij")
    tt, rr = t_mesh.ravel(), r_mesh.ravel()
    keep = np.ones(tt.shape, dtype=bool)
    if upload_budget is not None:
        keep &= tt * rr <= upload_budget
    summands = np.full(rr.shape, min_aggregated) if min_aggregated is not None else rr
    honest = summands - colluding
    keep &= honest >= 1
    if not keep.any():
        if upload_budget is None or not (honest >= 1).any():
            raise ValueError(f"{where}: colluding={colluding} must be below the summands "
                             f"(r={r!r}, min_aggregated={min_aggregated!r})")
        raise ValueError(f"{where}: upload_budget={upload_budget!r} admits no T * r with "
                         f"T >= 1 and r in [{int(r_grid.min())}, {n}]")
    tt, rr, honest = tt[keep], rr[keep], honest[keep]

    delta_total = delta
    if participations is not None:
        if choose:
            raise ValueError(f"{where}: participations={participations!r} cannot be fixed "
                             "while T or r is being chosen")
        mode = "given"
        counts = np.array([check_real(where, "participations", participations, 0.0,
                                      float(tt[0]), low_open=True)])
    elif participation_failure_prob is not None:
        mode = "bound"
        beta = check_real(where, "participation_failure_prob", participation_failure_prob, 0.0,
                          1.0 - delta, low_open=True, high_open=True)
        delta_total = delta + beta
        counts = np.array([participation_bound(T=int(a), r=int(b), n=n, failure_prob=beta)
                           for a, b in zip(tt, rr, strict=True)], dtype=float)
    else:
        mode = "expected"
        counts = tt * rr / n
    rho_target = epsilon_to_zcdp(epsilon=epsilon, delta=delta)
    sigmas = _sigma_for(rho_target, participations=np.maximum(counts, 1e-300), tau=tau, G=G,
                        m=m, gamma=gamma, honest=honest)
    if convergence is not None:
        bounds = np.asarray(convergence_bound(T=tt, tau=tau, r=rr, sigma=sigmas, gamma=gamma,
                                              constants=convergence))
        best = int(np.argmin(bounds)) if choose else 0
        bound: float | None = float(bounds[best])
    else:
        best, bound = 0, None
    t_best, r_best, h_best = int(tt[best]), int(rr[best]), int(honest[best])
    count, sigma = float(counts[best]), float(sigmas[best])
    rho_round = paper_round_rho(tau=tau, G=G, m=m, gamma=gamma, sigma=sigma, r=h_best)
    rho_total = count * rho_round
    eps_credit: float | None = None
    eps_plain: float | None = None
    if m % gamma == 0:
        c_int = math.ceil(count - 1e-9)
        eps_plain = testbed_epsilon(participations=c_int, tau=tau, G=G, m=m, gamma=gamma,
                                    sigma=sigma, delta=delta, accountant=accountant)
        eps_credit = secagg_sum_epsilon(participations=c_int, tau=tau, G=G, m=m, gamma=gamma,
                                        sigma=sigma, delta=delta, honest_summands=h_best,
                                        accountant=accountant)
    return SecaggPlan(
        epsilon=epsilon, delta=delta, delta_total=delta_total, n=n, r=r_best, T=t_best,
        tau=tau, G=G, m=m, gamma=gamma, participations=count, participation_mode=mode,
        honest_summands=h_best, colluding=colluding, rho_target=rho_target,
        rho_round=rho_round, rho_total=rho_total, sigma=sigma,
        epsilon_zcdp=zcdp_to_epsilon(rho=rho_total, delta=delta),
        epsilon_no_credit_zcdp=zcdp_to_epsilon(rho=rho_total * h_best, delta=delta),
        epsilon_no_credit=eps_plain, epsilon_credit=eps_credit,
        epoch_aligned=(tau * gamma) % m == 0, credit_is_theorem=tau == 1,
        convergence_bound=bound,
    )

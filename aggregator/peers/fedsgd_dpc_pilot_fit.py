"""FedSGD-DPC (paper 004): the convergence constants fitted to pilot ``(round, loss)`` curves.

:func:`fit_pilot_curves` / :func:`estimate_constants`: least squares on the form of the bound
of Theorems 3/4 (:mod:`aggregator.peers.fedsgd_dpc_bound`), giving the
:class:`~aggregator.peers.fedsgd_dpc_bound.ConvergenceConstants` the planner
(:mod:`aggregator.peers.fedsgd_dpc`) needs. Pure functions, no randomness.

Units: losses in loss units; ``Y0`` a squared parameter distance; epsilons in nats.
Derivations: ``docs/peers/fedsgd-dpc.md``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from scipy.optimize import minimize_scalar

from aggregator.peers.checks import check_choice, check_int, check_real
from aggregator.peers.fedsgd_dpc_accounting import (
    DEFAULT_C2,
    Mechanism,
)
from aggregator.peers.fedsgd_dpc_bound import (
    ConvergenceConstants,
    PlanningProblem,
    noise_kappa,
    planning_problem,
    sampling_term,
)

# ------------------------------------------------------------------ constants from pilots


@dataclass(frozen=True)
class PilotCurve:
    """One pilot run: the planned ``T`` and ``b``, the budget, and the observed curve.

    Attributes
    ----------
    rounds
        Rounds ``t`` observed, integers in ``[0, T]``.
    values
        The observable at those rounds (loss, or ``||theta_t - theta*||^2``), finite.
    b, T
        Clients per round and *planned* total rounds (the noise was calibrated for ``T``).
    epsilon
        The run's per-client budget (nats).
    """

    rounds: tuple[int, ...]
    values: tuple[float, ...]
    b: int
    T: int
    epsilon: float

    def __post_init__(self) -> None:
        where = "PilotCurve"
        T = check_int(where, "T", self.T, 1)
        check_int(where, "b", self.b, 1)
        check_real(where, "epsilon", self.epsilon, 0.0, low_open=True)
        rounds = tuple(check_int(where, "rounds[]", t, 0, T) for t in self.rounds)
        values = tuple(check_real(where, "values[]", v) for v in self.values)
        if len(rounds) != len(values) or not rounds:
            raise ValueError(f"{where}: rounds and values must be non-empty and of equal "
                             f"length (got {len(rounds)} and {len(values)})")
        object.__setattr__(self, "rounds", rounds)
        object.__setattr__(self, "values", values)


@dataclass(frozen=True)
class PilotFit:
    """Result of :func:`fit_pilot_curves`.

    Attributes
    ----------
    constants
        The fitted :class:`ConvergenceConstants` (effective: the bound treated as equality).
    optimum_loss
        ``F*`` (fitted, or as given; ``0`` for the distance observable).
    rms_residual
        Root-mean-square residual of the fit, in the observable's units.
    coefficients
        ``(alpha, beta, c)``: the fitted lumped coefficients of ``r_b``, ``1`` and ``x``.
    """

    constants: ConvergenceConstants
    optimum_loss: float
    rms_residual: float
    coefficients: tuple[float, float, float]


def _design(pb: PlanningProblem, curves: Sequence[PilotCurve], gamma: float,
            fit_offset: bool) -> tuple[np.ndarray, np.ndarray]:
    rows, ys = [], []
    for cv in curves:
        r_b = sampling_term(cv.b, pb.N)
        if pb.mechanism == "laplace":
            x = cv.b * cv.T**2 / cv.epsilon**2
        else:
            x = cv.T * math.log(1.0 / pb.delta) / cv.epsilon**2
        for t, v in zip(cv.rounds, cv.values, strict=True):
            w = 1.0 / (t + gamma)
            rows.append(([1.0] if fit_offset else []) + [r_b * w, w, x * w])
            ys.append(v)
    return np.asarray(rows, dtype=np.float64), np.asarray(ys, dtype=np.float64)


def _solve(a: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, float]:
    scale = np.linalg.norm(a, axis=0)
    scale[scale == 0] = 1.0
    coef, *_ = np.linalg.lstsq(a / scale, y, rcond=None)
    coef = coef / scale
    resid = y - a @ coef
    return coef, float(np.dot(resid, resid))


def fit_pilot_curves(curves: Sequence[PilotCurve], *, N: int, dim: int, n_samples: float,
                     clip: float, mechanism: Mechanism = "laplace", delta: float = 0.0,
                     q: float | None = None, c2: float = DEFAULT_C2,
                     initial_gap: float | None = None, non_iid: float | None = None,
                     local_variance: float = 0.0,
                     observable: Literal["loss", "distance"] = "loss",
                     optimum_loss: float | None = None,
                     gamma_range: tuple[float, float] = (2.0, 1e4)) -> PilotFit:
    """Fit the convergence constants to pilot curves by least squares on the bound's form.

    Model (Theorems 3/4 with ``<=`` read as ``=``), for a pilot with ``(b, T, eps)``::

        Y_t = [ u r_b + v + (kappa / mu^2) x ] / (t + gamma)
        r_b = (N - b)/((N - 1) b),  u = 8 G^2 / mu^2,
        v = 8 lambda Gamma / mu^2 + 4 Lambda^2 / (mu^2 q d) [Gaussian] + gamma Y0,
        x = b T^2 / eps^2, kappa = 32 p xi_1^2 / d^2          (Laplace)
        x = T log(1/delta) / eps^2, kappa = 4 c2^2 p xi_2^2 N / d^2   (Gaussian)

    ``observable="distance"``: ``values`` are ``Y_t``. ``"loss"``: ``values`` are losses,
    modelled as ``F* + (lambda/2) Y_t`` (smoothness at the optimum), ``lambda/2 = gamma mu/4``.
    For each ``gamma`` the coefficients (and ``F*``) are linear least squares; ``gamma`` is
    found by a log-grid search refined with a bounded scalar minimiser. Then ``mu`` follows
    from the noise coefficient (``kappa`` is known), ``lambda = gamma mu / 2``, ``G`` from
    ``u``, and ``v`` gives whichever of ``Y0`` and ``Gamma`` is not given (the paper
    estimates both from clients' local optima; the curves only see their combination).

    Parameters
    ----------
    curves
        At least three pilots whose ``(r_b, x)`` are not collinear (e.g. two values of ``b``
        and two budgets), each with at least two rounds.
    N, dim, n_samples, clip, mechanism, delta, q, c2
        As :func:`plan_fedsgd_dpc` (``delta`` and ``q`` needed for the Gaussian).
    initial_gap, non_iid
        Exactly one of the two must be given (``>= 0``); the other is solved for.
    local_variance
        ``Lambda^2`` (Gaussian), taken as known.
    observable
        ``"loss"`` or ``"distance"``.
    optimum_loss
        ``F*`` if known (``"loss"`` only); ``None`` fits it.
    gamma_range
        Search interval for ``gamma`` (``2 <= low < high``; ``gamma >= 2`` iff ``mu <= lambda``).

    Returns
    -------
    PilotFit
    """
    where = "fit_pilot_curves"
    pb = planning_problem(where, 1.0, delta, N, mechanism,
                          ConvergenceConstants(1.0, 1.0, 0.0, 0.0, 0.0), dim, n_samples, clip,
                          q, c2)
    obs = check_choice(where, "observable", observable, ("loss", "distance"))
    if (initial_gap is None) == (non_iid is None):
        raise ValueError(f"{where}: give exactly one of initial_gap={initial_gap!r} and "
                         f"non_iid={non_iid!r}; the curves identify only their combination")
    y0_known = None if initial_gap is None else check_real(where, "initial_gap", initial_gap, 0.0)
    gm_known = None if non_iid is None else check_real(where, "non_iid", non_iid, 0.0)
    lam2 = check_real(where, "local_variance", local_variance, 0.0)
    if len(gamma_range) != 2:
        raise ValueError(f"{where}: gamma_range={gamma_range!r} must be (low, high)")
    g_lo = check_real(where, "gamma_range[0]", gamma_range[0], 2.0)
    g_hi = check_real(where, "gamma_range[1]", gamma_range[1], g_lo, low_open=True)
    curves = list(curves)
    for cv in curves:
        if not isinstance(cv, PilotCurve):
            raise ValueError(f"{where}: curves contains {cv!r}, not a PilotCurve")
        check_int(where, "curve.b", cv.b, 1, pb.N)
    fit_offset = obs == "loss" and optimum_loss is None
    f_star = 0.0 if obs == "distance" or optimum_loss is None else check_real(
        where, "optimum_loss", optimum_loss)
    if obs == "distance" and optimum_loss is not None:
        raise ValueError(f"{where}: optimum_loss={optimum_loss!r} applies only to "
                         "observable='loss'")
    shifted = [PilotCurve(cv.rounds, tuple(v - f_star for v in cv.values), cv.b, cv.T,
                          cv.epsilon) for cv in curves]
    a_probe, _ = _design(pb, shifted, g_lo, fit_offset)
    if len(curves) < 3 or np.linalg.matrix_rank(a_probe) < a_probe.shape[1]:
        raise ValueError(
            f"{where}: {len(curves)} curve(s) do not identify the model: need >= 3 pilots "
            "whose (b, noise level) are not collinear (two values of b and two budgets), "
            "each with >= 2 rounds")

    def rss(log_g: float) -> float:
        return _solve(*_design(pb, shifted, math.exp(log_g), fit_offset))[1]

    grid = np.linspace(math.log(g_lo), math.log(g_hi), 121)
    vals = [rss(float(g)) for g in grid]
    k = int(np.argmin(vals))
    lo, hi = grid[max(k - 1, 0)], grid[min(k + 1, len(grid) - 1)]
    res = minimize_scalar(rss, bounds=(float(lo), float(hi)), method="bounded",
                          options={"xatol": 1e-10})
    log_g = float(res.x) if res.fun <= vals[k] else float(grid[k])
    gamma = math.exp(log_g)
    a, y = _design(pb, shifted, gamma, fit_offset)
    coef, ss = _solve(a, y)
    if fit_offset:
        f_star, coef = float(coef[0]), coef[1:]
    alpha, beta, c = (float(v) for v in coef)
    kappa = noise_kappa(pb)
    if c <= 0:
        raise ValueError(f"{where}: fitted noise coefficient c={c:g} <= 0: the pilots show no "
                         "privacy-noise effect, so mu is not identified (vary b T^2/eps^2)")
    # c = s kappa / mu^2 with the observable's scale s: 1 (distance) or lambda/2 = gamma mu/4
    mu = gamma * kappa / (4.0 * c) if obs == "loss" else math.sqrt(kappa / c)
    s = gamma * mu / 4.0 if obs == "loss" else 1.0
    lam = gamma * mu / 2.0
    u, v = alpha / s, beta / s
    if u < 0:
        raise ValueError(f"{where}: fitted sampling coefficient u={u:g} < 0 (G^2 < 0): the "
                         "curves do not follow the bound's b-dependence")
    v -= 4.0 * lam2 / (mu**2 * pb.q * pb.n_samples) if pb.mechanism == "gaussian" else 0.0
    if y0_known is not None:
        y0, gm = y0_known, (v - gamma * y0_known) * mu**2 / (8.0 * lam)
        solved, value = "non_iid", gm
    else:
        gm = float(gm_known)  # type: ignore[arg-type]
        y0 = (v - 8.0 * lam * gm / mu**2) / gamma
        solved, value = "initial_gap", y0
    if value < 0:
        raise ValueError(f"{where}: solved {solved}={value:g} < 0: the given "
                         f"{'initial_gap' if solved == 'non_iid' else 'non_iid'} is larger "
                         "than the curves allow")
    const = ConvergenceConstants(smoothness=lam, strong_convexity=mu,
                                 grad_bound=math.sqrt(u * mu**2 / 8.0), non_iid=gm,
                                 initial_gap=y0, local_variance=lam2)
    return PilotFit(constants=const, optimum_loss=f_star,
                    rms_residual=math.sqrt(ss / len(y)), coefficients=(alpha, beta, c))


def estimate_constants(curves: Sequence[PilotCurve], **kwargs: Any) -> ConvergenceConstants:
    """:func:`fit_pilot_curves` (same keyword arguments), returning only the constants."""
    return fit_pilot_curves(curves, **kwargs).constants

"""Sub-problem (29): uploads K and compression (theta_q, theta_s) for fixed (alpha, sigma).

A geometric program solved by cvxpy's disciplined geometric programming
(``prob.solve(gp=True)``), which performs the log change of variables of 003 (30) itself.
In the solver's units (see :mod:`aggregator.solver.energy`)::

    min   K (theta_qs P + E)                                    energy (24a)
    s.t.  beta1 theta_qs / K
          + beta2 d kr (theta_qs s + m) / K <= 1                convergence (25), kappa kept
          2 theta_qs u / (theta_s d) <= 1                       power of the worst device
          2 K kr Z^2 / (B_max w) <= 1                           privacy (K uploads, item 2)
          1 / d <= l_min / d <= theta_s <= 1,  sqrt(d)/Q_max <= theta_q <= sqrt(d)/Q_min

with ``kr = kappa / d`` and ``theta_qs`` of the family (:mod:`compression_terms`),
``P = tx_ref t_cm sum_i (Z^2 b_i + d a_i)``, ``E = sum_i E_comp_i``,
``s = mean_i sigma_i^2``, ``m = mean_i n_i / b_i``, ``u = max_i (Z^2 b_i + d a_i) / P_max_i``
(symbol-power units) and ``w = min_i (sigma_i^2 + t n_i / b_i)``. Only the worst device's
power and privacy constraints can bind, so the program has 3 variables whatever N is.
Problems are built once per (family, structure) with cvxpy parameters and re-solved.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from functools import lru_cache

import cvxpy as cp


@dataclass(frozen=True)
class GPInputs:
    """Positive coefficients of one GP instance (see module docstring)."""

    p_comm: float  # P (J per unit theta_qs per upload)
    e_comp: float  # E (J per upload, all devices)
    beta1: float
    beta2_d: float  # beta2 * d
    sigma2_mean: float  # s
    chan_mean: float  # m
    power_ratio: float  # u
    privacy_coef: float  # 2 Z^2 / (B_max w)
    d: int
    theta_s_min: float
    theta_q_min: float
    theta_q_max: float
    k_min: float
    k_max: float


@dataclass(frozen=True)
class GPResult:
    """Optimal point of (29)."""

    k_uploads: float
    theta_q: float
    theta_s: float
    objective: float
    status: str


class GPError(RuntimeError):
    """The GP solver did not return an optimal point (the message says the status)."""


@lru_cache(maxsize=16)
def _build(family: str, with_sigma: bool, with_comp: bool) -> tuple[cp.Problem, dict]:
    k = cp.Variable(pos=True, name="K")
    ts = cp.Variable(pos=True, name="theta_s")
    tq = cp.Variable(pos=True, name="theta_q")
    names = (
        "p_comm", "e_comp", "beta1", "beta2_d", "sigma2_mean", "chan_mean", "power_ratio",
        "privacy_coef", "inv_sqrt_d", "theta_s_min", "theta_q_min", "theta_q_max_inv",
        "k_min", "k_max_inv",
    )
    par = {n: cp.Parameter(pos=True, name=n) for n in names}
    cons = []
    if family == "qs":
        theta_qs = ts**-1 + tq * ts**-0.5
        kr = tq**-2 + tq**-1 * ts**0.5
        cons += [par["theta_q_min"] / tq <= 1, tq * par["theta_q_max_inv"] <= 1]
    elif family == "s":
        theta_qs = ts**-1
        kr = ts
    elif family == "none":
        theta_qs = None
        kr = None
    else:
        raise ValueError(f"family: got {family!r}; allowed: 'qs', 's', 'none'")
    if theta_qs is None:
        energy = k * (par["p_comm"] + par["e_comp"]) if with_comp else k * par["p_comm"]
        noise = par["chan_mean"] + par["sigma2_mean"] if with_sigma else par["chan_mean"]
        conv = (par["beta1"] + par["beta2_d"] * noise) / k
        # The power constraint has no GP variable here; power_noise enforces it.
        cons += [conv <= 1, par["privacy_coef"] * k <= 1]
    else:
        energy = k * par["p_comm"] * theta_qs
        if with_comp:
            energy = energy + k * par["e_comp"]
        noise = (
            theta_qs * par["sigma2_mean"] + par["chan_mean"] if with_sigma else par["chan_mean"]
        )
        conv = par["beta1"] * theta_qs / k + par["beta2_d"] * kr * noise / k
        cons += [
            conv <= 1,
            2 * par["power_ratio"] * theta_qs * ts**-1 * par["inv_sqrt_d"] ** 2 <= 1,
            par["privacy_coef"] * k * kr <= 1,
            ts <= 1,
            par["theta_s_min"] / ts <= 1,
        ]
    cons += [par["k_min"] / k <= 1, k * par["k_max_inv"] <= 1]
    prob = cp.Problem(cp.Minimize(energy), cons)
    return prob, {"K": k, "theta_s": ts, "theta_q": tq, **par}


def solve_gp(family: str, inputs: GPInputs, *, solver: str | None = None) -> GPResult:
    """Solve (29) for one family; raises :class:`GPError` unless the status is optimal."""
    with_sigma = inputs.sigma2_mean > 0
    with_comp = inputs.e_comp > 0
    prob, v = _build(family, with_sigma, with_comp)
    values = {
        "p_comm": inputs.p_comm,
        "e_comp": inputs.e_comp if with_comp else 1.0,
        "beta1": max(inputs.beta1, 1e-300),
        "beta2_d": inputs.beta2_d,
        "sigma2_mean": inputs.sigma2_mean if with_sigma else 1.0,
        "chan_mean": inputs.chan_mean,
        "power_ratio": inputs.power_ratio,
        "privacy_coef": inputs.privacy_coef,
        "inv_sqrt_d": math.sqrt(1.0 / inputs.d),
        "theta_s_min": inputs.theta_s_min,
        "theta_q_min": inputs.theta_q_min,
        "theta_q_max_inv": 1.0 / inputs.theta_q_max,
        "k_min": inputs.k_min,
        "k_max_inv": 1.0 / inputs.k_max,
    }
    for name, val in values.items():
        if not (val > 0 and math.isfinite(val)):
            raise GPError(f"GP coefficient {name} = {val!r} must be finite and > 0")
        v[name].value = val
    try:
        with warnings.catch_warnings():
            # OPTIMAL_INACCURATE is accepted below and says so in GPResult.status; the
            # closed-form step re-checks feasibility exactly, so cvxpy's warning adds nothing.
            warnings.simplefilter("ignore", UserWarning)
            prob.solve(gp=True, solver=solver or cp.CLARABEL)
    except cp.error.SolverError as exc:
        raise GPError(f"GP solver failed: {exc}") from exc
    if prob.status not in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE):
        raise GPError(f"GP status {prob.status!r}")
    tq = float(v["theta_q"].value) if family == "qs" else 0.0
    ts = float(v["theta_s"].value) if family in ("qs", "s") else 1.0
    return GPResult(
        k_uploads=float(v["K"].value),
        theta_q=tq,
        theta_s=ts,
        objective=float(prob.value),
        status=str(prob.status),
    )

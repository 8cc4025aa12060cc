"""Solver parts: scenario validation, privacy constraint, energy model, GP, infeasibility."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import minimize, minimize_scalar

from aggregator.solver.algorithm import Problem
from aggregator.solver.compression_terms import kappa_ratio, theta_qs
from aggregator.solver.energy import comm_energy_per_upload, power_cap_c3, power_symbol
from aggregator.solver.gp import GPInputs, solve_gp
from aggregator.solver.infeasible import InfeasibleError
from aggregator.solver.planner import plan_scheme
from aggregator.solver.privacy_constraint import c4, epsilon_from_slope, rdp_budget
from aggregator.solver.scenario import Scenario, ScenarioError


def small(**kw: object) -> Scenario:
    base: dict = dict(h=(1.0, 0.7, 1.3), n0=0.005, p_max_w=0.1, e_comp_j=0.001, d=2000,
                      epsilon=5.0, beta1=10.0, beta2=1e-7)
    base.update(kw)
    return Scenario(**base)


# -- scenario -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kw", "word"),
    [
        ({"h": (1.0, 0.0, 1.0)}, r"h\[1\]"),
        ({"n0": (0.1, 0.1)}, "n0: expected 3"),
        ({"p_max_w": -1.0}, "p_max_w"),
        ({"e_comp_j": -0.5}, "e_comp_j"),
        ({"d": 0}, "d: got 0"),
        ({"epsilon": 0.0}, "epsilon"),
        ({"delta": 1.0}, "delta"),
        ({"beta2": 0.0}, "beta2"),
        ({"trusted": 1.5}, "trusted"),
        ({"q_max": 0}, "q_max"),
        ({"l_min": 5000}, "l_min"),
        ({"clip_bound": float("nan")}, "clip_bound"),
    ],
)
def test_scenario_refuses_bad_values_by_name(kw: dict, word: str) -> None:
    with pytest.raises(ScenarioError, match=word):
        small(**kw)


def test_scenario_broadcasts_scalars() -> None:
    s = small()
    assert s.n0 == (0.005,) * 3 and s.p_max_w == (0.1,) * 3 and s.n_devices == 3
    assert np.allclose(s.channel_noise_eff(), 0.005 / np.array([1.0, 0.7, 1.3]) ** 2)


# -- privacy constraint ---------------------------------------------------------------------
@pytest.mark.parametrize("eps", [0.1, 0.5, 1.0, 1.8, 5.0, 50.0])
@pytest.mark.parametrize("delta", [1e-3, 1e-5, 1e-9])
def test_rdp_budget_is_exactly_the_largest_feasible_slope(eps: float, delta: float) -> None:
    """B_max from SEED-NOTES item 3 equals a numeric search over orders and slopes."""
    b_max = rdp_budget(eps, delta)

    def eps_of(slope: float) -> float:
        res = minimize_scalar(lambda r: r * slope + math.log(1 / delta) / (r - 1),
                              bounds=(1 + 1e-12, 1e12), method="bounded",
                              options={"xatol": 1e-14})
        return float(res.fun)

    assert eps_of(b_max) == pytest.approx(eps, rel=1e-6)
    assert float(epsilon_from_slope(np.array(b_max), delta)) == pytest.approx(eps, rel=1e-12)
    assert eps_of(b_max * 1.001) > eps
    # The printed (27): for eps < 1 it admits slopes whose epsilon overshoots the target.
    printed = (eps - 1) ** 2 / (4 * math.log(1 / delta))
    if eps < 1:
        assert eps_of(printed) > eps


def test_c4_is_the_noise_that_meets_the_target_exactly() -> None:
    k, kr, z, b_max = 40.0, 0.02, 5.0, rdp_budget(1.8, 1e-5)
    var = c4(k, kr, z, b_max)
    slope = 2 * k * kr * z**2 / var
    assert float(epsilon_from_slope(np.array(slope), 1e-5)) == pytest.approx(1.8, rel=1e-12)


# -- compression and energy -----------------------------------------------------------------
def test_compression_terms_match_integer_definitions() -> None:
    d, l, q = 21840, 2184, 16
    tq, ts = math.sqrt(d) / q, l / d
    assert kappa_ratio("qs", tq, ts) * d == pytest.approx(q * (q + math.sqrt(l)), rel=1e-12)
    assert theta_qs("qs", tq, ts) == pytest.approx(d / l + math.sqrt(d) / (q * math.sqrt(ts)))
    assert kappa_ratio("s", 0.0, ts) == ts and theta_qs("s", 0.0, ts) == pytest.approx(1 / ts)
    assert kappa_ratio("none", 0, 1) == 1 and theta_qs("none", 0, 1) == 1


def test_energy_is_power_times_airtime() -> None:
    """E_comm = p_w * (l / 2 symbols) * t_cm, and c3 is the power limit in (a, b)."""
    d, l, tq_s, z = 2000, 500, 4.0, 5.0
    ts = l / d
    a, b = np.array([1e-6, 0.0]), np.array([1e-3, 2e-3])
    p_sym = power_symbol(a, b, theta_qs=tq_s, theta_s=ts, d=d, z=z)
    e = comm_energy_per_upload(a, b, theta_qs=tq_s, d=d, z=z, t_cm_s=5e-6, tx_power_ref_w=0.1)
    assert np.allclose(e, 0.1 * p_sym * (l / 2) * 5e-6, rtol=1e-12)
    c3 = power_cap_c3(np.array([2.0, 2.0]), theta_qs=tq_s, theta_s=ts, d=d)
    at_cap = power_symbol(np.zeros(2), c3 / z**2, theta_qs=tq_s, theta_s=ts, d=d, z=z)
    assert np.allclose(at_cap, 2.0, rtol=1e-12)


def test_power_agrees_with_the_runner_bound() -> None:
    """The runner's own expected power bound (ceil(l/2) symbols) never exceeds ours."""
    schemes = pytest.importorskip("testbed.core.schemes")
    d, l, q, z = 2000, 501, 8, 5.0
    alpha, sigma = 0.03, 0.02
    ts, tq = l / d, math.sqrt(d) / q
    ours = power_symbol(np.array([alpha**2 * sigma**2]), np.array([alpha**2]),
                        theta_qs=theta_qs("qs", tq, ts), theta_s=ts, d=d, z=z)[0]
    theirs = schemes.expected_power_bound(d=d, l=l, levels=q, alpha=alpha, clip=z,
                                          sigma=sigma, mechanism="before")
    assert theirs <= ours and theirs == pytest.approx(ours * (l / 2) / ((l + 1) // 2))


# -- GP -------------------------------------------------------------------------------------
def gp_inputs(**kw: float) -> GPInputs:
    base = dict(p_comm=1e-3, e_comp=1e-2, beta1=10.0, beta2_d=2e-4, sigma2_mean=0.3,
                chan_mean=2.0, power_ratio=1e-3, privacy_coef=1e-3, d=2000,
                theta_s_min=1 / 2000, theta_q_min=math.sqrt(2000) / 32,
                theta_q_max=math.sqrt(2000), k_min=1.0, k_max=1e7)
    base.update(kw)
    return GPInputs(**base)


def generic_gp(inp: GPInputs) -> float:
    """The same program in log variables, by SLSQP from several starts."""
    def parts(x: np.ndarray) -> tuple[float, float, float]:
        k, tq, ts = np.exp(x)
        tqs = 1 / ts + tq / math.sqrt(ts)
        kr = tq**-2 + math.sqrt(ts) / tq
        return k, tqs, kr

    def obj(x: np.ndarray) -> float:
        k, tqs, _ = parts(x)
        return math.log(k * (tqs * inp.p_comm + inp.e_comp))

    def cons(x: np.ndarray) -> np.ndarray:
        k, tqs, kr = parts(x)
        ts = math.exp(x[2])
        return -np.log([
            inp.beta1 * tqs / k + inp.beta2_d * kr * (tqs * inp.sigma2_mean + inp.chan_mean) / k,
            2 * inp.power_ratio * tqs / (ts * inp.d),
            inp.privacy_coef * k * kr,
        ])

    bounds = [(0.0, math.log(inp.k_max)), (math.log(inp.theta_q_min), math.log(inp.theta_q_max)),
              (math.log(inp.theta_s_min), 0.0)]
    rng = np.random.default_rng(0)
    best = math.inf
    for _ in range(12):
        x0 = np.array([rng.uniform(*b) for b in bounds])
        res = minimize(obj, x0, method="SLSQP", bounds=bounds,
                       constraints=[{"type": "ineq", "fun": cons}],
                       options={"maxiter": 1000, "ftol": 1e-14})
        if res.success and np.all(cons(res.x) >= -1e-8):
            best = min(best, math.exp(res.fun))
    return best


@pytest.mark.parametrize(
    "kw",
    [{}, {"sigma2_mean": 0.0}, {"e_comp": 0.0}, {"privacy_coef": 1e-2, "beta2_d": 1e-3}],
)
def test_gp_matches_a_generic_solver(kw: dict) -> None:
    inp = gp_inputs(**kw)
    res = solve_gp("qs", inp)
    assert res.objective == pytest.approx(generic_gp(inp), rel=1e-5)
    # and its point satisfies the constraints
    tqs = 1 / res.theta_s + res.theta_q / math.sqrt(res.theta_s)
    kr = res.theta_q**-2 + math.sqrt(res.theta_s) / res.theta_q
    conv = (inp.beta1 * tqs + inp.beta2_d * kr * (tqs * inp.sigma2_mean + inp.chan_mean))
    assert conv / res.k_uploads <= 1 + 1e-6
    assert inp.privacy_coef * res.k_uploads * kr <= 1 + 1e-6


# -- infeasibility --------------------------------------------------------------------------
def test_infeasible_target_names_privacy_and_the_smallest_epsilon() -> None:
    scn = small(epsilon=0.05, beta2=3e-5, d=2000)
    with pytest.raises(InfeasibleError) as info:
        plan_scheme(scn, "ldp-fedavg", use_accountant=False)
    err = info.value
    assert "privacy" in err.binding and "epsilon" in err.nearest
    eps_min = err.nearest["epsilon"]
    assert eps_min > 0.05
    assert "epsilon" in str(err) and "ldp-fedavg" in str(err)
    # The nearest value really is feasible, and a clearly smaller one is not.
    plan = plan_scheme(scn.replace(epsilon=eps_min * 1.01), "ldp-fedavg", use_accountant=False)
    assert plan.K >= 1
    with pytest.raises(InfeasibleError):
        plan_scheme(scn.replace(epsilon=eps_min * 0.9), "ldp-fedavg", use_accountant=False)


def test_problem_evaluate_rejects_k_below_the_compression_floor() -> None:
    prob = Problem(small(), "qs", 1.0)
    tq, ts = math.sqrt(2000) / 8, 0.25
    assert prob.evaluate(prob.k_floor(tq, ts) * 0.99, tq, ts) is None

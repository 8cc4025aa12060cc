"""DP-PASGD (paper 000): zCDP accounting with the corrected root, testbed figure, planner."""

from __future__ import annotations

import json
import math
from typing import Any

import dp_accounting
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aggregator.peers.dp_pasgd import (
    BoundConstants,
    convergence_bound,
    max_period,
    plan_dp_pasgd,
    resource_cost,
    tau_star,
)
from aggregator.peers.dp_pasgd_accounting import (
    paper_epsilon,
    paper_noise_multiplier,
    rho_per_step,
    rho_star,
    rho_star_printed,
    rho_total,
    sigma_for,
    zcdp_to_eps,
)
from aggregator.peers.dp_pasgd_accounting import (
    testbed_epsilon as tb_epsilon,  # not "test*": pytest
)
from aggregator.peers.dp_pasgd_accounting import (
    testbed_epsilon_subsampled as tb_epsilon_subsampled,
)

DELTA = 1e-4  # the paper's default
LOG_INV = math.log(1.0 / DELTA)

CONSTANTS: dict[str, Any] = dict(
    G=1.0, X=64.0, d=100, num_devices=16, smoothness=1.0, strong_convexity=0.1,
    learning_rate=0.05, grad_variance=1.0, initial_gap=0.7,
)


def _plan(eps: float, c_th: float, **over: Any) -> Any:
    kwargs = {**CONSTANTS, **over}
    return plan_dp_pasgd(eps, DELTA, c_th, **kwargs)


def _bound_constants(**over: Any) -> BoundConstants:
    kw = {k: v for k, v in {**CONSTANTS, **over}.items() if k not in ("G", "X")}
    return BoundConstants(**kw)


# ------------------------------------------------------------------ paper accounting
@pytest.mark.parametrize(("eps", "printed", "tol"), [
    (1.0, 0.02576, 5e-6), (2.0, 0.09818, 5e-6), (4.0, 0.3597, 5e-5), (10.0, 1.8174, 5e-5),
])
def test_rho_star_matches_seed_notes_to_the_printed_digits(eps: float, printed: float,
                                                           tol: float) -> None:
    assert abs(rho_star(eps, DELTA) - printed) <= tol


@given(eps=st.floats(1e-4, 1e3), delta=st.floats(1e-12, 0.5))
@settings(max_examples=200, deadline=None)
def test_rho_star_inverts_the_conversion(eps: float, delta: float) -> None:
    rho = rho_star(eps, delta)
    assert zcdp_to_eps(rho, delta) == pytest.approx(eps, rel=1e-12)
    assert zcdp_to_eps(rho * (1 + 1e-6), delta) > eps  # the largest such rho


@pytest.mark.parametrize("eps", [1.0, 2.0, 4.0, 10.0])
def test_printed_root_is_not_an_inverse(eps: float) -> None:
    correct, printed = rho_star(eps, DELTA), rho_star_printed(eps, DELTA)
    # (25) as printed, and the square of the negative root of s^2 + 2 sqrt(L) s - eps = 0
    z = eps + 2 * LOG_INV + 2 * math.sqrt(LOG_INV**2 + eps * LOG_INV)
    assert printed == pytest.approx(z, rel=1e-14)
    assert printed == pytest.approx((math.sqrt(LOG_INV + eps) + math.sqrt(LOG_INV)) ** 2)
    assert printed * correct == pytest.approx(eps * eps, rel=1e-12)
    achieved = zcdp_to_eps(printed, DELTA)
    assert achieved == pytest.approx(eps + 4 * LOG_INV + 4 * math.sqrt(LOG_INV * (LOG_INV + eps)))
    assert achieved > eps + 4 * LOG_INV  # > 37 nats over the target at delta = 1e-4
    assert printed / correct > 30


def test_printed_root_at_eps_1_gives_eps_76() -> None:
    assert rho_star_printed(1.0, DELTA) == pytest.approx(38.8156, abs=1e-4)
    assert zcdp_to_eps(rho_star_printed(1.0, DELTA), DELTA) == pytest.approx(76.631, abs=1e-3)


def test_per_step_and_total_rho_are_the_gaussian_mechanism_composed() -> None:
    G, X, sigma, K = 1.5, 32.0, 0.2, 250
    delta_2 = 2 * G / X  # replace-one sensitivity of the mini-batch mean
    assert rho_per_step(G, X, sigma) == pytest.approx(delta_2**2 / (2 * sigma**2), rel=1e-14)
    assert rho_total(K, G, X, sigma) == pytest.approx(K * rho_per_step(G, X, sigma), rel=1e-14)
    # eq. (9) written out
    eq9 = 2 * K * G**2 / (X**2 * sigma**2) + 2 * G / (X * sigma) * math.sqrt(2 * K * LOG_INV)
    assert paper_epsilon(K, G, X, sigma, DELTA) == pytest.approx(eq9, rel=1e-13)
    assert rho_per_step(G, X, 0.0) == math.inf
    assert zcdp_to_eps(math.inf, DELTA) == math.inf


@given(eps=st.floats(0.01, 50), K=st.integers(1, 10**5), G=st.floats(0.01, 100),
       X=st.floats(1, 10**4))
@settings(max_examples=200, deadline=None)
def test_sigma_for_never_overshoots_and_is_tight(eps: float, K: int, G: float,
                                                 X: float) -> None:
    sigma = sigma_for(eps, DELTA, K, G, X)
    assert paper_epsilon(K, G, X, sigma, DELTA) <= eps
    assert paper_epsilon(K, G, X, sigma * (1 - 1e-6), DELTA) > eps


# ------------------------------------------------------------------ testbed figure
@pytest.mark.parametrize(("z", "K"), [(2.0, 10), (5.0, 100), (10.0, 1000), (20.0, 100),
                                      (3.0, 1)])
def test_zcdp_is_looser_than_dp_accounting_but_close(z: float, K: int) -> None:
    zcdp = zcdp_to_eps(K / (2 * z * z), DELTA)
    rdp = tb_epsilon(K, z, DELTA, "rdp")
    pld = tb_epsilon(K, z, DELTA, "pld")
    exact = dp_accounting.get_epsilon_gaussian(z / math.sqrt(K), DELTA)  # Balle & Wang 2018
    assert exact <= pld * (1 + 1e-9) and pld <= exact * 1.001  # PLD is exact here, pessimistic
    assert pld <= rdp <= zcdp
    assert zcdp <= 1.5 * pld  # measured 1.15-1.39 on these points


def test_paper_noise_multiplier_links_the_two_accountings() -> None:
    G, X, sigma, K = 1.0, 64.0, 0.1, 100
    z = paper_noise_multiplier(sigma, G, X)
    assert z == pytest.approx(3.2)
    assert rho_total(K, G, X, sigma) == pytest.approx(K / (2 * z * z), rel=1e-14)
    assert tb_epsilon(K, z, DELTA) < paper_epsilon(K, G, X, sigma, DELTA)


@pytest.mark.parametrize("accountant", ["rdp", "pld"])
def test_subsampled_at_q1_is_the_plain_composition(accountant: str) -> None:
    # independent code paths: the record accountant's engine vs dp_accounting's accountants
    a = tb_epsilon_subsampled(100, 1.0, 5.0, DELTA, accountant)
    b = tb_epsilon(100, 5.0, DELTA, accountant)
    assert a == pytest.approx(b, rel=1e-6)


def test_subsampling_amplifies_and_replace_one_costs_more() -> None:
    plain = tb_epsilon(1000, 1.0, 1e-5)
    add_remove = tb_epsilon_subsampled(1000, 0.01, 1.0, 1e-5, "rdp")
    replace = tb_epsilon_subsampled(1000, 0.01, 1.0, 1e-5, "rdp", relation="replace-one")
    assert add_remove == pytest.approx(2.1014, abs=1e-4)  # docs/privacy.md 10.6
    assert add_remove < replace < plain
    assert tb_epsilon_subsampled(1000, 0.01, 1.0, 1e-5, "pld") == pytest.approx(
        1.8289, abs=1e-3)


# ------------------------------------------------------------------ resource model, bound
def test_resource_cost_and_tau_star() -> None:
    assert resource_cost(100, 10) == pytest.approx(1100.0)
    assert resource_cost(90, 10, c1=100, c2=1) == pytest.approx(990.0)
    for K in (10, 90, 300, 899):
        t = tau_star(K, 1000.0)
        assert 100 * K / t + K == pytest.approx(1000.0)  # (22) makes (8) tight
        up = max(1, math.ceil(t))
        assert resource_cost(K, up) <= 1000.0
        assert up == 1 or resource_cost(K, up - 1) > 1000.0


def test_max_period_is_the_largest_tau_of_21e() -> None:
    for eta, lip in [(0.05, 1.0), (0.01, 2.0), (1.0, 1.0), (0.3, 0.5)]:
        tau = max_period(eta, lip)
        assert eta * lip + eta**2 * lip**2 * tau * (tau - 1) <= 1
        assert eta * lip + eta**2 * lip**2 * (tau + 1) * tau > 1


def test_convergence_bound_as_printed() -> None:
    c = _bound_constants()
    K, tau, sigma = 60, 3, 0.4
    eta, lip, lam, m, d = 0.05, 1.0, 0.1, 16, 100
    b = (eta * lip + eta**2 * lip**2 * (tau - 1) * m) / (2 * lam * m) * (1.0 + d * sigma**2)
    f = (1 - eta * lam) ** K * (0.7 - b) / K + b
    assert convergence_bound(K, tau, sigma, c) == pytest.approx(f, rel=1e-12)
    assert convergence_bound(K, 6, sigma, c) > convergence_bound(K, tau, sigma, c)
    assert convergence_bound(K, tau, 0.5, c) > convergence_bound(K, tau, sigma, c)
    with pytest.raises(ValueError, match="multiple"):
        convergence_bound(10, 3, sigma, c)


# ------------------------------------------------------------------ planner
def _brute_force(eps: float, c_th: float) -> tuple[float, int, int]:
    """Independent: every (K, tau) with tau | K, (8) and (21e), through the public functions."""
    c = _bound_constants()
    cap = max_period(c.learning_rate, c.smoothness)
    best = (math.inf, 0, 0)
    for K in range(1, int(c_th) + 1):
        sigma = sigma_for(eps, DELTA, K, CONSTANTS["G"], CONSTANTS["X"])
        for tau in range(1, min(K, cap) + 1):
            if K % tau == 0 and resource_cost(K, tau) <= c_th:
                best = min(best, (convergence_bound(K, tau, sigma, c), K, tau))
    return best


@pytest.mark.parametrize("c_th", [150.0, 200.0, 500.0, 1000.0])
@pytest.mark.parametrize("eps", [1.0, 4.0, 10.0])
def test_plan_respects_budgets_and_is_the_integer_optimum(eps: float, c_th: float) -> None:
    plan = _plan(eps, c_th)
    assert plan.K % plan.tau == 0 and plan.rounds * plan.tau == plan.K
    assert plan.cost == resource_cost(plan.K, plan.tau) <= c_th
    assert plan.tau <= max_period(CONSTANTS["learning_rate"], CONSTANTS["smoothness"])
    # tau is the smallest divisor of K at or above (22), i.e. the least communication-heavy
    t_min = max(1, math.ceil(tau_star(plan.K, c_th) - 1e-12))
    assert plan.tau == min(t for t in range(t_min, plan.K + 1) if plan.K % t == 0)
    assert plan.tau == 1 or resource_cost(plan.K, plan.tau - 1) > c_th or plan.K % (
        plan.tau - 1) != 0 or plan.tau - 1 < t_min
    # privacy: the corrected root, never above the target
    assert plan.sigma == sigma_for(eps, DELTA, plan.K, CONSTANTS["G"], CONSTANTS["X"])
    assert plan.eps_zcdp == paper_epsilon(plan.K, 1.0, 64.0, plan.sigma, DELTA) <= eps
    assert plan.rho <= plan.rho_star == rho_star(eps, DELTA)
    assert plan.eps_printed_root > eps + 4 * LOG_INV
    # optimality, against an independent exhaustive loop
    value, K, tau = _brute_force(eps, c_th)
    assert (plan.K, plan.tau) == (K, tau)
    assert plan.objective == pytest.approx(value, rel=1e-9)


def test_larger_budgets_never_worsen_the_objective() -> None:
    values = [_plan(4.0, c).objective for c in (110, 150, 200, 300, 500, 800, 1000, 3000)]
    assert all(b <= a for a, b in zip(values, values[1:], strict=False))
    by_eps = [_plan(e, 1000.0).objective for e in (0.5, 1, 2, 4, 10, 30)]
    assert all(b <= a for a, b in zip(by_eps, by_eps[1:], strict=False))
    assert by_eps[-1] < by_eps[0]


def test_paper_rounding_can_break_the_budget() -> None:
    plan = _plan(2.0, 200.0)
    assert round(plan.k_relaxed) == 5 and round(plan.tau_relaxed) == 2
    assert plan.cost_paper_rounding == pytest.approx(255.0)  # > C_th = 200
    assert plan.cost <= 200.0


def test_plan_to_dict_is_json_ready() -> None:
    plan = _plan(1.0, 1000.0)
    out = json.loads(json.dumps(plan.to_dict(), allow_nan=False))
    assert out["K"] == plan.K and out["tau"] == plan.tau and out["sigma"] == plan.sigma
    assert out["accounting"] == "zcdp-paper-corrected-root"
    with pytest.raises(AttributeError):
        plan.K = 3  # type: ignore[misc]


@pytest.mark.parametrize(("over", "name"), [
    ({"eps": 0.0}, "eps"), ({"eps": -1.0}, "eps"), ({"eps": math.nan}, "eps"),
    ({"eps": math.inf}, "eps"), ({"eps": True}, "eps"),
    ({"delta": 0.0}, "delta"), ({"delta": 1.0}, "delta"),
    ({"C_th": 100.0}, "C_th"), ({"C_th": 1e9}, "C_th"),
    ({"c1": -1.0}, "c1"), ({"c2": 0.0}, "c2"),
    ({"G": 0.0}, "G"), ({"X": -2.0}, "X"), ({"d": 0}, "d"), ({"d": 1.5}, "d"),
    ({"num_devices": 0}, "num_devices"), ({"smoothness": 0.0}, "smoothness"),
    ({"strong_convexity": 2.0}, "strong_convexity"), ({"learning_rate": 2.0}, "learning_rate"),
    ({"learning_rate": 0.0}, "learning_rate"), ({"grad_variance": -1.0}, "grad_variance"),
    ({"initial_gap": -0.1}, "initial_gap"),
])
def test_planner_rejects_bad_inputs_naming_them(over: dict[str, Any], name: str) -> None:
    args: dict[str, Any] = {"eps": 1.0, "delta": DELTA, "C_th": 1000.0, **CONSTANTS}
    args.update(over)
    with pytest.raises(ValueError, match=rf"\b{name}="):
        plan_dp_pasgd(**args)


@pytest.mark.parametrize(("call", "name"), [
    (lambda: rho_star(0.0, DELTA), "eps"),
    (lambda: rho_star(1.0, 2.0), "delta"),
    (lambda: zcdp_to_eps(-1.0, DELTA), "rho"),
    (lambda: rho_total(0, 1.0, 1.0, 1.0), "K"),
    (lambda: rho_per_step(1.0, 1.0, -1.0), "sigma"),
    (lambda: sigma_for(1.0, DELTA, 10, 1.0, 0.0), "X"),
    (lambda: tb_epsilon(0, 1.0, DELTA), "K"),
    (lambda: tb_epsilon(10, 0.0, DELTA), "noise_multiplier"),
    (lambda: tb_epsilon(10, 1.0, DELTA, "moments"), "accountant"),
    (lambda: tb_epsilon_subsampled(10, 0.0, 1.0, DELTA), "q"),
    (lambda: tb_epsilon_subsampled(10, 1.5, 1.0, DELTA), "q"),
    (lambda: resource_cost(10, 0), "tau"),
    (lambda: tau_star(2000.0, 1000.0), "K"),
])
def test_functions_reject_bad_inputs_naming_them(call: Any, name: str) -> None:
    with pytest.raises(ValueError, match=rf"\b{name}="):
        call()

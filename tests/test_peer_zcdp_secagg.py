"""002's zCDP accounting with device sampling and secure aggregation, and its planner."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest

from aggregator.peers.zcdp_secagg import (
    ConvergenceConstants,
    convergence_bound,
    plan_zcdp_secagg,
)
from aggregator.peers.zcdp_secagg_accounting import (
    TRUST_ASSUMPTION,
    device_dp_event,
    epsilon_to_zcdp,
    expected_participations,
    paper_epsilon,
    paper_round_rho,
    participation_bound,
    per_step_rho,
    record_uses,
    secagg_sum_epsilon,
    zcdp_to_epsilon,
)
from aggregator.peers.zcdp_secagg_accounting import testbed_epsilon as own_epsilon  # not a test

CASES = [  # tau, G, m, gamma, sigma, r
    (10, 1.0, 2440, 244, 0.005, 10),
    (1, 0.5, 100, 100, 0.02, 3),
    (4, 2.0, 600, 150, 0.1, 7),
    (6, 1.0, 300, 100, 0.03, 1),
]


@pytest.mark.parametrize(("tau", "G", "m", "gamma", "sigma", "r"), CASES)
def test_round_rho_matches_the_gaussian_of_the_sum(tau: int, G: float, m: int, gamma: int,
                                                   sigma: float, r: int) -> None:
    direct_step = (2 * G / gamma) ** 2 / (2 * (math.sqrt(r) * sigma) ** 2)  # Delta^2/(2 s^2)
    direct = tau * gamma / m * direct_step  # record uses per round under epoch shuffling
    assert paper_round_rho(tau=tau, G=G, m=m, gamma=gamma, sigma=sigma, r=r) == pytest.approx(
        direct, rel=1e-12)
    assert per_step_rho(G=G, gamma=gamma, sigma=sigma, honest_summands=r) == pytest.approx(
        direct_step, rel=1e-12)
    # 002's own route: Lemma 5 sensitivity 2 eta tau G / gamma, "equivalent" variance
    # r m tau eta^2 sigma^2 / gamma of the sum: same number, any eta
    eta = 0.37
    lemma5 = (2 * eta * tau * G / gamma) ** 2 / (2 * r * m * tau * eta**2 * sigma**2 / gamma)
    assert lemma5 == pytest.approx(direct, rel=1e-12)
    # and 1/r exactly: the credit divides the device's own figure by r
    own = paper_round_rho(tau=tau, G=G, m=m, gamma=gamma, sigma=sigma, r=1)
    assert own / r == pytest.approx(direct, rel=1e-12)


def test_composition_over_participations() -> None:
    assert expected_participations(T=20, r=10, n=16) == 12.5
    rho = paper_round_rho(tau=10, G=1.0, m=2440, gamma=244, sigma=0.005, r=10)
    for c in (1, 5, 12.5, 40):
        eps = paper_epsilon(participations=c, tau=10, G=1.0, m=2440, gamma=244, sigma=0.005,
                            r=10, delta=1e-4)
        l_inv = math.log(1e4)
        assert eps == pytest.approx(c * rho + 2 * math.sqrt(c * rho * l_inv), rel=1e-12)
    # a guarantee needs the realized count: the union-bound quantile exceeds the mean
    c = participation_bound(T=20, r=10, n=16, failure_prob=1e-3)
    assert 12.5 < c <= 20
    p = 10 / 16
    tail = sum(math.comb(20, k) * p**k * (1 - p) ** (20 - k) for k in range(c + 1, 21))
    assert 16 * tail <= 1e-3
    tail_below = sum(math.comb(20, k) * p**k * (1 - p) ** (20 - k) for k in range(c, 21))
    assert 16 * tail_below > 1e-3


def test_rho_star_round_trips_and_seed_notes_values() -> None:
    for rho in np.logspace(-6, 2, 40):
        eps = zcdp_to_epsilon(rho=float(rho), delta=1e-5)
        assert epsilon_to_zcdp(epsilon=eps, delta=1e-5) == pytest.approx(rho, rel=1e-10)
    for eps, rho in [(1, 0.02576), (2, 0.09818), (4, 0.3597), (10, 1.8174)]:  # delta = 1e-4
        assert epsilon_to_zcdp(epsilon=eps, delta=1e-4) == pytest.approx(rho, abs=5e-5)


def test_record_uses_counts_epochs() -> None:
    assert record_uses(participations=3, tau=10, m=2440, gamma=244) == 3  # one epoch a round
    assert record_uses(participations=3, tau=2, m=100, gamma=25) == 2  # 6 steps, 4 per epoch
    assert record_uses(participations=5, tau=1, m=100, gamma=100) == 5
    with pytest.raises(ValueError, match="gamma=30 must divide m=100"):
        record_uses(participations=1, tau=1, m=100, gamma=30)


@pytest.mark.parametrize(("tau", "G", "m", "gamma", "sigma", "r"), CASES)
def test_dp_accounting_figures_against_zcdp(tau: int, G: float, m: int, gamma: int,
                                            sigma: float, r: int) -> None:
    c, delta = 8, 1e-5
    uses = record_uses(participations=c, tau=tau, m=m, gamma=gamma)
    assert uses == c * tau * gamma / m  # the cases are epoch-aligned
    for h in sorted({1, r}):
        rho_total = c * paper_round_rho(tau=tau, G=G, m=m, gamma=gamma, sigma=sigma, r=h)
        zcdp = zcdp_to_epsilon(rho=rho_total, delta=delta)
        kwargs = dict(participations=c, tau=tau, G=G, m=m, gamma=gamma, sigma=sigma,
                      delta=delta)
        rdp = secagg_sum_epsilon(honest_summands=h, **kwargs)  # type: ignore[arg-type]
        pld = secagg_sum_epsilon(honest_summands=h, accountant="pld",
                                 **kwargs)  # type: ignore[arg-type]
        # composed Gaussians are one Gaussian with mu^2 = 2 rho: the exact (eps, delta) curve
        exact = dp_accounting.get_epsilon_gaussian(1 / math.sqrt(2 * rho_total), delta)
        assert pld == pytest.approx(exact, rel=2e-3, abs=1e-3)
        assert exact <= rdp * (1 + 1e-9) and rdp < zcdp  # zCDP's conversion is the loosest
        if h == 1:
            assert own_epsilon(**kwargs) == rdp  # type: ignore[arg-type]
    if r > 1:
        own = own_epsilon(participations=c, tau=tau, G=G, m=m, gamma=gamma, sigma=sigma,
                              delta=delta)
        summed = secagg_sum_epsilon(participations=c, tau=tau, G=G, m=m, gamma=gamma,
                                    sigma=sigma, delta=delta, honest_summands=r)
        assert summed < own


def test_poisson_sampling_event() -> None:
    ev = device_dp_event(participations=3, tau=5, G=2.0, m=1000, gamma=50, sigma=0.1,
                         sampling="poisson")
    assert isinstance(ev, dp_accounting.SelfComposedDpEvent) and ev.count == 15
    inner = ev.event
    assert isinstance(inner, dp_accounting.PoissonSampledDpEvent)
    assert inner.sampling_probability == pytest.approx(0.05)
    assert isinstance(inner.event, dp_accounting.GaussianDpEvent)
    assert inner.event.noise_multiplier == pytest.approx(0.1 * 50 / 2.0)  # add/remove: G/gamma
    kw = dict(participations=3, tau=5, G=2.0, m=1000, gamma=50, delta=1e-5, sampling="poisson")
    e_small = own_epsilon(sigma=0.1, **kw)  # type: ignore[arg-type]
    e_large = own_epsilon(sigma=0.2, **kw)  # type: ignore[arg-type]
    assert 0 < e_large < e_small
    full = own_epsilon(sigma=0.1, q=1.0, **kw)  # type: ignore[arg-type]
    plain = dp_accounting.get_epsilon_gaussian(2.5 / math.sqrt(15), 1e-5)
    assert e_small < full and plain <= full  # amplification helps; RDP >= exact
    with pytest.raises(ValueError, match="q=0.5 applies only"):
        device_dp_event(participations=1, tau=1, G=1.0, m=10, gamma=5, sigma=1.0, q=0.5)


def test_plan_meets_the_target() -> None:
    plan = plan_zcdp_secagg(10.0, 1e-4, 16, 10, 10, 20, 1.0, 2440, 244)
    assert plan.participations == 12.5 and plan.participation_mode == "expected"
    assert plan.rho_total == pytest.approx(epsilon_to_zcdp(epsilon=10.0, delta=1e-4), rel=1e-12)
    assert plan.epsilon_zcdp == pytest.approx(10.0, rel=1e-12)
    sigma = math.sqrt(2 * 12.5 * 10 * 1.0 / (10 * 2440 * 244 * plan.rho_target))
    assert plan.sigma == pytest.approx(sigma, rel=1e-12)
    assert plan.epsilon_credit is not None and plan.epsilon_credit < 10.5  # 13 rounds, RDP
    assert plan.epsilon_no_credit is not None and plan.epsilon_no_credit > 40  # colluding peers
    assert plan.epoch_aligned and not plan.credit_is_theorem
    d = plan.to_dict()
    assert d["trust_assumption"] == TRUST_ASSUMPTION and d["sigma"] == plan.sigma
    # a curious participant: credit 1/(r - 1); a threshold t: credit 1/t
    peer = plan_zcdp_secagg(10.0, 1e-4, 16, 10, 10, 20, 1.0, 2440, 244, colluding=1)
    assert peer.sigma == pytest.approx(plan.sigma * math.sqrt(10 / 9), rel=1e-12)
    thr = plan_zcdp_secagg(10.0, 1e-4, 16, 10, 10, 20, 1.0, 2440, 244, min_aggregated=6)
    assert thr.sigma == pytest.approx(plan.sigma * math.sqrt(10 / 6), rel=1e-12)
    bound = plan_zcdp_secagg(10.0, 1e-4, 16, 10, 10, 20, 1.0, 2440, 244,
                             participation_failure_prob=1e-6)
    assert bound.participations > 12.5 and bound.delta_total == pytest.approx(1e-4 + 1e-6)
    assert bound.sigma > plan.sigma


def test_plan_chooses_T_and_r() -> None:
    cst = ConvergenceConstants(smoothness=1.0, grad_variance=4.0, learning_rate=0.02,
                               dimension=100_000, initial_gap=5.0)
    args = (4.0, 1e-5, 20, None, 5, None, 10.0, 1000, 100)
    plan = plan_zcdp_secagg(*args, convergence=cst, round_budget=400)
    assert plan.r == 20  # sigma^2 = 2 T tau G^2/(n m gamma rho): no r; eq. (18) wants r = n
    assert 1 < plan.T < 400 and plan.convergence_bound is not None
    for t in (plan.T - 1, plan.T + 1):  # more rounds: more noise; fewer: less progress
        other = plan_zcdp_secagg(4.0, 1e-5, 20, 20, 5, t, 10.0, 1000, 100, convergence=cst)
        assert other.convergence_bound is not None
        assert other.convergence_bound > plan.convergence_bound
    budget = plan_zcdp_secagg(*args, convergence=cst, round_budget=400, upload_budget=120)
    assert budget.T * budget.r <= 120 and budget.r < 20
    assert budget.convergence_bound is not None
    assert budget.convergence_bound > plan.convergence_bound
    with pytest.raises(ValueError, match="learning_rate=0.3"):
        convergence_bound(T=10, tau=5, r=5, sigma=0.1, gamma=10,
                          constants=ConvergenceConstants(1.0, 1.0, 0.3, 10, 1.0))


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"r": 0}, r"r=0 must be an integer in \[1, 16\]"),
    ({"r": 17}, r"r=17 must be an integer in \[1, 16\]"),
    ({"gamma": 3000}, r"gamma=3000 must be an integer in \[1, 2440\]"),
    ({"delta": 1.0}, r"delta=1.0 must be a finite number in \(0, 1\)"),
    ({"epsilon": -1.0}, r"epsilon=-1.0 must be a finite number in \(0, inf\)"),
    ({"tau": 0}, r"tau=0 must be an integer in \[1, inf\)"),
    ({"G": float("nan")}, r"G=nan must be a finite number"),
    ({"T": 2.5}, r"T=2.5 must be an integer"),
    ({"colluding": 16}, r"colluding=16 must be an integer in \[0, 15\]"),
    ({"colluding": 10}, r"colluding=10"),
    ({"min_aggregated": 11}, r"min_aggregated=11 must be an integer in \[1, 10\]"),
    ({"participations": 25.0}, r"participations=25.0 must be a finite number in \(0, 20\]"),
    ({"T": None}, r"convergence=None"),
    ({"accountant": "moments"}, r"accountant='moments'"),
])
def test_plan_value_errors_name_argument_value_and_range(kwargs: dict, match: str) -> None:
    args = dict(epsilon=10.0, delta=1e-4, n=16, r=10, tau=10, T=20, G=1.0, m=2440, gamma=244)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        plan_zcdp_secagg(**args)  # type: ignore[arg-type]


def test_formula_value_errors() -> None:
    with pytest.raises(ValueError, match=r"sigma=0 must be a finite number in \(0, inf\)"):
        paper_round_rho(tau=1, G=1.0, m=10, gamma=5, sigma=0, r=1)
    with pytest.raises(ValueError, match=r"rho=-1 must be"):
        zcdp_to_epsilon(rho=-1, delta=1e-5)
    with pytest.raises(ValueError, match=r"delta=0 must be"):
        epsilon_to_zcdp(epsilon=1.0, delta=0)
    with pytest.raises(ValueError, match=r"failure_prob=1.5"):
        participation_bound(T=10, r=2, n=5, failure_prob=1.5)
    with pytest.raises(ValueError, match=r"sampling='iid'"):
        own_epsilon(participations=1, tau=1, G=1.0, m=10, gamma=5, sigma=1.0, delta=1e-5,
                        sampling="iid")

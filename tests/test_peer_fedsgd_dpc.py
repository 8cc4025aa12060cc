"""FedSGD-DPC (paper 004): accounting, the testbed's figure, the planner and the fit."""

from __future__ import annotations

import json
import math
from typing import Any, Literal

import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution
from scipy import stats

from aggregator.peers import fedsgd_dpc as dpc
from aggregator.peers import fedsgd_dpc_accounting as acc
from aggregator.peers import fedsgd_dpc_bound as bnd
from aggregator.peers import fedsgd_dpc_pilot_fit as pil
from edge_device.laplace_noise import laplace_noise

N = 10
DELTA = 1e-5
#: The paper's settings (Section VII-A): p, d, l1 clip for the Laplace mechanism.
SETTINGS: dict[str, dict[str, Any]] = {
    "MNIST": {"dim": 7840, "n_samples": 60000.0, "clip": 300.0},
    "FEMNIST": {"dim": 110526, "n_samples": 70037.0, "clip": 200.0},
}
#: Table I: T* (b = 5), T* (b = 10), b* (T = 50), T* (b* = 1) at eps = 1, 5, 10.
TABLE_I = {
    "MNIST": {5: (5, 32, 67), 10: (2, 20, 42), "b_fix_T50": (1, 3, 5), 1: (22, 121, 244)},
    "FEMNIST": {5: (2, 22, 48), 10: (1, 14, 31), "b_fix_T50": (1, 2, 3), 1: (11, 70, 145)},
}
TABLE_EPS = (1.0, 5.0, 10.0)
#: The paper prints no mu, lambda, G, Gamma, Y0. Table I's nine T* values pin three lumped
#: numbers per data set: gamma, K_u = (A1 sampling part)/A2 and K_v = (rest of A1 + gamma Y0)/A2
#: at b = 1, eps = 1 (a minimax fit of eq. 6 to the nine rounded values, docs/peers).
TABLE_I_LUMPED = {"MNIST": (3.046, 410.342, 201.768), "FEMNIST": (4.888, 94.922, 128.593)}


def constants_from_lumped(name: str) -> bnd.ConvergenceConstants:
    """Constants realising a lumped triple: mu = 1, Gamma = 0 (only combinations matter)."""
    gamma, k_u, k_v = TABLE_I_LUMPED[name]
    st = SETTINGS[name]
    a2_unit = 32.0 * st["dim"] * st["clip"] ** 2 / st["n_samples"] ** 2  # A2(b=1, eps=1), mu=1
    grad_sq = 4.0 * st["dim"] * st["clip"] ** 2 * k_u / st["n_samples"] ** 2
    return bnd.ConvergenceConstants(smoothness=gamma / 2.0, strong_convexity=1.0,
                                    grad_bound=math.sqrt(grad_sq), non_iid=0.0,
                                    initial_gap=k_v * a2_unit / gamma)


def t_star(name: str, b: int, eps: float) -> float:
    st = SETTINGS[name]
    c = constants_from_lumped(name)
    a1, a2 = bnd.laplace_coefficients(b, epsilon=eps, N=N, constants=c, dim=st["dim"],
                                      n_samples=st["n_samples"], clip_l1=st["clip"])
    return bnd.optimal_rounds(a1, a2, c.gamma, c.initial_gap)


def random_constants(rng: np.random.Generator) -> bnd.ConvergenceConstants:
    mu = 10 ** rng.uniform(-1, 0.5)
    return bnd.ConvergenceConstants(smoothness=mu * 10 ** rng.uniform(0, 1.5),
                                    strong_convexity=mu, grad_bound=10 ** rng.uniform(-1, 2),
                                    non_iid=10 ** rng.uniform(-3, 1),
                                    initial_gap=10 ** rng.uniform(-1, 3))


# ------------------------------------------------------------------------------ Table I


@pytest.mark.parametrize("name", ["MNIST", "FEMNIST"])
def test_table_i_reproduced_by_eq6_with_lumped_constants(name: str) -> None:
    """All twelve printed Table I numbers follow from eq. 6 with three lumped constants."""
    row = TABLE_I[name]
    for b in (5, 10, 1):
        got = tuple(round(t_star(name, b, e)) for e in TABLE_EPS)
        assert got == row[b], (b, got)
    st = SETTINGS[name]
    c = constants_from_lumped(name)
    b_fix = tuple(math.ceil(bnd.optimal_clients_fixed_rounds(
        50, epsilon=e, N=N, constants=c, dim=st["dim"], n_samples=st["n_samples"],
        clip_l1=st["clip"])) for e in TABLE_EPS)
    assert b_fix == row["b_fix_T50"]  # the printed column is the ceiling of sqrt(B1/B2)
    for e, t_printed in zip(TABLE_EPS, row[1], strict=True):
        plan = dpc.plan_fedsgd_dpc(e, 0.0, N, "laplace", c, **st)
        assert (plan.b, plan.T) == (1, t_printed)  # b* = 1 for Laplace, the paper's finding
        assert plan.eps_total_paper == pytest.approx(e, rel=1e-12)


def test_printed_b_star_closed_form_equals_sqrt_b1_over_b2() -> None:
    c = constants_from_lumped("MNIST")
    st = SETTINGS["MNIST"]
    T, eps = 50, 5.0
    a1_1, a2_1 = bnd.laplace_coefficients(1, epsilon=eps, N=N, constants=c, dim=st["dim"],
                                          n_samples=st["n_samples"], clip_l1=st["clip"])
    # B1 = (4/mu^2) G^2/(T+gamma) 2N/(N-1), B2 = A2(1) T^2/(T+gamma)
    b1 = 4.0 / c.strong_convexity**2 * c.grad_bound**2 * 2 * N / (N - 1)
    b2 = a2_1 * T**2
    got = bnd.optimal_clients_fixed_rounds(T, epsilon=eps, N=N, constants=c, dim=st["dim"],
                                           n_samples=st["n_samples"], clip_l1=st["clip"])
    assert got == pytest.approx(math.sqrt(b1 / b2), rel=1e-12)


def test_t_star_grows_with_epsilon_and_b1_for_laplace() -> None:
    rng = np.random.default_rng(4)
    for _ in range(100):
        c = random_constants(rng)
        st: dict[str, Any] = {"dim": 7840, "n_samples": 60000.0, "clip_l1": 300.0}
        for b in (1, 5, 10):
            ts = []
            for e in (0.5, 1.0, 5.0, 10.0, 50.0):
                a1, a2 = bnd.laplace_coefficients(b, epsilon=e, N=N, constants=c, **st)
                ts.append(bnd.optimal_rounds(a1, a2, c.gamma, c.initial_gap))
            assert all(x < y for x, y in zip(ts, ts[1:], strict=False))
    for name in SETTINGS:  # Table I's constants: b* = 1 at every printed budget
        c = constants_from_lumped(name)
        for e in TABLE_EPS:
            assert dpc.plan_fedsgd_dpc(e, 0.0, N, "laplace", c, **SETTINGS[name]).b == 1


def test_eq6_is_the_minimiser_of_the_bound() -> None:
    c = constants_from_lumped("FEMNIST")
    st = SETTINGS["FEMNIST"]
    for b in (1, 10):
        a1, a2 = bnd.laplace_coefficients(b, epsilon=5.0, N=N, constants=c, dim=st["dim"],
                                          n_samples=st["n_samples"], clip_l1=st["clip"])
        ts = bnd.optimal_rounds(a1, a2, c.gamma, c.initial_gap)

        def u(t: float, a1: float = a1, a2: float = a2) -> float:
            return (a1 + a2 * t * t + c.gamma * c.initial_gap) / (t + c.gamma)

        h = 1e-4 * ts
        assert abs(u(ts + h) - u(ts - h)) / (2 * h) < 1e-7 * u(ts)
        assert u(ts) < u(0.9 * ts) and u(ts) < u(1.1 * ts)
        plan_u = bnd.objective_bound(round(ts), b, epsilon=5.0, delta=0.0, N=N,
                                     mechanism="laplace", constants=c, **st)
        assert plan_u == pytest.approx(u(round(ts)), rel=1e-12)


def test_b_rule_matches_exhaustive_search_unless_t_floor_binds() -> None:
    rng = np.random.default_rng(0)
    disagreements = 0
    for _ in range(150):
        c = random_constants(rng)
        n = int(rng.integers(2, 30))
        eps = 10 ** rng.uniform(-1, 1.3)
        st: dict[str, Any] = {"dim": int(10 ** rng.uniform(2, 5)),
                              "n_samples": 10 ** rng.uniform(3, 5),
                              "clip": 10 ** rng.uniform(-1, 2.5)}
        paper = dpc.plan_fedsgd_dpc(eps, 0.0, n, "laplace", c, **st)
        full = dpc.plan_fedsgd_dpc(eps, 0.0, n, "laplace", c, b_search="all", **st)
        assert full.objective_bound <= paper.objective_bound
        assert paper.b in (1, n)
        if full.b != paper.b:
            disagreements += 1
            assert min(t for _, t, _ in full.candidates) == 1  # only where T >= 1 binds
    assert disagreements > 0  # such instances exist (27 of 300 with this generator)


# ----------------------------------------------------------------- paper accounting


def test_reply_counts() -> None:
    assert acc.replies_per_client(22, 1, 10) == pytest.approx(2.2)
    assert acc.replies_per_client(22, 1, 10, count="round_robin") == 3.0
    assert acc.replies_per_client(22, 1, 10, count="worst_case") == 22.0
    assert acc.replies_per_client(100, 10, 10, count="round_robin") == 100.0


def test_laplace_linear_composition_against_direct_sum_and_pld() -> None:
    scale, xi, d_i = 0.05, 300.0, 6000.0
    per = acc.laplace_epsilon_per_reply(scale, clip_l1=xi, local_size=d_i)
    assert per == pytest.approx(2 * xi / d_i / scale, rel=1e-15)  # 2.0
    total = acc.laplace_epsilon_total(scale, T=30, b=1, N=10, clip_l1=xi, local_size=d_i)
    assert total == pytest.approx(math.fsum([per] * 3), rel=1e-15)  # 3 replies
    # Independent: the exact PLD of 3 Laplace releases has no loss beyond the linear sum and
    # positive mass just below it, so the sum is the tight pure-DP epsilon.
    pld = privacy_loss_distribution.from_laplace_mechanism(
        parameter=1 / per, sensitivity=1.0, value_discretization_interval=1e-4).self_compose(3)
    assert pld.get_delta_for_epsilon(total) < 1e-14
    assert pld.get_delta_for_epsilon(0.99 * total) > 1e-6


def test_inverses_round_trip() -> None:
    for T, b in ((22, 1), (50, 5), (7, 10)):
        s = acc.laplace_scale(3.0, T=T, b=b, N=N, clip_l1=300.0, local_size=6000.0)
        assert acc.laplace_epsilon_total(s, T=T, b=b, N=N, clip_l1=300.0,
                                         local_size=6000.0) == pytest.approx(3.0, rel=1e-13)
        sig = acc.gaussian_sigma(0.5, DELTA, T=T, b=b, N=N, clip_l2=10.0, local_size=6000.0)
        assert acc.gaussian_epsilon_total(sig, DELTA, T=T, b=b, N=N, clip_l2=10.0,
                                          local_size=6000.0) == pytest.approx(0.5, rel=1e-13)
        per = acc.gaussian_epsilon_per_reply(sig, DELTA, clip_l2=10.0, local_size=6000.0)
        assert per * math.sqrt(b * T / N) == pytest.approx(0.5, rel=1e-13)  # sqrt, not linear
    # eq. 5 with q: z = c2 q sqrt(R log(1/delta)) / eps (Abadi et al.'s Theorem 1 form)
    sig = acc.gaussian_sigma(1.0, DELTA, T=100, b=10, N=10, clip_l2=10.0, local_size=6000.0)
    z = acc.gaussian_noise_multiplier(sig, q=0.01, clip_l2=10.0, local_size=6000.0)
    assert z == pytest.approx(2 * 0.01 * math.sqrt(100 * math.log(1 / DELTA)), rel=1e-13)


# ---------------------------------------------------------------- the testbed's figure


@pytest.mark.parametrize(("q", "replies", "eps"), [
    (0.003, 1000, 0.05), (0.003, 10000, 0.3), (0.003, 10000, 0.5), (0.01, 1000, 0.5),
    (0.01, 10000, 2.0),
])
def test_gaussian_testbed_not_above_paper_in_moments_regime(q: float, replies: int,
                                                           eps: float) -> None:
    d_i = 6000.0
    sig = acc.gaussian_sigma(eps, DELTA, T=replies, b=N, N=N, clip_l2=10.0, local_size=d_i)
    z = acc.gaussian_noise_multiplier(sig, q=q, clip_l2=10.0, local_size=d_i)
    assert acc.moments_accountant_regime(q=q, noise_multiplier=z, epsilon=eps, delta=DELTA)
    rdp = acc.testbed_epsilon(mechanism="gaussian", noise_scale=sig, T=replies, b=N, N=N,
                              clip=10.0, local_size=d_i, delta=DELTA, q=q, accountant="rdp")
    assert rdp <= eps
    if eps >= 0.3:  # PLD at 1e-3 nats accumulates discretization slack over 1e4 steps
        pld = acc.testbed_epsilon(mechanism="gaussian", noise_scale=sig, T=replies, b=N, N=N,
                                  clip=10.0, local_size=d_i, delta=DELTA, q=q)
        assert pld <= eps


def test_gaussian_paper_understates_epsilon_at_its_own_setting() -> None:
    """q = 0.01, b = N = 10, T = 100, eps = 1: outside the regime, the truth is ~2.6."""
    sig = acc.gaussian_sigma(1.0, DELTA, T=100, b=10, N=10, clip_l2=10.0, local_size=6000.0)
    z = acc.gaussian_noise_multiplier(sig, q=0.01, clip_l2=10.0, local_size=6000.0)
    assert not acc.moments_accountant_regime(q=0.01, noise_multiplier=z, epsilon=1.0,
                                             delta=DELTA)
    kw: dict[str, Any] = {"mechanism": "gaussian", "noise_scale": sig, "T": 100, "b": 10,
                          "N": 10, "clip": 10.0, "local_size": 6000.0, "delta": DELTA,
                          "q": 0.01}
    assert acc.testbed_epsilon(**kw) == pytest.approx(2.616, abs=0.01)
    assert acc.testbed_epsilon(**kw, accountant="rdp") == pytest.approx(3.431, abs=0.01)


def test_laplace_testbed_not_above_paper_with_the_same_count() -> None:
    """bT/N integer (round robin = expected) and the paper's replace-one sensitivity."""
    for T, b in ((100, 1), (20, 5), (50, 10)):
        s = acc.laplace_scale(1.0, T=T, b=b, N=N, clip_l1=300.0, local_size=6000.0)
        kw: dict[str, Any] = {"mechanism": "laplace", "noise_scale": s, "T": T, "b": b,
                              "N": N, "clip": 300.0, "local_size": 6000.0, "delta": DELTA}
        assert acc.testbed_epsilon(**kw, relation="replace-one") <= 1.0
        assert acc.testbed_epsilon(**kw, relation="replace-one", accountant="rdp") <= 1.0
        # add/remove halves the sensitivity of a fixed-denominator average
        assert acc.testbed_epsilon(**kw) <= 0.5 + 1e-3


def test_laplace_expected_count_understates_round_robin_clients() -> None:
    """Table I's MNIST eps = 1 plan: T = 22, b = 1, N = 10, so 2.2 replies "on average"."""
    s = acc.laplace_scale(1.0, T=22, b=1, N=N, clip_l1=300.0, local_size=6000.0)
    kw: dict[str, Any] = {"mechanism": "laplace", "noise_scale": s, "T": 22, "b": 1, "N": N,
                          "clip": 300.0, "local_size": 6000.0, "delta": DELTA,
                          "relation": "replace-one"}
    assert acc.testbed_epsilon(**kw) == pytest.approx(3 / 2.2, rel=2e-3)  # 1.364 > 1
    assert acc.testbed_epsilon(**kw, count="worst_case") > 5.0


# ------------------------------------------------------------------------------ planner


def test_gaussian_plan_takes_all_clients_and_fixed_rounds() -> None:
    c = bnd.ConvergenceConstants(smoothness=1.5, strong_convexity=1.0, grad_bound=18.0,
                                 non_iid=0.0, initial_gap=415.0, local_variance=100.0)
    st: dict[str, Any] = {"dim": 7840, "n_samples": 60000.0, "clip": 10.0, "q": 0.01}
    for eps in (0.1, 0.5, 1.0):
        plan = dpc.plan_fedsgd_dpc(eps, DELTA, N, "gaussian", c, T_fixed=100, **st)
        assert (plan.b, plan.T, plan.T_continuous) == (N, 100, math.inf)
        assert plan.eps_total_paper == pytest.approx(eps, rel=1e-12)
        assert plan.eps_per_reply == pytest.approx(eps / 10.0, rel=1e-12)  # sqrt(100) replies
        assert json.loads(json.dumps(plan.to_dict()))["candidates"][1]["b"] == N
    tiny = bnd.ConvergenceConstants(smoothness=1.5, strong_convexity=1.0, grad_bound=0.0,
                                    non_iid=0.0, initial_gap=1e-6)
    plan = dpc.plan_fedsgd_dpc(1e-3, DELTA, N, "gaussian", tiny, T_fixed=100, **st)
    assert plan.T_continuous == 0.0  # noise floor above the start: do not train (Solution 2)
    with pytest.raises(ValueError, match="T_fixed=None"):
        dpc.plan_fedsgd_dpc(1.0, DELTA, N, "gaussian", c, **st)


def test_plan_is_frozen_and_serialisable() -> None:
    plan = dpc.plan_fedsgd_dpc(5.0, 0.0, N, "laplace", constants_from_lumped("MNIST"),
                               **SETTINGS["MNIST"])
    with pytest.raises(AttributeError):
        plan.T = 3  # type: ignore[misc]
    d = json.loads(json.dumps(plan.to_dict()))
    assert d["T"] == 121 and d["b"] == 1 and d["max_replies_per_client"] == 13
    assert d["eps_total_round_robin"] == pytest.approx(5.0 * 13 / 12.1)


# ------------------------------------------------------------------ constants from pilots

TRUE = bnd.ConvergenceConstants(smoothness=2.0, strong_convexity=0.5, grad_bound=30.0,
                                non_iid=0.3, initial_gap=40.0)
LAPLACE_PILOTS = ((1, 40, 20.0), (10, 40, 20.0), (5, 20, 5.0), (1, 60, 50.0), (10, 10, 2.0))
F_STAR = 0.7


def synthetic(constants: bnd.ConvergenceConstants, pilots: tuple[tuple[int, int, float], ...],
              *, mechanism: acc.Mechanism = "laplace", observable: str = "loss",
              rel_noise: float = 0.0, seed: int = 0, **st: float) -> list[pil.PilotCurve]:
    """Curves that follow the bound exactly: Y_t = U(T, b) (T + gamma) / (t + gamma)."""
    rng = np.random.default_rng(seed)  # test data, not privacy noise
    out = []
    for b, T, eps in pilots:
        u = bnd.objective_bound(T, b, epsilon=eps, delta=DELTA, N=N, mechanism=mechanism,
                                constants=constants, **st)  # type: ignore[arg-type]
        ts = tuple(range(T + 1))
        ys = np.array([u * (T + constants.gamma) / (t + constants.gamma) for t in ts])
        if observable == "loss":
            ys = F_STAR + constants.smoothness / 2.0 * ys
        ys = ys * (1.0 + rel_noise * rng.standard_normal(len(ys)))
        out.append(pil.PilotCurve(ts, tuple(float(y) for y in ys), b, T, eps))
    return out


LAP_ST: dict[str, Any] = {"dim": 7840, "n_samples": 60000.0, "clip": 300.0}


@pytest.mark.parametrize("observable", ["loss", "distance"])
def test_fit_recovers_constants_from_exact_curves(observable: Literal["loss", "distance"]) -> None:
    curves = synthetic(TRUE, LAPLACE_PILOTS, observable=observable, **LAP_ST)
    fit = pil.fit_pilot_curves(curves, N=N, initial_gap=40.0, observable=observable, **LAP_ST)
    got = fit.constants
    for name in ("smoothness", "strong_convexity", "grad_bound", "non_iid"):
        assert getattr(got, name) == pytest.approx(getattr(TRUE, name), rel=1e-5), name
    assert fit.optimum_loss == pytest.approx(F_STAR if observable == "loss" else 0.0, abs=1e-4)
    other = pil.estimate_constants(curves, N=N, non_iid=0.3, observable=observable, **LAP_ST)
    assert other.initial_gap == pytest.approx(40.0, rel=1e-5)


def test_fit_recovers_gaussian_constants() -> None:
    true = bnd.ConvergenceConstants(smoothness=3.0, strong_convexity=0.5, grad_bound=5.0,
                                    non_iid=0.2, initial_gap=20.0, local_variance=50.0)
    st: dict[str, Any] = {"dim": 7840, "n_samples": 60000.0, "clip": 10.0, "q": 0.01}
    pilots = ((1, 100, 0.1), (10, 100, 0.5), (5, 50, 0.2), (10, 200, 1.0))
    curves = synthetic(true, pilots, mechanism="gaussian", **st)
    got = pil.estimate_constants(curves, N=N, mechanism="gaussian", delta=DELTA,
                                 initial_gap=20.0, local_variance=50.0, **st)
    for name in ("smoothness", "strong_convexity", "grad_bound", "non_iid"):
        assert getattr(got, name) == pytest.approx(getattr(true, name), rel=1e-4), name


def test_fit_tolerates_one_percent_noise() -> None:
    for seed in range(3):
        curves = synthetic(TRUE, LAPLACE_PILOTS, rel_noise=0.01, seed=seed, **LAP_ST)
        got = pil.estimate_constants(curves, N=N, non_iid=0.3, **LAP_ST)
        assert got.strong_convexity == pytest.approx(0.5, rel=0.05)
        assert got.smoothness == pytest.approx(2.0, rel=0.05)
        assert got.grad_bound == pytest.approx(30.0, rel=0.05)


def test_fit_refuses_unidentifiable_input() -> None:
    curves = synthetic(TRUE, LAPLACE_PILOTS, **LAP_ST)
    same_b = [c for c in curves if c.b == 1]
    with pytest.raises(ValueError, match="do not identify"):
        pil.fit_pilot_curves(same_b, N=N, initial_gap=40.0, **LAP_ST)
    with pytest.raises(ValueError, match="exactly one of initial_gap"):
        pil.fit_pilot_curves(curves, N=N, **LAP_ST)
    with pytest.raises(ValueError, match="exactly one of initial_gap"):
        pil.fit_pilot_curves(curves, N=N, initial_gap=1.0, non_iid=1.0, **LAP_ST)
    with pytest.raises(ValueError, match="solved non_iid"):
        pil.fit_pilot_curves(curves, N=N, initial_gap=1e6, **LAP_ST)


# ------------------------------------------------------------------------- validation


@pytest.mark.parametrize(("call", "match"), [
    (lambda: acc.replies_per_client(10, 11, 10), r"b=11 must be an integer in \[1, 10\]"),
    (lambda: acc.replies_per_client(0, 1, 10), r"T=0 .*\[1, inf\)"),
    (lambda: acc.replies_per_client(10, 1, 1), r"N=1 .*\[2, inf\)"),
    (lambda: acc.replies_per_client(10, 1, 10, count="mean"),  # type: ignore[arg-type]
     "count='mean'"),
    (lambda: acc.laplace_scale(0.0, T=1, b=1, N=2, clip_l1=1.0, local_size=1.0),
     r"epsilon=0.0 .*\(0, inf\)"),
    (lambda: acc.laplace_epsilon_per_reply(1.0, clip_l1=-1.0, local_size=1.0), "clip_l1=-1.0"),
    (lambda: acc.gaussian_sigma(1.0, 1.0, T=1, b=1, N=2, clip_l2=1.0, local_size=1.0),
     r"delta=1.0 .*\(0, 1\)"),
    (lambda: acc.gaussian_sigma(1.0, 1e-5, T=1, b=1, N=2, clip_l2=1.0, local_size=1.0,
                                c2=math.nan), "c2=nan"),
    (lambda: acc.gaussian_noise_multiplier(1.0, q=1.5, clip_l2=1.0, local_size=1.0),
     r"q=1.5 .*\(0, 1\]"),
    (lambda: acc.testbed_epsilon(mechanism="gaussian", noise_scale=1.0, T=1, b=1, N=2,
                                 clip=1.0, local_size=1.0, delta=1e-5), "q=None"),
    (lambda: acc.testbed_epsilon(mechanism="laplace", noise_scale=1.0, T=1, b=1, N=2,
                                 clip=1.0, local_size=1.0, delta=1e-5,
                                 count="expected"), "count='expected'"),  # type: ignore[arg-type]
    (lambda: acc.testbed_epsilon(mechanism="cauchy", noise_scale=1.0, T=1, b=1, N=2,  # type: ignore[arg-type]
                                 clip=1.0, local_size=1.0, delta=1e-5), "mechanism='cauchy'"),
    (lambda: bnd.ConvergenceConstants(1.0, 2.0, 1.0, 0.0, 0.0),
     r"strong_convexity=2.0 .*\(0, 1\]"),
    (lambda: bnd.ConvergenceConstants(1.0, 0.5, -1.0, 0.0, 0.0), "grad_bound=-1.0"),
    (lambda: bnd.ConvergenceConstants(True, 0.5, 1.0, 0.0, 0.0), "smoothness=True"),
    (lambda: bnd.optimal_rounds(1.0, 0.0, 2.0, 1.0), r"A2=0.0 .*\(0, inf\)"),
    (lambda: dpc.plan_fedsgd_dpc(1.0, 0.0, 10, "laplace", None, **LAP_ST), "constants=None"),
    (lambda: dpc.plan_fedsgd_dpc(1.0, 0.0, 10, "laplace", TRUE, T_fixed=0, **LAP_ST),
     "T_fixed=0"),
    (lambda: dpc.plan_fedsgd_dpc(1.0, 1e-5, 10, "gaussian", TRUE, T_fixed=5, dim=10,
                                 n_samples=100.0, clip=1.0), "q=None"),
    (lambda: dpc.plan_fedsgd_dpc(1.0, 0.0, 10, "laplace", TRUE,
                                 b_search="some", **LAP_ST),  # type: ignore[arg-type]
     "b_search='some'"),
    (lambda: pil.PilotCurve((0, 5), (1.0,), 1, 4, 1.0), r"rounds\[\]=5 .*\[0, 4\]"),
    (lambda: pil.fit_pilot_curves([pil.PilotCurve((0, 1), (1.0, 2.0), 12, 4, 1.0)], N=10,
                                  initial_gap=1.0, **LAP_ST), r"curve.b=12 .*\[1, 10\]"),
])
def test_arguments_are_validated(call: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()  # type: ignore[operator]


# --------------------------------------------------------------------- Laplace sampler


def test_laplace_noise_has_the_laplace_law() -> None:
    n, b = 200_000, 0.7
    x = laplace_noise(n, b)
    assert x.shape == (n,) and x.dtype == np.float64
    # Var(X^2) = 20 b^4, so the sample variance has sd sqrt(20/n) b^2 = 0.01 b^2: 6 sd
    assert np.var(x) == pytest.approx(2 * b * b, abs=6 * math.sqrt(20 / n) * b * b)
    assert np.mean(np.abs(x)) == pytest.approx(b, abs=6 * b / math.sqrt(n))
    assert abs(np.mean(x)) < 6 * math.sqrt(2) * b / math.sqrt(n)
    assert abs(np.mean(x > 0) - 0.5) < 6 * 0.5 / math.sqrt(n)
    # Kolmogorov-Smirnov distance below its 1e-6 quantile sqrt(ln(2e6)/(2n))
    assert stats.kstest(x, stats.laplace(scale=b).cdf).statistic < math.sqrt(
        math.log(2e6) / (2 * n))


def test_laplace_noise_is_not_reproducible_and_refuses_rng() -> None:
    a, b = laplace_noise((4, 5), 1.0), laplace_noise((4, 5), 1.0)
    assert a.shape == (4, 5) and not np.array_equal(a, b)
    assert np.array_equal(laplace_noise(3, 0.0), np.zeros(3))
    with pytest.raises(ValueError, match="refuses rng"):
        laplace_noise(3, 1.0, rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"scale=-1.0"):
        laplace_noise(3, -1.0)
    with pytest.raises(ValueError, match="negative dimension"):
        laplace_noise((2, -1), 1.0)

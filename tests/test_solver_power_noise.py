"""The closed form of sub-problem (32) against a generic constrained solver (SLSQP)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import minimize

from aggregator.solver.power_noise import solve_power_noise


def random_instance(rng: np.random.Generator, k: int) -> dict:
    """A feasible instance of (32); every fourth has t = 1, others t < 1 (some t = 0)."""
    n_dev = int(rng.integers(1, 5))
    trusted = [1.0, float(rng.uniform(0, 1)), float(rng.uniform(0, 0.2)), 0.0][k % 4]
    inst = dict(
        n_eff=10 ** rng.uniform(-3, 0, n_dev),
        trusted=trusted,
        theta_qs=1 + 10 ** rng.uniform(-1, 1.5),
        z=float(rng.uniform(0.5, 5)),
        d=int(rng.integers(50, 3000)),
        c4=float(10 ** rng.uniform(-3, 0)),
    )
    inst["c3"] = 10 ** rng.uniform(-1, 1, n_dev) * inst["z"] ** 2
    # Budget above the max-effort convergence sum (budget 0 returns the max-effort point).
    top = solve_power_noise(**inst, budget=0.0)
    inst["budget"] = top.conv_sum * (1 + 10 ** rng.uniform(-2, 1))
    return inst


def generic_optimum(inst: dict, rng: np.random.Generator, starts: int = 12) -> float | None:
    """Best feasible objective of SLSQP from random starts, in scaled (a, b)."""
    n, t, tq, z, d = inst["n_eff"], inst["trusted"], inst["theta_qs"], inst["z"], inst["d"]
    c3, c4, budget = inst["c3"], inst["c4"], inst["budget"]
    m = n.size
    b_scale, a_scale = c3 / z**2, c3 / d

    def unpack(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return x[:m] * a_scale, x[m:] * b_scale

    def objective(x: np.ndarray) -> float:
        a, b = unpack(x)
        return float(np.sum(z * z * b + d * a) / np.sum(c3))

    def conv(x: np.ndarray) -> float:
        a, b = unpack(x)
        return 1 - float(np.sum((tq * a + n) / b)) / budget

    def power(x: np.ndarray) -> np.ndarray:
        a, b = unpack(x)
        return 1 - (z * z * b + d * a) / c3

    def privacy(x: np.ndarray) -> np.ndarray:
        a, b = unpack(x)
        return (a + t * n - c4 * b) / (c4 * b_scale)

    cons = [{"type": "ineq", "fun": f} for f in (conv, power, privacy)]
    best = None
    for _ in range(starts):
        x0 = np.concatenate([rng.uniform(0, 0.5, m), 10 ** rng.uniform(-3, 0, m)])
        res = minimize(objective, x0, method="SLSQP", constraints=cons,
                       bounds=[(0, None)] * m + [(1e-12, None)] * m,
                       options={"maxiter": 500, "ftol": 1e-14})
        a, b = unpack(res.x)
        feasible = (
            np.sum((tq * a + n) / b) <= budget * (1 + 1e-7)
            and np.all(z * z * b + d * a <= c3 * (1 + 1e-7))
            and np.all(a + t * n - c4 * b >= -1e-7 * c4 * b)
        )
        if feasible and (best is None or res.fun < best):
            best = float(res.fun)
    return None if best is None else best * float(np.sum(c3))


def check_instances(count: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    compared = 0
    with_noise = 0
    for k in range(count):
        inst = random_instance(rng, k)
        sol = solve_power_noise(**inst)
        assert sol.feasible
        # The closed form's own point is feasible.
        a, b = sol.a, sol.b
        assert np.sum((inst["theta_qs"] * a + inst["n_eff"]) / b) <= inst["budget"] * (1 + 1e-9)
        assert np.all(inst["z"] ** 2 * b + inst["d"] * a <= inst["c3"] * (1 + 1e-9))
        assert np.all(a + inst["trusted"] * inst["n_eff"] >= inst["c4"] * b * (1 - 1e-9))
        generic = generic_optimum(inst, rng)
        if generic is None:
            continue  # the generic solver found no feasible point at all: nothing to compare
        compared += 1
        with_noise += bool(np.any(a > 0))
        rel = (generic - sol.objective) / sol.objective
        assert abs(rel) <= 1e-4, f"instance {k}: generic {generic} vs closed form {sol.objective}"
    assert compared >= 0.9 * count
    # Trusted fraction < 1 does make artificial noise necessary in a good share of instances.
    assert with_noise >= count // 5


def test_closed_form_matches_generic_solver_20_instances() -> None:
    check_instances(20, seed=11)


@pytest.mark.slow
def test_closed_form_matches_generic_solver_200_instances() -> None:
    check_instances(200, seed=12)


def test_full_trust_never_adds_artificial_noise() -> None:
    """SEED-NOTES item 7: with t = 1 and theta_qs >= 1 channel noise always wins."""
    rng = np.random.default_rng(3)
    for k in range(50):
        inst = random_instance(rng, 0)
        assert inst["trusted"] == 1.0
        sol = solve_power_noise(**inst)
        assert np.all(sol.a == 0), k
        # Privacy met by channel noise alone: b <= N0 / (h^2 c4).
        assert np.all(sol.b <= inst["n_eff"] / inst["c4"] * (1 + 1e-12))


def test_interior_b_follows_water_filling_shape() -> None:
    """Unconstrained devices get b = sqrt(lam n_i) / Z: b_i / sqrt(n_i) is the same for all."""
    n = np.array([1e-3, 2e-3, 4e-3, 8e-3])
    sol = solve_power_noise(n_eff=n, trusted=1.0, theta_qs=2.0, z=1.0, d=100,
                            c3=np.full(4, 1e6), c4=1e-3, budget=200.0)
    ratio = sol.b / np.sqrt(n)
    assert np.allclose(ratio, ratio[0], rtol=1e-9)
    assert sol.conv_sum == pytest.approx(200.0, rel=1e-9)


def test_artificial_noise_when_channel_credit_is_small() -> None:
    """t < 1/theta_qs and a tight convergence budget: privacy needs artificial noise."""
    n = np.array([1e-2, 1e-2])
    top = solve_power_noise(n_eff=n, trusted=0.05, theta_qs=3.0, z=1.0, d=100,
                            c3=np.full(2, 1e3), c4=1.0, budget=0.0)
    sol = solve_power_noise(n_eff=n, trusted=0.05, theta_qs=3.0, z=1.0, d=100,
                            c3=np.full(2, 1e3), c4=1.0, budget=top.conv_sum * 1.5)
    assert np.all(sol.a > 0)
    assert set(sol.regimes) == {"artificial"}
    sigma2 = sol.a / sol.b
    assert np.allclose(sigma2 + 0.05 * n / sol.b, 1.0, rtol=1e-9)  # privacy tight


def test_infeasible_budget_is_reported_not_hidden() -> None:
    n = np.array([1e-2])
    top = solve_power_noise(n_eff=n, trusted=0.0, theta_qs=2.0, z=1.0, d=100,
                            c3=np.array([1.0]), c4=1.0, budget=0.0)
    sol = solve_power_noise(n_eff=n, trusted=0.0, theta_qs=2.0, z=1.0, d=100,
                            c3=np.array([1.0]), c4=1.0, budget=top.conv_sum * 0.5)
    assert not sol.feasible


@pytest.mark.parametrize(
    ("kwargs", "word"),
    [
        ({"n_eff": np.array([-1.0])}, "n_eff"),
        ({"trusted": 1.5}, "trusted"),
        ({"theta_qs": 0.5}, "theta_qs"),
        ({"c4": 0.0}, "c4"),
        ({"c3": np.array([0.0])}, "c3"),
    ],
)
def test_bad_input_names_the_argument(kwargs: dict, word: str) -> None:
    base = dict(n_eff=np.array([1e-2]), trusted=1.0, theta_qs=2.0, z=1.0, d=10,
                c3=np.array([1.0]), c4=1.0, budget=1.0)
    base.update(kwargs)
    with pytest.raises(ValueError, match=word):
        solve_power_noise(**base)

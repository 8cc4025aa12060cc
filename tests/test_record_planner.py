"""Record-level EE-DP-FL plans: the constraint is the run's accountant, checked independently."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import dp_accounting
import numpy as np
import pytest

from aggregator.solver.infeasible import InfeasibleError
from aggregator.solver.record_planner import (
    PlanRefused,
    account_plan,
    default_calibrator,
    plan_record_scheme,
)
from aggregator.solver.record_problem import RECORD_MARGIN, NoiseFloor, RecordProblem, RecordTerms
from aggregator.solver.scenario import Scenario
from testbed.core.privacy.accountants.record_planning import calibrate_noise_multiplier

N = 4
SIZES = (6000, 6000, 5000, 6000)
B = 1024.0


def _terms(accountant: str = "rdp") -> RecordTerms:
    return RecordTerms(tuple(B / s for s in SIZES), True, 1.0, B, accountant, "add-remove")


def _scenario(terms: RecordTerms, *, epsilon: float = 5.0, beta2: float = 900.0,
              snr_n0: float = 0.005, k_max: int = 2000) -> Scenario:
    return Scenario(
        h=[1.0, 0.8, 1.2, 1.0], n0=[snr_n0] * N, p_max_w=[0.1] * N, e_comp_j=[0.5] * N,
        d=21840, local_steps=1, clip_bound=terms.norm_bound, epsilon=epsilon, delta=1e-5,
        beta1=40.0, beta2=beta2, t_cm_s=5e-6, tx_power_ref_w=0.1, trusted=1.0, k_max=k_max,
    )


def test_noise_floor_is_exact_at_integers_and_interpolates_between() -> None:
    terms = _terms()
    floor = NoiseFloor(terms, default_calibrator(terms, 5.0, 1e-5), 2000)
    q_worst = max(terms.sampling_rates)
    z = calibrate_noise_multiplier(q=q_worst, steps=100, target_epsilon=5.0 * RECORD_MARGIN,
                                   delta=1e-5, accountant="rdp")
    assert floor.s2(100.0) == pytest.approx((z / B) ** 2, rel=1e-12)
    # between integers: interpolated, monotone in K and close to the exact values
    mid = floor.s2(100.5)
    assert floor.s2_exact(100) <= mid * (1 + 1e-3)
    assert mid <= floor.s2_exact(101) * (1 + 2e-2)


def test_plan_epsilon_equals_dp_accounting_at_the_plan_values() -> None:
    """The calibrated constraint, at the integer plan, is dp-accounting's epsilon.

    ldp-fedavg has no channel credit, so sigma_i is all the noise: the independent
    computation is dp-accounting's own RDP accountant on PoissonSampled(Gaussian(z)) x K.
    """
    terms = _terms("rdp")
    scn = _scenario(terms)
    plan = plan_record_scheme(scn, "ldp-fedavg", terms, SIZES)
    k = plan.K
    for dev, q in zip(plan.devices, terms.sampling_rates, strict=True):
        z = dev.sigma * B / terms.example_clip
        acc = dp_accounting.rdp.RdpAccountant()
        acc.compose(dp_accounting.PoissonSampledDpEvent(
            q, dp_accounting.GaussianDpEvent(z)), k)
        eps = acc.get_epsilon(1e-5)
        assert dev.epsilon == pytest.approx(eps, rel=2e-3)
        assert eps <= scn.epsilon
        if q == max(terms.sampling_rates):
            # privacy is the binding constraint for the device with the largest q
            assert eps == pytest.approx(scn.epsilon * RECORD_MARGIN, rel=5e-3)


def test_channel_credit_replaces_artificial_noise_and_is_accounted() -> None:
    terms = _terms("rdp")
    scn = _scenario(terms)
    ch = plan_record_scheme(scn, "channel-dp", terms, SIZES)
    ldp = plan_record_scheme(scn, "ldp-fedavg", terms, SIZES)
    assert ch.trusted == 1.0 and ldp.trusted == 0.0
    for dev in ch.devices:
        # z_eff includes the credited channel noise at the plan's alpha and gain
        chan = dev.n0 / (dev.h * dev.alpha) ** 2
        assert dev.noise_multiplier == pytest.approx(
            math.sqrt(dev.sigma**2 + chan) * B / terms.example_clip, rel=1e-9)
        assert dev.epsilon <= scn.epsilon
        assert dev.epsilon_no_channel >= dev.epsilon
    # the channel carries the privacy noise: less radio energy, no more rounds
    assert ch.energy_comm_j < ldp.energy_comm_j
    assert ch.K <= ldp.K


@pytest.mark.slow  # 20 s; the default keeps test_solver_algorithm's brute-force comparison
def test_integer_plan_is_the_best_k_of_a_brute_force_scan() -> None:
    terms = _terms("rdp")
    scn = _scenario(terms)
    plan = plan_record_scheme(scn, "ldp-fedavg", terms, SIZES)
    floor = NoiseFloor(terms, default_calibrator(terms, scn.epsilon, scn.delta), scn.k_max)
    prob = RecordProblem(scn, "none", 0.0, floor=floor)
    energies = {}
    for k in range(1, 400):
        p = prob.evaluate(float(k), 0.0, 1.0)
        if p is not None:
            energies[k] = p.energy_j
    best_k = min(energies, key=energies.__getitem__)
    assert plan.energy_j <= energies[best_k] * (1 + 1e-9)
    assert plan.K == best_k


def test_a_plan_the_run_would_refuse_is_refused() -> None:
    """A wrong noise floor (z 10% too small) gives a plan over budget: refused, not emitted."""
    terms = _terms("rdp")
    scn = _scenario(terms)
    good = default_calibrator(terms, scn.epsilon, scn.delta)
    with pytest.raises(PlanRefused, match=r"epsilon in the run's accounting \(rdp\).*> target 5"):
        plan_record_scheme(scn, "ldp-fedavg", terms, SIZES,
                           calibrate=lambda q, k: 0.9 * good(q, k))


def test_infeasible_when_noise_outruns_rounds() -> None:
    terms = _terms("rdp")
    with pytest.raises(InfeasibleError, match="no feasible record-level plan"):
        plan_record_scheme(_scenario(terms, beta2=1e6, epsilon=0.5), "ldp-fedavg", terms, SIZES)


def test_account_plan_matches_the_runs_book_for_a_credited_device() -> None:
    """account_plan composes the run's RecordEvents: PLD and RDP agree with the closed z."""
    terms = _terms("pld")
    scn = _scenario(terms)
    alpha = np.full(N, 50.0)
    sigma = np.full(N, 1e-3)
    chk = account_plan(scenario=scn, terms=terms, dataset_sizes=SIZES, k_uploads=20,
                       l_value=scn.d, credited=1.0, alpha=alpha, sigma=sigma)
    for i in range(N):
        chan = scn.n0[i] / (scn.h[i] * alpha[i]) ** 2
        z = math.sqrt(sigma[i] ** 2 + chan) * B
        assert chk.noise_multiplier[i] == pytest.approx(z, rel=1e-12)
        acc = dp_accounting.pld.PLDAccountant()
        acc.compose(dp_accounting.PoissonSampledDpEvent(
            terms.sampling_rates[i], dp_accounting.GaussianDpEvent(z)), 20)
        assert chk.epsilon[i] == pytest.approx(acc.get_epsilon(1e-5), rel=1e-2)
        assert chk.epsilon_no_channel[i] > chk.epsilon[i]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "testbed", *args], capture_output=True,
                          text=True, timeout=600)


def _record_overrides(tiny_overrides: list[str]) -> list[str]:
    out = [o for o in tiny_overrides if not o.startswith(("local_steps", "rounds", "lr"))]
    out += ["local_steps=1", "lr=0.5", "privacy.noise=upload", "compression.quantize=false",
            "privacy.accountant=rdp"]
    return [x for o in out for x in ("--set", o)]


def test_plan_then_run_follows_the_plan_within_budget(
    tiny_overrides: list[str], tmp_path: Path
) -> None:
    sets = _record_overrides(tiny_overrides)
    scn = tmp_path / "scn.yaml"
    scn.write_text("solver: {beta1: 3.0, beta2: 0.1, k_max: 300}\n")
    plan_path = tmp_path / "plan.yaml"
    res = _cli("plan", *sets, "--scenario", str(scn), "--out", str(plan_path), "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["unit"] == "record" and out["accounting"] == "rdp"
    run_dir = tmp_path / "run"
    res = _cli("run", *sets, "--plan", str(plan_path), "--out", str(run_dir), "--no-progress")
    assert res.returncode == 0, res.stderr + res.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["rounds_completed"] == out["K"]
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for dev_plan in out["devices"]:
        dev_run = metrics[0]["devices"][dev_plan["id"]]
        assert dev_run["alpha"] == pytest.approx(dev_plan["alpha"], rel=1e-12)
        assert dev_run["sigma"] == pytest.approx(dev_plan["sigma"], abs=1e-15)
    for dev in summary["privacy"]["devices"]:
        assert dev["epsilon"] <= 5.0
        assert dev["epsilon"] == pytest.approx(out["devices"][dev["device"]]["epsilon"], rel=1e-6)
    # a config that disagrees with the plan is refused before any work, naming the key
    res = _cli("run", *sets, "--plan", str(plan_path), "--set", "privacy.epsilon=4",
               "--out", str(tmp_path / "run2"), "--no-progress")
    assert res.returncode == 2
    assert "privacy.epsilon" in res.stderr and "4.0" in res.stderr
    assert not (tmp_path / "run2").exists()


def test_device_plan_under_the_strict_accounting_is_refused(tiny_overrides: list[str]) -> None:
    sets = [x for o in tiny_overrides for x in ("--set", o)]
    res = _cli("plan", *sets, "--set", "privacy.unit=device", "--set", "clip.mode=coordinate")
    assert res.returncode == 2
    assert "privacy.accounting" in res.stderr and "strict" in res.stderr


def test_record_plan_needs_fitted_constants(tiny_overrides: list[str]) -> None:
    res = _cli("plan", *_record_overrides(tiny_overrides))
    assert res.returncode == 2
    assert "testbed calibrate" in res.stderr and "beta1" in res.stderr


def test_rounds_margin_scales_the_modelled_rounds(tiny_overrides: list[str],
                                                  tmp_path: Path) -> None:
    from aggregator.solver.from_config import read_scenario_file, record_scenario_from_config
    from testbed.core.config.loader import load_experiment, load_hardware

    sets = [o for o in tiny_overrides if not o.startswith("local_steps")]
    cfg = load_experiment(None, [*sets, "local_steps=1", "privacy.noise=upload"])
    hw = load_hardware(cfg.hw_config)
    cal = tmp_path / "cal.yaml"
    cal.write_text("model: decoded-noise/v1\nbeta1: 10.0\nbeta2: 2.0\nfit_error: 0.2\n")
    scn_file = tmp_path / "scn.yaml"
    scn_file.write_text(f"solver: {{calibration: {cal}}}\n")
    scn, _terms_, notes = record_scenario_from_config(
        cfg, hw, read_scenario_file(scn_file), d=100, dataset_sizes=[150] * cfg.devices)
    assert (scn.beta1, scn.beta2) == pytest.approx((12.0, 2.4))
    assert any("rounds margin 0.2" in n for n in notes)
    scn_file.write_text(f"solver: {{calibration: {cal}, rounds_margin: 0}}\n")
    scn, _terms_, _ = record_scenario_from_config(
        cfg, hw, read_scenario_file(scn_file), d=100, dataset_sizes=[150] * cfg.devices)
    assert (scn.beta1, scn.beta2) == pytest.approx((10.0, 2.0))

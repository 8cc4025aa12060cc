"""Fitting beta1, beta2 of (25) on synthetic data, and `testbed calibrate` end to end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from aggregator.solver.calibration import PilotRun, fit_betas, uploads_to_target


def synthetic_runs(beta1: float, beta2: float, rng: np.random.Generator, noise: float = 0.0):
    runs = []
    for tqs in (1.0, 2.5, 6.0):
        for s2 in (0.0, 1e-3, 4e-3):
            kappa = float(rng.uniform(100, 2000))
            m = float(10 ** rng.uniform(-4, -2))
            k = beta1 * tqs + beta2 * kappa * (tqs * s2 + m)
            runs.append(PilotRun(tqs, kappa, s2, m, k * (1 + noise * rng.standard_normal())))
    return runs


def test_exact_data_recovers_betas() -> None:
    rng = np.random.default_rng(0)
    fit = fit_betas(synthetic_runs(12.0, 3.0, rng))
    assert fit.beta1 == pytest.approx(12.0, rel=1e-9)
    assert fit.beta2 == pytest.approx(3.0, rel=1e-9)
    assert fit.rms_relative_error < 1e-9 and fit.identified and fit.n_runs == 9


def test_noisy_data_recovers_betas_within_noise() -> None:
    rng = np.random.default_rng(1)
    fits = [fit_betas(synthetic_runs(12.0, 3.0, rng, noise=0.02)) for _ in range(30)]
    b1 = np.array([f.beta1 for f in fits])
    b2 = np.array([f.beta2 for f in fits])
    assert abs(b1.mean() - 12.0) < 0.3 and abs(b2.mean() - 3.0) < 0.3
    assert all(f.rms_relative_error < 0.06 for f in fits)


def test_no_noise_effect_gives_unidentified_beta2() -> None:
    rng = np.random.default_rng(2)
    runs = synthetic_runs(12.0, 0.0, rng)
    fit = fit_betas(runs)
    assert fit.beta2 == pytest.approx(0.0, abs=1e-12) and not fit.identified


def test_fit_refuses_too_few_or_degenerate_runs() -> None:
    run = PilotRun(2.0, 100.0, 0.0, 1e-3, 10.0)
    with pytest.raises(ValueError, match="at least 2"):
        fit_betas([run])
    with pytest.raises(ValueError, match="independently"):
        fit_betas([run, PilotRun(4.0, 200.0, 0.0, 1e-3, 20.0)])  # regressors proportional
    with pytest.raises(ValueError, match=r"runs\[1\]"):
        fit_betas([run, PilotRun(0.5, 100.0, 0.0, 1e-3, 20.0)])


def test_uploads_to_target() -> None:
    assert uploads_to_target([3.0, 2.0, 1.0, 0.5], 1.0) == 3
    assert uploads_to_target([3.0, 2.0], 1.0) is None
    assert uploads_to_target([0.1], 1.0) == 1


def _runner_available() -> bool:
    try:
        from testbed.runner import run_experiment  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.skipif(not _runner_available(), reason="testbed.runner not available")
def test_calibrate_command_end_to_end(
    tmp_path: Path, tiny_overrides: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    from testbed.cli.main import main

    sets = [a for o in tiny_overrides for a in ("--set", o)]
    out = tmp_path / "cal.yaml"
    rc = main(["calibrate", *sets, "--set", "rounds=4", "--theta-s", "1.0", "0.5",
               "--levels", "16", "--sigmas", "0", "0.05", "--runs-dir", str(tmp_path / "runs"),
               "--out", str(out), "--json"])
    assert rc == 0
    result = json.loads(capsys.readouterr().out)
    saved = yaml.safe_load(out.read_text())
    assert saved["beta1"] == pytest.approx(result["beta1"]) and saved["beta1"] >= 0
    assert len(saved["runs"]) == 4
    for row in saved["runs"]:
        assert len(row["train_loss"]) == 4
        assert (Path(row["run_dir"]) / "metrics.jsonl").is_file()
        # every pilot reaches the default target (the largest final loss)
        assert row["uploads_needed"] is not None and 1 <= row["uploads_needed"] <= 4
    # The fit reproduces its own data to the reported error.
    pred = [saved["beta1"] * r["theta_qs"] + saved["beta2"] * r["kappa"]
            * (r["theta_qs"] * r["sigma2_mean"] + r["chan_mean"]) for r in saved["runs"]]
    errs = [(p - r["uploads_needed"]) / r["uploads_needed"]
            for p, r in zip(pred, saved["runs"], strict=True)]
    rms = np.sqrt(np.mean(np.square(errs)))
    assert rms == pytest.approx(saved["rms_relative_error"], rel=1e-6)

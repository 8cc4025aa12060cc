"""Fitting beta1, beta2 on synthetic data, the shared loss-target definition, and
`testbed calibrate` end to end (record and device units)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from aggregator.solver.calibration import (
    PilotRun,
    design_problem,
    fit_betas,
    smoothed_losses,
    uploads_to_target,
)
from aggregator.solver.compression_terms import DECODED_NOISE_MODEL, decoded_noise_energy
from tests.overrides import merge_sets


def synthetic_runs(beta1: float, beta2: float, rng: np.random.Generator, noise: float = 0.0):
    runs = []
    for tqs in (1.0, 2.5, 6.0):
        for s2 in (0.0, 1e-3, 4e-3):
            kappa = float(rng.uniform(100, 2000))
            m = float(10 ** rng.uniform(-4, -2))
            k = beta1 * tqs + beta2 * kappa * (tqs * s2 + m)
            runs.append(PilotRun.paper(theta_qs=tqs, kappa=kappa, sigma2_mean=s2, chan_mean=m,
                                    uploads_needed=k * (1 + noise * rng.standard_normal())))
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
    run = PilotRun.paper(theta_qs=2.0, kappa=100.0, sigma2_mean=0.0, chan_mean=1e-3,
                         uploads_needed=10.0)
    with pytest.raises(ValueError, match="at least 2"):
        fit_betas([run])
    with pytest.raises(ValueError, match="independently"):  # regressors proportional
        fit_betas([run, PilotRun(4.0, 0.2, 20.0)])
    with pytest.raises(ValueError, match=r"runs\[1\]"):
        fit_betas([run, PilotRun(0.5, 0.1, 20.0)])
    with pytest.raises(ValueError, match="models"):
        fit_betas([run, PilotRun.decoded(theta_qs=4.0, noise_energy_mean=1.0,
                                         uploads_needed=20.0)])


def test_uploads_to_target() -> None:
    assert uploads_to_target([3.0, 2.0, 1.0, 0.5], 1.0) == 3
    assert uploads_to_target([3.0, 2.0], 1.0) is None
    assert uploads_to_target([0.1], 1.0) == 1


def test_uploads_to_target_uses_the_trailing_mean() -> None:
    curve = [3.0, 2.0, 1.0, 0.5, 0.4]
    # window 2: 3, 2.5, 1.5, 0.75, 0.45; window 3: 3, 2.5, 2, 1.1667, 0.6333
    assert smoothed_losses(curve, 2) == pytest.approx([3.0, 2.5, 1.5, 0.75, 0.45])
    assert uploads_to_target(curve, 1.0, window=2) == 4
    assert uploads_to_target(curve, 1.0, window=3) == 5
    assert uploads_to_target(curve, 0.5, window=3) is None
    # A single low round does not count as reaching the target once smoothed.
    assert uploads_to_target([3.0, 0.1, 3.0, 3.0], 1.0, window=3) is None
    # A round without a loss (nan: no examples) is skipped, not poisoning the window.
    assert smoothed_losses([2.0, math.nan, 1.0], 2) == pytest.approx([2.0, 2.0, 1.0])
    assert np.isnan(smoothed_losses([math.nan], 3)[0])
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="window"):
            smoothed_losses(curve, bad)  # type: ignore[arg-type]


def _synthetic_curve(k_needed: float, target: float, window: int, rounds: int,
                     rng: np.random.Generator, jitter: float) -> list[float]:
    """A loss curve whose trailing mean over ``window`` rounds is ``target exp(-r (k -
    K))`` (times a small multiplicative jitter), so it crosses ``target`` at round
    ``ceil(K)`` (1-based)."""
    r = 0.05
    gain = np.mean(np.exp(r * np.arange(window)))  # trailing mean of exp(-r j) = gain exp(-r k)
    k = np.arange(1, rounds + 1)
    clean = target * np.exp(-r * (k - k_needed)) / gain
    return list(clean * (1 + jitter * rng.standard_normal(rounds)))


@pytest.mark.parametrize("jitter", [0.0, 0.01])
def test_synthetic_loss_curves_with_known_constants_recover_them(jitter: float) -> None:
    # Regressors of a record-level grid (decoded-noise/v1): theta_qs = d / l and the mean
    # decoded noise energy theta_qs d sigma^2 + l chan, for theta_s in {1, 0.5, 0.25} and
    # three noise multipliers; K_needed from known constants.
    beta1, beta2 = 30.0, 2.5
    d, batch, clip, n0, alpha = 20_000, 64, 1.0, 1e-3, 60.0
    rng = np.random.default_rng(3)
    runs, truth = [], []
    for theta_s in (1.0, 0.5, 0.25):
        l = int(theta_s * d)
        for z in (0.5, 1.0, 1.5):
            sigma2 = (z * clip / batch) ** 2
            noise = decoded_noise_energy("s", 0.0, l / d, d, sigma2, n0 / alpha**2)
            assert noise == pytest.approx((d / l) * d * sigma2 + l * n0 / alpha**2)
            k_needed = beta1 * d / l + beta2 * noise
            truth.append(k_needed)
            curve = _synthetic_curve(k_needed, 0.8, 5, 400, rng, jitter)
            k = uploads_to_target(curve, 0.8, window=5)
            assert k is not None
            if jitter == 0.0:
                assert k == math.ceil(k_needed)
            runs.append(PilotRun.decoded(theta_qs=d / l, noise_energy_mean=noise,
                                         uploads_needed=float(k)))
    assert min(truth) > 30 and max(truth) < 350  # K large enough for a rounding < 4%
    fit = fit_betas(runs)
    assert fit.model == DECODED_NOISE_MODEL and fit.identified and fit.n_runs == 9
    assert fit.beta1 == pytest.approx(beta1, rel=0.03)
    assert fit.beta2 == pytest.approx(beta2, rel=0.03)
    assert fit.rms_relative_error < 0.03
    assert fit.loo_relative_error is not None and fit.loo_relative_error < 0.05
    assert fit.error == fit.loo_relative_error


def test_leave_one_out_error_exposes_a_pilot_the_model_does_not_explain() -> None:
    runs = [PilotRun.decoded(theta_qs=t, noise_energy_mean=n, uploads_needed=10 * t + 50 * n)
            for t, n in ((1, 0.1), (1, 0.5), (4, 0.2), (4, 1.0))]
    good = fit_betas(runs)
    assert good.loo_relative_error == pytest.approx(0.0, abs=1e-9)
    bad = fit_betas([*runs[:3], PilotRun.decoded(theta_qs=4, noise_energy_mean=1.0,
                                                 uploads_needed=300.0)])
    assert bad.loo_relative_error is not None
    assert bad.loo_relative_error > bad.rms_relative_error > 0.1
    assert fit_betas(runs[:2]).loo_relative_error is None  # 2 pilots: exact, not measurable


def test_design_problem_refuses_grids_that_cannot_identify_both_constants() -> None:
    assert design_problem([(1.0, 0.1), (1.0, 0.9), (4.0, 0.4), (4.0, 3.6)]) is None
    assert "at least 2" in str(design_problem([(1.0, 0.1)]))
    # theta_s varied at one noise multiplier: the noise term follows theta_qs.
    problem = design_problem([(1.0, 0.1), (4.0, 0.41)])
    assert problem is not None and "cosine" in problem
    # one compression for every pilot: beta1 theta_qs is the intercept, identified through
    # the noise term's variation
    assert design_problem([(1.0, 0.1), (1.0, 0.4), (1.0, 0.9)]) is None
    assert "theta_qs is 0" in str(design_problem([(0.0, 0.1), (0.0, 0.9)]))
    assert "noise term does not vary" in str(design_problem([(1.0, 0.0), (4.0, 0.0)]))
    assert "noise term does not vary" in str(design_problem([(1.0, 0.5), (4.0, 0.55)]))




def _record_sets(tiny_overrides: list[str], *extra: str) -> list[str]:
    """``--set`` flags of a tiny record-level FedSGD config (upload noise, one step)."""
    sets = merge_sets(tiny_overrides, ["local_steps=1", "privacy.noise=upload", "lr=0.3"], extra)
    return [a for o in sets for a in ("--set", o)]


def test_calibrate_refuses_bad_grids_and_configs_before_any_pilot(
    tmp_path: Path, tiny_overrides: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    from testbed.cli.main import main

    runs = tmp_path / "runs"
    # theta_s varied at a single noise multiplier: the noise term follows theta_qs.
    rc = main(["calibrate", *_record_sets(tiny_overrides), "--theta-s", "1.0", "0.25",
               "--noise-multipliers", "1.0", "--runs-dir", str(runs)])
    err = capsys.readouterr().err
    assert rc == 2 and not runs.exists()
    assert "cannot identify beta1 and beta2" in err and "cosine" in err
    assert "--theta-s / --noise-multipliers" in err
    # Record pilots are FedSGD: a config with 3 local steps is refused, naming the key.
    sets = [a for o in tiny_overrides for a in ("--set", o)]
    assert main(["calibrate", *sets, "--runs-dir", str(runs)]) == 2
    assert "'local_steps': got 3" in capsys.readouterr().err
    assert main(["calibrate", *_record_sets(tiny_overrides), "--sigmas", "0.1"]) == 2
    assert "--sigmas: got [0.1]; not used with the record unit" in capsys.readouterr().err
    assert main(["calibrate", *_record_sets(tiny_overrides), "--max-error", "0"]) == 2
    assert "--max-error: got 0.0" in capsys.readouterr().err
    assert not runs.exists()


def test_record_calibration_with_real_pilots_reports_progress_and_refuses_above_the_bound(
    tmp_path: Path, tiny_overrides: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    from testbed.cli.main import main

    out = tmp_path / "cal.yaml"
    rc = main(["calibrate", *_record_sets(tiny_overrides), "--rounds", "6",
               "--runs-dir", str(tmp_path / "runs"), "--out", str(out), "--max-error", "1e-6",
               "--json"])
    captured = capsys.readouterr()
    result = json.loads(captured.out)  # one JSON object on stdout, even when refused
    assert rc == 3 and not out.exists() and result["written"] is None
    assert result["refused"]
    if result["n_runs_used"] >= 3:  # else refused for too few pilots in the fit
        # an exact fit (every pilot at the same round, beta2 = 0) is refused as not identified
        assert any("above --max-error 1e-06" in r or "not identified" in r
                   for r in result["refused"])
    assert "no calibration written" in captured.err
    for k in range(1, 4):
        assert f"pilot {k}/3 (theta_s=" in captured.err
    assert captured.err.count(": started, up to 6 rounds") == 3
    assert captured.err.count("completed after 6 rounds in") == 3
    assert result["model"] == "decoded-noise/v1" and result["unit"] == "record"
    assert result["window"] == 5 and result["max_error"] == 1e-6
    z_star = result["grid"]["z_star"]
    assert result["grid"]["noise_multipliers"] == pytest.approx(
        [0.5 * z_star, z_star, 2.0 * z_star])
    assert len(result["runs"]) == 3
    for row in result["runs"]:
        # sigma is exactly z C / B (no channel credit), and the regressors are the model's.
        assert row["sigma2_mean"] == pytest.approx((row["noise_multiplier"] * 1.0 / 16) ** 2,
                                                   rel=1e-6)
        assert row["theta_qs"] == pytest.approx(row["d"] / row["l"])
        assert row["noise_term"] == pytest.approx(
            row["theta_qs"] * row["d"] * row["sigma2_mean"] + row["l"] * row["chan_mean"])
        assert row["uploads_needed"] == uploads_to_target(
            row["train_loss"], result["target_loss"], 5)
        assert (Path(row["run_dir"]) / "metrics.jsonl").is_file()


def test_record_pilots_stop_at_the_given_target_loss(
    tmp_path: Path, tiny_overrides: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    from testbed.cli.main import main

    # Every pilot is below a loss of 100 at once: each stops after its first round, and a
    # target reached before any training says nothing, so there is nothing to fit.
    rc = main(["calibrate", *_record_sets(tiny_overrides), "--rounds", "50",
               "--target-loss", "100", "--json"])
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    assert rc == 3 and result["stop_at_loss"] == 100
    assert [r["rounds_completed"] for r in result["runs"]] == [1, 1, 1]
    assert all(r["uploads_needed"] == 1 and not r["used"] for r in result["runs"])
    assert "at their first round" in captured.err
    assert any(r.startswith("no fit") for r in result["refused"])


def test_calibrate_recovers_known_constants_from_synthetic_pilot_curves(
    tmp_path: Path, tiny_overrides: list[str], capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The whole command on pilots whose loss curves come from known beta1, beta2.

    The runner is replaced by one that writes synthetic curves: a real pilot's privacy
    noise comes from the OS CSPRNG, so no real run can have known constants.
    """
    import testbed.runner
    from testbed.calibration_pilots import record_pilots
    from testbed.cli.main import main
    from testbed.cli.model_size import count_params
    from testbed.core.config.loader import load_experiment, load_hardware
    from testbed.core.run_setup import prepare_data

    beta1, beta2, target = 20.0, 0.4, 0.8
    thetas, zs = [1.0, 0.5, 0.25], [0.5, 1.0, 2.0]
    sets = _record_sets(tiny_overrides)
    overrides = [*sets[1::2], "privacy.unit=record"]
    cfg = load_experiment(None, overrides)
    _, parts = prepare_data(cfg)
    pilots = record_pilots(None, overrides, load_hardware(cfg.hw_config), count_params(cfg),
                           [len(p) for p in parts], theta_s=thetas, noise_multipliers=zs,
                           rounds=400, window=5, stop_at_loss=target)
    k_of = {(p.settings["theta_s"], p.settings["noise_multiplier"]):
            beta1 * p.theta_qs + beta2 * p.noise_term for p in pilots}
    assert 20 < min(k_of.values()) and max(k_of.values()) < 350
    rng = np.random.default_rng(0)

    def fake_run(pcfg, run_dir, **_: object) -> dict:
        ts = pcfg.compression.theta_s if pcfg.compression.sparsify else 1.0
        curve = _synthetic_curve(k_of[(ts, pcfg.privacy.noise_multiplier)], target,
                                 pcfg.loss_target_window, pcfg.rounds, rng, 0.0)
        stop = uploads_to_target(curve, pcfg.stop_at_loss, pcfg.loss_target_window)
        run_dir.mkdir(parents=True)
        (run_dir / "metrics.jsonl").write_text("".join(
            json.dumps({"round": t, "train_loss": x}) + "\n" for t, x in enumerate(curve[:stop])))
        return {"status": "completed", "reason": ""}

    monkeypatch.setattr(testbed.runner, "run_experiment", fake_run)
    out = tmp_path / "cal.yaml"
    rc = main(["calibrate", *sets, "--theta-s", *map(str, thetas), "--noise-multipliers",
               *map(str, zs), "--rounds", "400", "--target-loss", str(target),
               "--runs-dir", str(tmp_path / "runs"), "--out", str(out)])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    saved = yaml.safe_load(out.read_text())
    assert saved["beta1"] == pytest.approx(beta1, rel=0.03)
    assert saved["beta2"] == pytest.approx(beta2, rel=0.03)
    assert saved["model"] == "decoded-noise/v1" and saved["unit"] == "record"
    assert saved["target_loss"] == target and saved["window"] == 5
    assert saved["fit_error"] == saved["loo_relative_error"] < 0.05
    assert saved["identified"] and saved["n_runs_used"] == 9 and "refused" not in saved
    for row in saved["runs"]:  # pilots stopped at the target: the last round reached it
        assert row["uploads_needed"] == row["rounds_completed"]
        assert row["uploads_needed"] == math.ceil(k_of[(row["theta_s"],
                                                        row["noise_multiplier"])])
    assert f"written to {out}" in captured.out
    assert "beta1 = " in captured.out and "leave-one-out" in captured.out


def test_device_calibration_end_to_end(
    tmp_path: Path, tiny_overrides: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    from testbed.cli.main import main

    sets = [a for o in tiny_overrides for a in ("--set", o)]
    out = tmp_path / "cal.yaml"
    rc = main(["calibrate", *sets, "--unit", "device", "--rounds", "4", "--theta-s", "1.0",
               "0.5", "--levels", "16", "--sigmas", "0", "0.05", "--runs-dir",
               str(tmp_path / "runs"), "--out", str(out), "--max-error", "1e9", "--json"])
    result = json.loads(capsys.readouterr().out)
    # Real pilots are random (CSPRNG noise): the fit may leave a constant at 0, or (the
    # target being the noisiest pilot's final loss) every pilot may reach it at its first
    # round and none enter the fit; either is refused, naming why. Otherwise it is written.
    assert rc in (0, 3) and out.exists() == (rc == 0)
    if rc == 3:
        assert result["refused"] and all(
            "not identified" in r or "reached the target" in r for r in result["refused"]
        ), result["refused"]
    assert result["model"] == "paper-25" and result["unit"] == "device"
    assert len(result["runs"]) == 4
    for row in result["runs"]:
        assert len(row["train_loss"]) == 4
        assert (Path(row["run_dir"]) / "metrics.jsonl").is_file()
        # every pilot reaches the default target (the largest final smoothed loss)
        assert row["reached"] and 1 <= row["uploads_needed"] <= 4
        assert row["noise_term"] == pytest.approx(
            row["kappa"] * (row["theta_qs"] * row["sigma2_mean"] + row["chan_mean"]))
    used = [r for r in result["runs"] if r["used"]]
    if result["beta1"] is not None:
        # The fit reproduces its own data to the reported error.
        errs = [(result["beta1"] * r["theta_qs"] + result["beta2"] * r["noise_term"]
                 - r["uploads_needed"]) / r["uploads_needed"] for r in used]
        assert np.sqrt(np.mean(np.square(errs))) == pytest.approx(
            result["rms_relative_error"], rel=1e-6)

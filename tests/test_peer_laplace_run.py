"""004's Laplace mechanism (FedSGD-DPC) as a scheme of `testbed run`: config, noise,
ledger events, dp-accounting's epsilon of the same events, resume."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import dp_accounting
import numpy as np
import pytest
import torch
from dp_accounting.pld import pld_privacy_accountant

from edge_device.dp_trainer import RecordTrainer
from testbed.core.config.errors import ConfigError
from testbed.core.config.loader import load_experiment
from testbed.core.privacy import LaplaceRecordEvent, Ledger, RecordAccountant
from testbed.core.privacy.accountants.record_planning import (
    calibrate_laplace_noise_multiplier,
    laplace_epsilon_for,
)
from testbed.core.privacy.analysis.record_device_level import device_level_epsilon
from testbed.core.record_schemes import laplace_replies
from testbed.runner import resume_experiment, run_experiment

LAPLACE = ["scheme=fedsgd-dpc", "local_steps=1", "privacy.noise=per-step",
           "privacy.noise_distribution=laplace", "train_samples=6000", "eval_samples=200",
           "devices=6", "clients_per_round=3", "eval_every=100"]
DELTA = 1e-5
REPO = Path(__file__).resolve().parents[1]


def test_laplace_needs_fedsgd_dpc() -> None:
    with pytest.raises(ConfigError, match="noise_distribution"):
        load_experiment(None, ["scheme=dp-pasgd", "privacy.noise_distribution=laplace"])
    with pytest.raises(ConfigError, match="noise_distribution"):
        load_experiment(None, ["privacy.noise_distribution=poisson"])
    cfg = load_experiment(None, [*LAPLACE, "rounds=4"])
    assert cfg.privacy.noise_distribution == "laplace"
    assert load_experiment(None, []).privacy.noise_distribution == "gaussian"


def test_replies_are_round_robin() -> None:
    cfg = load_experiment(None, [*LAPLACE, "rounds=4"])
    assert laplace_replies(cfg) == 2  # ceil(3 x 4 / 6)
    assert laplace_replies(load_experiment(None, [*LAPLACE, "rounds=5"])) == 3


@pytest.mark.parametrize("accountant", ["pld", "rdp"])
@pytest.mark.parametrize("relation", ["add-remove", "replace-one"])
def test_calibration_meets_target_and_matches_dp_accounting(accountant: str,
                                                            relation: str) -> None:
    b = calibrate_laplace_noise_multiplier(count=3, target_epsilon=2.0, delta=DELTA,
                                           accountant=accountant, relation=relation)
    factor = 2.0 if relation == "replace-one" else 1.0
    # basic composition (tight for pure DP): b = factor R / eps, enlarged at most by the
    # PLD's pessimistic discretization (R x 1e-3 nats)
    assert factor * 3 / 2.0 <= b <= factor * 3 / (2.0 - 3 * 1.1e-3)
    ours = laplace_epsilon_for(b=b, count=3, delta=DELTA, accountant=accountant,
                               relation=relation).epsilon
    assert ours <= 2.0
    if relation == "add-remove":
        ref: dp_accounting.PrivacyAccountant = (
            pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-3)
            if accountant == "pld" else dp_accounting.rdp.RdpAccountant()
        )
        ref.compose(dp_accounting.LaplaceDpEvent(b), 3)
        # RDP: the engine also knows the pure-DP value (order infinity), never worse
        assert ours == pytest.approx(ref.get_epsilon(DELTA), rel=1e-9) if accountant == "pld" \
            else ours <= ref.get_epsilon(DELTA) + 1e-12


def test_laplace_noise_has_the_scale() -> None:
    """Zero gradients (a bias-free linear model on zero inputs): the differential is pure
    Laplace noise, variance 2 s^2 per coordinate, mean 0, and E|X| = s."""
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 10, bias=False))
    x = np.zeros((5, 1, 2, 2), dtype=np.float32)
    y = np.arange(5, dtype=np.int64)
    trainer = RecordTrainer(model, x, y)
    s = 0.25
    draws = np.concatenate([
        trainer.train_laplace(np.zeros(40, np.float32), lr=0.1, example_clip=1.0,
                              laplace_scale=s, normaliser=5).differential
        for _ in range(2500)
    ])  # 1e5 samples
    assert draws.size == 100_000
    # standard errors over n = 1e5: sample variance sqrt((mu4 - var^2) / n) = sqrt(20 / n) s^2,
    # 0.71 % of 2 s^2; mean |X| (|X| ~ Exp(s)) s / sqrt(n), 0.32 % of s. Tolerances ~4.5 se.
    assert np.var(draws) == pytest.approx(2 * s * s, rel=0.032)
    assert np.mean(np.abs(draws)) == pytest.approx(s, rel=0.015)
    assert abs(np.mean(draws)) < 5 * math.sqrt(2) * s / math.sqrt(draws.size)


def test_l1_clipping_bounds_each_example() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 10))
    rng = np.random.default_rng(1)
    x = rng.normal(size=(7, 1, 4, 4)).astype(np.float32)
    y = rng.integers(0, 10, size=7)
    for backend in ("vmap", "layers"):
        trainer = RecordTrainer(model, x, y, backend=backend)  # type: ignore[arg-type]
        for i in range(7):
            sel = torch.arange(i, i + 1)
            total, norms, _ = trainer.clipped_sum(trainer.x[sel], trainer.y[sel], 0.5, norm=1)
            assert float(total.double().abs().sum()) <= 0.5
            assert float(norms[0]) > 0.5  # the clip was active
    vm = RecordTrainer(model, x, y, backend="vmap").clipped_sum(
        torch.from_numpy(x), torch.from_numpy(y), 0.5, norm=1)
    ly = RecordTrainer(model, x, y, backend="layers").clipped_sum(
        torch.from_numpy(x), torch.from_numpy(y), 0.5, norm=1)
    np.testing.assert_allclose(vm[0].numpy(), ly[0].numpy(), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(vm[1].numpy(), ly[1].numpy(), rtol=1e-4)


def test_device_level_is_pure_composition() -> None:
    events = [LaplaceRecordEvent(round=t, device=0, scale=0.01, example_clip=2.0,
                                 dataset_size=100) for t in range(3)]
    # a whole data set: l1 sensitivity xi_1 on the average, so 3 x xi_1 / s
    assert device_level_epsilon(events, DELTA) == pytest.approx(3 * 2.0 / 0.01)


def _ledger_events(run: Path) -> list[LaplaceRecordEvent]:
    with Ledger.open(run / "ledger.jsonl") as ledger:
        return list(ledger.events())


def test_laplace_run_accounts_and_resumes(tmp_path: Path) -> None:
    cfg = load_experiment(None, [*LAPLACE, "rounds=4"])
    run = tmp_path / "run"
    summary = run_experiment(cfg, run)
    assert summary["status"] == "completed" and summary["rounds_completed"] == 4
    events = _ledger_events(run)
    assert len(events) == 4 * 3
    assert all(isinstance(e, LaplaceRecordEvent) for e in events)
    for dev in summary["privacy"]["devices"]:
        i = dev["device"]
        mine = [e for e in events if e.device == i]
        assert dev["uploads"] == len(mine) == 2
        assert dev["epsilon"] <= cfg.privacy.epsilon
        # independent: dp-accounting's PLD accountant over the same events
        ref = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-3)
        for e in mine:
            assert e.sensitivity == pytest.approx(e.example_clip / e.dataset_size)
            ref.compose(dp_accounting.LaplaceDpEvent(e.scale / e.sensitivity))
        assert dev["epsilon_pld"] == pytest.approx(ref.get_epsilon(DELTA), rel=1e-9)
        # pure DP, linear composition, bounds it (up to the PLD's pessimistic rounding)
        linear = math.fsum(e.sensitivity / e.scale for e in mine)
        assert dev["epsilon_rdp"] == pytest.approx(linear, rel=1e-12)
        assert dev["epsilon_pld"] <= linear + len(mine) * 1e-3
        assert dev["epsilon_no_channel"] == pytest.approx(dev["epsilon"], rel=1e-9)
        assert dev["epsilon_device_level"] == pytest.approx(
            math.fsum(e.example_clip / e.scale for e in mine))
        peer = dev["epsilon_peer_paper"]
        assert peer["paper"] == "004 FedSGD-DPC (Laplace)" and peer["replies"] == 2
        assert peer["epsilon"] == pytest.approx(2 * linear)  # replace-one, 2 xi_1 / d_i


def test_killed_laplace_run_resumes_from_its_ledger(tmp_path: Path) -> None:
    """SIGKILL right after the 5th upload is recorded (round 1), then resume: the ledger
    replays into the accountants, no upload is lost or counted twice, the target holds."""
    run = tmp_path / "run"
    args = ["run", "--no-progress", "--out", str(run)]
    for o in [*LAPLACE, "rounds=4"]:
        args += ["--set", o]
    proc = subprocess.run(
        [sys.executable, "-m", "testbed", *args], cwd=REPO, capture_output=True, text=True,
        timeout=300, env={**os.environ, "TESTBED_FAULT": "after_commit:5"},
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert len(_ledger_events(run)) == 5
    summary = resume_experiment(run)
    assert summary["status"] == "completed" and summary["rounds_completed"] == 4
    events = _ledger_events(run)
    # the upload recorded just before the kill stays counted; its round is re-run, and a
    # re-sent upload is a new transmission (counted again) if the budget still allows it
    assert set((e.round, e.device) for e in events) <= {
        (t, (3 * t + j) % 6) for t in range(4) for j in range(3)}
    assert set((e.round, e.device) for e in events[:5]) <= set(
        (e.round, e.device) for e in events)
    acc = RecordAccountant("pld", DELTA)
    for e in events:
        acc.add(e)
    for dev in summary["privacy"]["devices"]:
        i = dev["device"]
        assert dev["uploads"] == len([e for e in events if e.device == i])
        assert dev["epsilon"] == acc.epsilon(i).epsilon <= 5.0


def test_metrics_name_the_laplace_uploads(tmp_path: Path) -> None:
    cfg = load_experiment(None, [*LAPLACE, "rounds=2", "clients_per_round=2"])
    run_experiment(cfg, tmp_path / "run")
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [sorted(d["device"] for d in ln["devices"] if d.get("transmitted"))
            for ln in lines] == [[0, 1], [2, 3]]

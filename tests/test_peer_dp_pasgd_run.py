"""dp-pasgd (000) as a scheme of `testbed run`, its planner as `testbed plan --scheme`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aggregator.peers.dp_pasgd_accounting import paper_epsilon
from testbed.cli.main import main
from testbed.core.config.errors import ConfigError
from testbed.core.config.loader import load_experiment
from testbed.runner import run_experiment

SMALL = ["scheme=dp-pasgd", "rounds=3", "local_steps=2", "train_samples=3000",
         "eval_samples=200", "batch_size=64", "devices=3"]


def test_dp_pasgd_needs_per_step_noise() -> None:
    with pytest.raises(ConfigError, match="dp-pasgd"):
        load_experiment(None, ["scheme=dp-pasgd", "privacy.noise=upload", "local_steps=1"])


def test_dp_pasgd_run_reports_the_papers_accounting_next_to_the_testbeds(
    tmp_path: Path,
) -> None:
    cfg = load_experiment(None, SMALL)
    summary = run_experiment(cfg, tmp_path / "run")
    assert summary["status"] == "completed"
    for dev in summary["privacy"]["devices"]:
        peer = dev["epsilon_peer_paper"]
        assert peer["local_steps"] == dev["uploads"] * 2 == 6
        sigma = dev["noise_multiplier"] * dev["example_clip"] / 64
        assert peer["epsilon"] == pytest.approx(paper_epsilon(6, 1.0, 64.0, sigma, 1e-5))
        # the testbed's enforced figure (PLD, Poisson sampling) is within the target; the
        # paper's zCDP without amplification is far looser for the same noise
        assert dev["epsilon"] <= cfg.privacy.epsilon < peer["epsilon"]


def test_plan_scheme_dp_pasgd_is_followed_by_run(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    scn = tmp_path / "scn.yaml"
    scn.write_text("peers:\n  dp-pasgd: {budget: 2000.0, smoothness: 0.25, strong_convexity: "
                   "0.05, grad_variance: 1.0, initial_gap: 100.0}\n")
    plan = tmp_path / "plan.yaml"
    sets = ["--set", "train_samples=3000", "--set", "eval_samples=200", "--set",
            "batch_size=64", "--set", "devices=3"]
    code = main(["plan", "--scheme", "dp-pasgd", "--scenario", str(scn), "--out", str(plan),
                 "--json", *sets])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    p = out["plan"]
    assert p["cost"] <= 2000 and p["K"] % p["tau"] == 0
    assert p["eps_zcdp"] <= 5.0 + 1e-9
    code = main(["run", "--plan", str(plan), "--out", str(tmp_path / "run"), "--no-progress",
                 "--json", *sets])
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["scheme"] == "dp-pasgd"
    assert summary["rounds_completed"] == p["K"] // p["tau"]
    dev = summary["privacy"]["devices"][0]
    # the run follows the plan's noise: the paper's own epsilon is the plan's
    assert dev["epsilon_peer_paper"]["epsilon"] == pytest.approx(p["eps_zcdp"], rel=1e-6)
    cfg = json.loads(json.dumps(out["run_overrides"]))
    assert cfg["local_steps"] == p["tau"]


def test_plan_scheme_dp_pasgd_without_constants_names_the_keys(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["plan", "--scheme", "dp-pasgd"]) == 2
    assert "peers: dp-pasgd" in capsys.readouterr().err

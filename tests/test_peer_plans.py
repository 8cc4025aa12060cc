"""`testbed plan --scheme fedsgd-dpc|zcdp-secagg --json`, followed by `testbed run --plan`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testbed.cli.main import main

SETS = ["--set", "train_samples=6000", "--set", "eval_samples=200", "--set", "batch_size=128",
        "--set", "devices=6"]
SCENARIO = (
    "peers:\n"
    "  zcdp-secagg: {r: 3, tau: 2, T: 2}\n"
    "  fedsgd-dpc: {T: 2, smoothness: 1.0, strong_convexity: 0.1, grad_bound: 1.0,\n"
    "               non_iid: 0.1, initial_gap: 2.3}\n"
)


@pytest.mark.parametrize("scheme", ["fedsgd-dpc", "zcdp-secagg"])
def test_peer_plan_is_followed_by_run(scheme: str, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    scn = tmp_path / "scn.yaml"
    scn.write_text(SCENARIO)
    plan = tmp_path / "plan.yaml"
    assert main(["plan", "--scheme", scheme, "--scenario", str(scn), "--out", str(plan),
                 "--json", *SETS]) == 0
    out = json.loads(capsys.readouterr().out)
    over = out["run_overrides"]
    assert over["scheme"] == scheme and over["rounds"] == 2
    assert over["privacy.noise_multiplier"] > 0
    assert main(["run", "--plan", str(plan), "--out", str(tmp_path / "run"), "--no-progress",
                 "--json", *SETS]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["scheme"] == scheme and summary["rounds_completed"] == 2
    dev = summary["privacy"]["devices"][0]
    assert dev["noise_multiplier"] == pytest.approx(over["privacy.noise_multiplier"])
    assert dev["epsilon"] <= 5.0


def test_peer_plan_without_scenario_names_the_keys(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--scheme", "zcdp-secagg"]) == 2
    err = capsys.readouterr().err
    assert "peers: zcdp-secagg" in err and "tau" in err


def test_a_plan_relying_on_the_secagg_credit_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scn = tmp_path / "scn.yaml"
    scn.write_text("peers:\n  zcdp-secagg: {r: 3, tau: 2, T: 2, credit: true}\n")
    plan = tmp_path / "plan.yaml"
    assert main(["plan", "--scheme", "zcdp-secagg", "--scenario", str(scn), "--out",
                 str(plan), *SETS]) == 3
    assert "credit" in capsys.readouterr().err and not plan.exists()

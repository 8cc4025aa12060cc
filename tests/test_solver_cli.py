"""`testbed plan`: JSON output, plan file round trip, errors, and a run that consumes the plan."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from testbed.cli.main import main
from testbed.core.config.errors import ConfigError
from testbed.core.config.plan_file import load_plan, save_plan

LOGREG_D = 28 * 28 * 10 + 10
DP_CLIP = [
    "clip.mode=coordinate", "clip.bound=5", "privacy.unit=device", "privacy.accounting=paper"
]


def write_scenario(path: Path, **kw: object) -> Path:
    body = {"h": [1.0, 0.8, 1.2, 0.9], "e_comp_j": 0.001, "d": LOGREG_D,
            "beta1": 0.5, "beta2": 1e-6}
    body.update(kw)
    path.write_text(yaml.safe_dump({"solver": body}))
    return path


def plan_json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, dict]:
    rc = main(argv)
    return rc, json.loads(capsys.readouterr().out)


def test_plan_json_has_the_documented_keys(
    tmp_path: Path, tiny_overrides: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    sets = [a for o in [*tiny_overrides, *DP_CLIP] for a in ("--set", o)]
    scn = write_scenario(tmp_path / "scn.yaml")
    rc, out = plan_json(capsys, ["plan", *sets, "--set", "privacy.epsilon=5",
                                 "--scenario", str(scn), "--json",
                                 "--out", str(tmp_path / "plan.yaml")])
    assert rc == 0
    assert {"T", "l", "Q", "energy_j", "devices", "peers"} <= set(out)
    assert len(out["devices"]) == 4
    for dev in out["devices"]:
        assert {"alpha", "sigma", "power_w", "epsilon", "epsilon_strict"} <= set(dev)
        assert dev["epsilon"] <= 5.0 * (1 + 1e-9)
        assert dev["power_w"] <= 0.1 * (1 + 1e-9)
    assert set(out["peers"]) == {"ldp-fedavg", "s-dp-fl", "channel-dp"}
    for peer in out["peers"].values():
        assert peer["feasible"] is False or {"T", "energy_j", "devices"} <= set(peer)
    plan = load_plan(tmp_path / "plan.yaml")
    assert plan.T == out["T"] and plan.l == out["l"] and plan.Q == out["Q"]
    assert plan.energy_j == pytest.approx(out["energy_j"])


def test_plan_file_round_trip_and_validation(
    tmp_path: Path, tiny_overrides: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    sets = [a for o in [*tiny_overrides, *DP_CLIP] for a in ("--set", o)]
    scn = write_scenario(tmp_path / "scn.yaml")
    assert main(["plan", *sets, "--scenario", str(scn), "--no-peers",
                 "--out", str(tmp_path / "p.yaml")]) == 0
    capsys.readouterr()
    plan = load_plan(tmp_path / "p.yaml")
    again = load_plan(save_plan(plan, tmp_path / "q.yaml"))
    assert again == plan
    data = yaml.safe_load((tmp_path / "p.yaml").read_text())
    for mutate, word in [
        (lambda d: d.update(T=d["T"] + 1), "T"),
        (lambda d: d.update(bogus=1), "bogus"),
        (lambda d: d["devices"][0].update(alpha=-1.0), "alpha"),
        (lambda d: d.update(format="other"), "format"),
        (lambda d: d.update(l=d["d"] + 1), "l"),
    ]:
        bad = json.loads(json.dumps(data))
        mutate(bad)
        (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad))
        with pytest.raises(ConfigError, match=word):
            load_plan(tmp_path / "bad.yaml")


def test_infeasible_plan_exits_nonzero_with_the_nearest_epsilon(
    tmp_path: Path, tiny_overrides: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    sets = [a for o in [*tiny_overrides, *DP_CLIP] for a in ("--set", o)]
    scn = write_scenario(tmp_path / "scn.yaml", beta2=3e-4)
    rc = main(["plan", *sets, "--set", "privacy.epsilon=0.01", "--scheme", "ldp-fedavg",
               "--no-peers", "--scenario", str(scn), "--json"])
    captured = capsys.readouterr()
    assert rc == 3
    out = json.loads(captured.out)
    assert out["feasible"] is False and "epsilon" in out["nearest"]
    assert "infeasible" in captured.err and "epsilon" in captured.err


def test_bad_scenario_key_is_a_config_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scn = tmp_path / "scn.yaml"
    scn.write_text(yaml.safe_dump({"solver": {"beta3": 1.0}}))
    assert main(["plan", "--set", "privacy.unit=device", "--set", "privacy.accounting=paper",
                 "--scenario", str(scn)]) == 2
    assert "beta3" in capsys.readouterr().err


def test_runner_consumes_the_plan(
    tmp_path: Path, tiny_overrides: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """`testbed run` with scheme ee-dp-fl and plan: PATH uses the plan's l, Q, alpha, sigma."""
    runner = pytest.importorskip("testbed.runner")
    from testbed.core.config.loader import load_experiment

    sets = [a for o in [*tiny_overrides, *DP_CLIP] for a in ("--set", o)]
    scn = write_scenario(tmp_path / "scn.yaml", h=1.0, beta1=0.3, beta2=1e-7, q_max=64)
    assert main(["plan", *sets, "--set", "privacy.epsilon=50", "--scenario", str(scn),
                 "--no-peers",
                 "--out", str(tmp_path / "plan.yaml")]) == 0
    capsys.readouterr()
    plan = load_plan(tmp_path / "plan.yaml")
    if plan.K > 40:
        pytest.skip(f"plan needs {plan.K} rounds; too long for a unit test")
    cfg = load_experiment(None, [*tiny_overrides, *DP_CLIP, "scheme=ee-dp-fl",
                                 f"plan={tmp_path / 'plan.yaml'}", f"rounds={plan.K}",
                                 "privacy.epsilon=50", "privacy.accounting=paper"])
    summary = runner.run_experiment(cfg, tmp_path / "run")
    assert summary["status"] == "completed" and summary["rounds_completed"] == plan.K
    for dev, planned in zip(summary["privacy"]["devices"], plan.devices, strict=True):
        assert dev["alpha"] == pytest.approx(planned.alpha)
        assert dev["sigma"] == pytest.approx(planned.sigma)
        assert dev["l"] == plan.l and dev["levels"] == plan.Q
        assert dev["epsilon_paper"] <= 50 * (1 + 1e-6)


def test_scenario_from_config_units(tmp_path: Path) -> None:
    """N0 per real coordinate = 10^(-snr/10) / 2; t_cm = 1/symbol rate; betas from a file."""
    from aggregator.solver.from_config import read_scenario_file, scenario_from_config
    from testbed.core.config.loader import load_experiment, load_hardware

    cfg = load_experiment(None, ["devices=3", "snr_db=[10, 20, 30]", *DP_CLIP,
                                 "privacy.trusted_channel_noise=0.5"])
    hw = load_hardware(cfg.hw_config)
    scn, notes = scenario_from_config(cfg, hw, read_scenario_file(None),
                                      count_params=lambda _c: 1234)
    assert scn.n0 == pytest.approx((0.05, 0.005, 0.0005))
    assert scn.h == (1.0, 1.0, 1.0) and scn.d == 1234 and scn.trusted == 0.5
    assert scn.t_cm_s == pytest.approx(1 / hw.symbol_rate_hz)
    assert scn.tx_power_ref_w == hw.tx_power_ref_w
    assert any("uncalibrated" in n for n in notes)
    (tmp_path / "cal.yaml").write_text(yaml.safe_dump({"beta1": 7.0, "beta2": 2e-6}))
    scn_file = tmp_path / "scn.yaml"
    scn_file.write_text(yaml.safe_dump({"solver": {"calibration": "cal.yaml", "d": 99}}))
    scn2, notes2 = scenario_from_config(cfg, hw, read_scenario_file(scn_file))
    assert (scn2.beta1, scn2.beta2, scn2.d) == (7.0, 2e-6, 99)
    with pytest.raises(ConfigError, match="clip.mode"):
        scenario_from_config(load_experiment(None, ["clip.mode=norm"]), hw,
                             read_scenario_file(scn_file))

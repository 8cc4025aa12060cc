"""`testbed run` consumes a plan file from `testbed plan` (scheme ee-dp-fl)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from testbed.cli.main import main
from testbed.core.config.errors import ConfigError
from testbed.core.config.loader import load_experiment
from testbed.runner import run_experiment


def _plan(tmp_path: Path, overrides: list[str]) -> Path:
    out = tmp_path / "plan.yaml"
    args = ["plan", "--no-peers", "--out", str(out)]
    for o in overrides:
        args += ["--set", o]
    assert main(args) == 0
    return out


def test_run_follows_the_plan_and_refuses_mismatches(
    tmp_path: Path, tiny_overrides: list[str]
) -> None:
    base = [
        *tiny_overrides,
        "scheme=ee-dp-fl",
        "privacy.unit=device",
        "clip.mode=coordinate",
        "privacy.epsilon=5",
        "privacy.accounting=paper",
    ]
    plan_path = _plan(tmp_path, base)
    plan = yaml.safe_load(plan_path.read_text())
    with pytest.raises(ConfigError, match="rounds"):
        cfg = load_experiment(None, [*base, f"plan={plan_path}", f"rounds={plan['K'] + 1}"])
        run_experiment(cfg, tmp_path / "bad")
    # Follow the plan for at most 3 rounds: rounds must match, so cut the plan's K instead
    # (fewer uploads than planned only lowers epsilon).
    k = min(plan["K"], 3)
    plan["K"], plan["T"] = k, k * plan["H"]
    short = tmp_path / "short.yaml"
    short.write_text(yaml.safe_dump(plan))
    cfg = load_experiment(None, [*base, f"plan={short}", f"rounds={k}"])
    summary = run_experiment(cfg, tmp_path / "run")
    assert summary["status"] in ("completed", "diverged")
    for dev, planned in zip(summary["privacy"]["devices"], plan["devices"], strict=True):
        assert dev["alpha"] == pytest.approx(planned["alpha"])
        assert dev["sigma"] == pytest.approx(planned["sigma"])
        assert dev["l"] == plan["l"] and dev["levels"] == plan["Q"]
        assert dev["epsilon_paper"] <= 5.0 + 1e-9

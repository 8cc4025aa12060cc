"""``stop_at_loss``: a run ends, completed, after the round whose smoothed loss reaches it.

The smoothed loss is the one definition of :func:`aggregator.solver.calibration.
uploads_to_target` (trailing mean over ``loss_target_window`` rounds), shared with the
summary's ``loss_targets`` and ``testbed calibrate``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aggregator.solver.calibration import smoothed_losses, uploads_to_target
from testbed.core.config.errors import ConfigError
from testbed.core.config.loader import load_experiment
from testbed.runner import resume_experiment, run_experiment


def _losses(run: Path) -> list[float]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [json.loads(x)["train_loss"] for x in lines]


def test_stop_at_loss_ends_after_the_round_of_the_loss_targets_definition(
    tmp_path: Path, tiny_overrides: list[str]
) -> None:
    # A full run gives the curve; the target is its smoothed loss at round 2 (0-based), so
    # the stopped run must end exactly where its summary's loss_targets says it got there.
    base = [*tiny_overrides, "rounds=6", "loss_target_window=2"]
    full = run_experiment(load_experiment(None, base), tmp_path / "full")
    assert full["status"] == "completed" and full["rounds_completed"] == 6
    curve = _losses(tmp_path / "full")
    target = float(smoothed_losses(curve, 2)[2])
    hit = uploads_to_target(curve, target, 2)
    assert hit is not None and hit <= 3

    stopped = run_experiment(
        load_experiment(None, [*base, f"stop_at_loss={target!r}", f"loss_targets=[{target!r}]"]),
        tmp_path / "stopped",
    )
    assert stopped["status"] == "completed" and stopped["exit_code"] == 0
    assert stopped["rounds_completed"] == hit < 6  # the reaching round is kept, none after
    assert stopped["reason"].startswith(f"target loss reached at round {hit - 1}")
    assert stopped["loss_targets"] == [
        {"target": target, "window": 2, "round": hit - 1,
         "energy_j": stopped["loss_targets"][0]["energy_j"]}
    ]
    assert _losses(tmp_path / "stopped") == pytest.approx(curve[:hit])  # same seeded rounds


def test_a_resumed_run_that_had_reached_the_target_just_completes(
    tmp_path: Path, tiny_overrides: list[str]
) -> None:
    run = tmp_path / "run"
    cfg = load_experiment(None, [*tiny_overrides, "rounds=5", "stop_at_loss=100.0"])
    first = run_experiment(cfg, run)
    assert first["status"] == "completed" and first["rounds_completed"] == 1
    # As if the process died after committing the reaching round, before the summary.
    (run / "summary.json").unlink()
    again = resume_experiment(run)
    assert again["status"] == "completed" and again["exit_code"] == 0
    assert again["rounds_completed"] == 1 and len(_losses(run)) == 1
    assert again["reason"].startswith("target loss reached at round 0")


@pytest.mark.parametrize(
    ("override", "fragment"),
    [("stop_at_loss=0", "stop_at_loss"), ("loss_target_window=0", "loss_target_window")],
)
def test_bad_stop_keys_are_refused(override: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        load_experiment(None, [override])

"""delta >= 1/n is refused before the first round unless ``privacy.allow_large_delta``.

``n`` is the protected data set's size: the smallest device's records at the record unit, the
device population at the device unit (docs/privacy.md, "delta and the data set's size").
"""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.core.config.errors import ConfigError
from testbed.core.config.loader import load_experiment
from testbed.core.record_schemes import check_delta_bound
from testbed.runner import run_experiment

LAPLACE = ["scheme=fedsgd-dpc", "local_steps=1", "privacy.noise=per-step",
           "privacy.noise_distribution=laplace", "train_samples=600", "eval_samples=100",
           "devices=2", "rounds=1", "eval_every=100"]


def test_record_unit_refuses_delta_at_or_above_one_over_min_d() -> None:
    cfg = load_experiment(None, [*LAPLACE, "privacy.delta=0.01"])
    with pytest.raises(ConfigError) as info:
        check_delta_bound(cfg, [1195, 2000])
    msg = str(info.value)
    for part in ("privacy.delta", "0.01", "1195", "min D_i", "< 1/n = 0.0008368",
                 "allow_large_delta"):
        assert part in msg
    # exactly 1/n is refused too; just below passes
    with pytest.raises(ConfigError):
        check_delta_bound(load_experiment(None, [*LAPLACE, "privacy.delta=0.001"]), [1000])
    assert check_delta_bound(load_experiment(None, [*LAPLACE, "privacy.delta=0.00099"]),
                             [1000]) == {}
    # the default delta, the sizes the shipped configs give
    assert check_delta_bound(load_experiment(None, LAPLACE), [6000] * 10) == {}


def test_device_unit_counts_devices() -> None:
    base = ["scheme=ldp-fedavg", "privacy.unit=device", "devices=10"]
    cfg = load_experiment(None, [*base, "privacy.delta=0.1"])
    with pytest.raises(ConfigError, match=r"privacy.delta.*n = 10 devices"):
        check_delta_bound(cfg, [3] * 10)  # tiny shards do not matter at the device unit
    assert check_delta_bound(load_experiment(None, [*base, "privacy.delta=0.05"]), [3] * 10) == {}


def test_no_check_without_privacy() -> None:
    cfg = load_experiment(None, ["scheme=fedavg", "privacy.delta=0.5"])
    assert check_delta_bound(cfg, [10, 10]) == {}


def test_flag_must_be_a_bool() -> None:
    with pytest.raises(ConfigError, match="allow_large_delta"):
        load_experiment(None, ["privacy.allow_large_delta=3"])


def test_allowed_large_delta_is_repeated_in_the_note() -> None:
    cfg = load_experiment(None, [*LAPLACE, "privacy.delta=0.01", "privacy.allow_large_delta=true"])
    out = check_delta_bound(cfg, [1195, 2000])
    assert out["delta_exceeds_1_over_D"] is True
    assert out["delta_bound_n"] == 1195 and out["delta_bound_unit"] == "record"
    assert "0.01" in out["delta_note"] and "1195" in out["delta_note"]


def test_run_refuses_before_any_work(tmp_path: Path) -> None:
    """A few hundred records per device: delta 0.01 >= 1/min D_i, refused before the first
    round; the run leaves no directory."""
    cfg = load_experiment(None, [*LAPLACE, "privacy.delta=0.01"])
    with pytest.raises(ConfigError, match=r"privacy.delta.*n = \d+ records on the smallest"):
        run_experiment(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_run_with_the_flag_says_so_in_the_summary(tmp_path: Path) -> None:
    cfg = load_experiment(None, [*LAPLACE, "privacy.delta=0.01", "privacy.allow_large_delta=true"])
    summary = run_experiment(cfg, tmp_path / "run")
    assert summary["status"] == "completed"
    privacy = summary["privacy"]
    assert privacy["delta_exceeds_1_over_D"] is True
    assert privacy["delta_bound_n"] == min(d["dataset_size"] for d in privacy["devices"])
    assert "promise little" in privacy["delta_note"]
    # a run within the bound carries none of it
    ok = run_experiment(load_experiment(None, LAPLACE), tmp_path / "ok")
    assert "delta_exceeds_1_over_D" not in ok["privacy"]

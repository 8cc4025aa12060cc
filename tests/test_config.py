"""Config parsing: every bad key, type or value is refused with a message naming it."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from testbed.core.config.errors import ConfigError
from testbed.core.config.experiment import ExperimentConfig
from testbed.core.config.loader import (
    apply_overrides,
    load_experiment,
    load_hardware,
    resolve_hw_config_path,
)

REQUIRED_KEYS = (
    "rounds",
    "devices",
    "local_steps",
    "batch_size",
    "lr",
    "dataset",
    "data_dir",
    "partition",
    "model",
    "scheme",
    "link",
    "snr_db",
    "fading",
    "seed",
)


def test_default_has_required_keys_and_matches_the_issue() -> None:
    cfg = load_experiment()
    dumped = cfg.model_dump()
    for key in REQUIRED_KEYS:
        assert key in dumped
    assert (cfg.devices, cfg.local_steps, cfg.snr_db, cfg.partition) == (10, 20, 20.0, "noniid")
    assert (cfg.dataset, cfg.model, cfg.scheme, cfg.fading) == (
        "fashion-mnist",
        "mnist-cnn",
        "fedavg",
        "none",
    )


@pytest.mark.parametrize(
    ("override", "fragments"),
    [
        ("rounds=-3", ["rounds", "-3", "greater than or equal to 1"]),
        ("rounds=abc", ["rounds", "'abc'", "integer"]),
        ("lr=0", ["lr", "0", "greater than 0"]),
        ("dataset=imagenet", ["dataset", "'imagenet'", "fashion-mnist"]),
        ("scheme=magic", ["scheme", "'magic'", "ee-dp-fl"]),
        ("link=carrier-pigeon", ["link", "carrier-pigeon", "gnuradio"]),
        ("fading=nakagami", ["fading", "nakagami", "rayleigh"]),
        ("roundz=3", ["roundz", "unknown key"]),
        ("privacy.delta=2", ["privacy.delta", "2", "less than 1"]),
        ("privacy.trusted_channel_noise=1.5", ["trusted_channel_noise", "1.5"]),
        ("clip.bound=-1", ["clip.bound", "-1"]),
        ("snr_db=500", ["SNR 500", "[-50, 100]"]),
        ("snr_db=[10, 20]", ["snr_db", "one value per device", "10"]),
        ("privacy.nope=1", ["privacy.nope", "unknown key"]),
    ],
)
def test_bad_values_are_refused_naming_key_value_and_allowed(
    override: str, fragments: list[str]
) -> None:
    with pytest.raises(ConfigError) as info:
        load_experiment(None, [override])
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, (fragment, message)


def test_dp_scheme_refuses_unclipped_updates() -> None:
    with pytest.raises(ConfigError, match="clip.mode"):
        load_experiment(None, ["scheme=ee-dp-fl", "privacy.unit=device", "clip.mode=none"])


def test_overrides_are_typed_yaml_and_nested() -> None:
    cfg = load_experiment(None, ["rounds=7", "privacy.epsilon=1.8", "snr_db=15"])
    assert cfg.rounds == 7 and cfg.privacy.epsilon == 1.8 and cfg.snr_db == 15.0
    assert isinstance(cfg.rounds, int)


def test_override_syntax_errors() -> None:
    with pytest.raises(ConfigError, match="key=value"):
        apply_overrides({}, ["rounds"])
    with pytest.raises(ConfigError, match="not a section"):
        apply_overrides({"rounds": 3}, ["rounds.x=1"])


def test_config_file_is_merged_over_default(tmp_path: Path) -> None:
    path = tmp_path / "exp.yaml"
    path.write_text("rounds: 2\nprivacy:\n  epsilon: 1.8\n")
    cfg = load_experiment(path)
    assert cfg.rounds == 2 and cfg.privacy.epsilon == 1.8 and cfg.privacy.delta == 1e-5


def test_bad_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_experiment(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_experiment(bad)


def test_config_objects_are_frozen() -> None:
    cfg = load_experiment()
    with pytest.raises(ValidationError, match="frozen"):
        cfg.rounds = 5  # type: ignore[misc]
    assert isinstance(cfg, ExperimentConfig)


def test_hardware_config_by_name_and_errors(tmp_path: Path) -> None:
    hw = load_hardware("sim")
    assert hw.link == "symbol" and hw.symbol_rate_hz > 0
    with pytest.raises(ConfigError, match="hw_config"):
        resolve_hw_config_path("no-such-config")
    bad = tmp_path / "hw.yaml"
    bad.write_text("link: symbol\nsymbol_rate_hz: -5\n")
    with pytest.raises(ConfigError, match="symbol_rate_hz"):
        load_hardware(str(bad))

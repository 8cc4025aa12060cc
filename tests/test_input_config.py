"""Config values: strict types, finite bounded numbers, safe run names, hardware lookup.

Each case was silently accepted (or failed with a traceback) before the input hardening;
each refusal must name the key, the value and what is allowed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.core.config.errors import ConfigError
from testbed.core.config.loader import HW_CONFIG_DIR, HW_CONFIG_ENV, load_experiment, load_hardware

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("override", "fragments"),
    [
        ("rounds=true", ["config key 'rounds'", "True", "valid integer"]),
        ('rounds="5"', ["config key 'rounds'", "'5'", "without quotes"]),
        ("lr=true", ["config key 'lr'", "True", "valid number"]),
        ("privacy.epsilon='5'", ["privacy.epsilon", "'5'", "valid number"]),
        ("noiseless=1", ["config key 'noiseless'", "1", "valid boolean"]),
        ("name=123", ["config key 'name'", "123", "valid string"]),
        ("snr_db=[10, true]", ["config key 'snr_db'", "True is not a number"]),
    ],
)
def test_wrong_kinds_are_refused(override: str, fragments: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        load_experiment(None, [override])
    for fragment in fragments:
        assert fragment in str(info.value), (fragment, str(info.value))


def test_rounds_true_in_a_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "exp.yaml"
    path.write_text("rounds: true\n")
    with pytest.raises(ConfigError, match="config key 'rounds': got True"):
        load_experiment(path)


def test_integers_are_fine_for_float_keys() -> None:
    cfg = load_experiment(None, ["privacy.epsilon=5", "clip.bound=3", "snr_db=15"])
    assert cfg.privacy.epsilon == 5.0 and isinstance(cfg.privacy.epsilon, float)
    assert cfg.clip.bound == 3.0 and cfg.snr_db == 15.0


@pytest.mark.parametrize(
    ("override", "key", "allowed"),
    [
        ("energy.e_comp_j=.inf", "energy.e_comp_j", "finite"),
        ("privacy.sigma=.inf", "privacy.sigma", "finite"),
        ("privacy.epsilon=.nan", "privacy.epsilon", "finite"),
        ("power.alpha=.inf", "power.alpha", "finite"),
        ("clip.bound=1e308", "clip.bound", "less than or equal to 1000000"),
        ("energy.e_comp_j=1e7", "energy.e_comp_j", "less than or equal to 1000000"),
        ("power.p_max_w=101", "power.p_max_w", "less than or equal to 100"),
        ("privacy.sigma=1e7", "privacy.sigma", "less than or equal to 1000000"),
        ("local_steps=10000000000", "local_steps", "less than or equal to 1000000"),
        ("snr_db=[.nan]", "snr_db", "outside the allowed range"),
    ],
)
def test_non_finite_and_overflowing_numbers_are_refused(
    override: str, key: str, allowed: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_experiment(None, [override])
    message = str(info.value)
    assert f"config key '{key}'" in message and allowed in message, message


@pytest.mark.parametrize(
    "name", ["../escaped", "a/b", ".hidden", "", "x y", "runs\\x", "é", "a" * 101, "/abs"]
)
def test_run_name_must_be_a_plain_file_name(name: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_experiment(None, [f"name='{name}'"])
    message = str(info.value)
    assert "config key 'name'" in message and "plain file name" in message, message


@pytest.mark.parametrize("name", ["run-1.2_x", "A" * 100, "2024-01-01", "_x", "x."])
def test_plain_run_names_are_accepted(name: str) -> None:
    assert load_experiment(None, [f"name='{name}'"]).name == name


# -- hardware configs --------------------------------------------------------------------


def test_hw_set_reaches_the_doppler_speed() -> None:
    hw = load_hardware("sim", ["waveform.speed_kmh=20", "fading=rayleigh"])
    assert hw.waveform.speed_kmh == 20.0 and hw.fading == "rayleigh"
    assert load_hardware("sim").waveform.speed_kmh == 0.0


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ("waveform.speed_kmh", "--hw-set 'waveform.speed_kmh': expected key=value"),
        ("link.x=1", "--hw-set 'link.x=1': 'link' is a value"),
        ("seed=&a 1", "--hw-set 'seed=&a 1' value is not valid YAML"),
        ("waveform.speed_kmh=-1", "hardware config key 'waveform.speed_kmh': got -1"),
        ("symbol_rate_hz=true", "hardware config key 'symbol_rate_hz': got True"),
        ("symbol_rate_hz=.inf", "hardware config key 'symbol_rate_hz': got inf"),
        ("tx_power_ref_w=1e300", "hardware config key 'tx_power_ref_w'"),
        ("snr_sweep_db=[0, .nan]", "hardware config key 'snr_sweep_db[1]': got nan"),
        ("gnuradio.noise_seed='3'", "hardware config key 'gnuradio.noise_seed'"),
        ("usrp.tx_args=5", "hardware config key 'usrp.tx_args'"),
    ],
)
def test_hardware_override_errors_name_hw_set_and_the_key(override: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_hardware("sim", [override])
    assert fragment in str(info.value), str(info.value)


def test_hardware_name_wins_over_a_same_named_folder_in_the_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "sim").mkdir()
    (tmp_path / "lab_ota").mkdir()
    monkeypatch.chdir(tmp_path)
    assert load_hardware("sim").name == "sim"
    assert load_experiment(None, ["hw_config=lab_ota"]).hw_config == "lab_ota"
    assert load_hardware("lab_ota").link == "usrp"


def test_missing_hardware_path_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="hardware config file '.*nope/hw.yaml' does not exist"):
        load_hardware(str(tmp_path / "nope" / "hw.yaml"))
    with pytest.raises(ConfigError, match=r"hw_config.*'nope'.*allowed: a YAML path or one of"):
        load_hardware("nope")


def test_missing_hardware_folder_says_where_it_looked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(HW_CONFIG_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(ConfigError, match=f"looked in '{tmp_path / 'nowhere'}'"):
        load_hardware("sim")
    (tmp_path / "hw").mkdir()
    (tmp_path / "hw" / "mine.yaml").write_text("name: mine\nlink: waveform\n")
    monkeypatch.setenv(HW_CONFIG_ENV, str(tmp_path / "hw"))
    assert load_hardware("mine").link == "waveform"


def test_installed_package_finds_hw_configs_from_any_cwd(tmp_path: Path) -> None:
    assert HW_CONFIG_DIR.is_absolute() and (HW_CONFIG_DIR / "sim.yaml").is_file()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", HW_CONFIG_ENV)}
    code = (
        "from testbed.core.config.loader import load_hardware, load_experiment; "
        "print(load_hardware('darkroom').waveform.speed_kmh, "
        "load_hardware(load_experiment(None, ['hw_config=lab_ota']).hw_config).name)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=120, check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["20.0", "lab_ota"]


def test_shipped_configs_still_load() -> None:
    for name in ("sim", "lab_ota", "darkroom"):
        assert load_hardware(name).center_freq_hz == 915e6
    assert (REPO / "testbed" / "config" / "default.yaml").is_file()
    load_experiment()
